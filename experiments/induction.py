"""Induction heads at CPU scale (Olsson et al. 2022, "In-context Learning and Induction Heads"):
attention-only GPTs of two layers and of one, with rotary positions, on text where only copying
from the context predicts anything (the named data set "repeated_spans": lines of 5 to 50 random
symbols of 256, then the same symbols again), in windows of 128 characters. Every evaluation
scores each head as a previous-token, duplicate-token and induction head and records the in-context
score (config.head_scores; metrics.jsonl, TensorBoard, heads.png). About 2 minutes each on 2 cores.

Why this data and these positions (the study, with what did not work: experiments/README.md,
"Induction heads"): with rotary positions a head that reads the previous token is one offset for
every position (with learned absolute positions it must be learned position by position, and in
3,000 steps it is not); and the phase change needs text where copying is most of what there is to
learn: Shakespeare's characters, Shakespeare with random word spans (BPE), and Shakespeare with
these same symbol spans after every line all train 3,000 steps without one.

  python -m launch.train --config=experiments/induction.py:two_layers --workdir=workdirs/induction-2
  python -m launch.train --config=experiments/induction.py:one_layer  --workdir=workdirs/induction-1
  python -m launch.probe --workdir=workdirs/induction-2 --heads --ablate=L1.H0 --out=probes/induction-2
"""

from experiments import base

PRESETS = ("two_layers", "one_layer")


def get_config(preset: str = "two_layers"):
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
  c = base.lm_config()
  c.data.dataset = "repeated_spans"
  c.data.tokenizer = "char"
  c.model = base.model_fields("cpu-small", d_model=64, max_len=128, attention_only=True, positions="rope")
  c.model.num_layers = 2 if preset == "two_layers" else 1
  c.seq_len = 128
  c.batch_size = 32
  c.num_train_steps = 3000
  c.eval_every_steps = c.checkpoint_every_steps = 150
  c.eval_batches = 4
  c.optimizer.lr = 1e-3
  c.head_scores = True
  return c
