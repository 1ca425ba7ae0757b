"""Induction heads at CPU scale (Olsson et al. 2022, "In-context Learning and Induction Heads"):
attention-only GPTs of two layers and of one, on Shakespeare with spans that only copying predicts
(the named data set "shakespeare_spans": after every 8th line, 5 to 30 random common words written
twice), in windows of 256 BPE tokens (a BPE of 2,048 pieces trained on that text), with rotary
positions. Every evaluation scores each head as a previous-token, duplicate-token and induction head
and records the in-context score (config.head_scores; metrics.jsonl, TensorBoard, heads.png).

Why this data and these positions (the study: experiments/README.md, "Induction heads"): on
Shakespeare's characters alone, copying barely pays (a letter recurs everywhere, so matching the
previous one says little), and no induction head forms in 3,000 steps; with random word spans under
learned absolute positions, none forms either, as a previous-token head must be learned position by
position; with rotary positions the previous-token head comes early and the induction head follows.

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
  c.data.dataset = "shakespeare_spans"
  c.data.tokenizer = "bpe"
  c.data.vocab_size = 2048
  c.model = base.model_fields("cpu-small", d_model=128, max_len=256, attention_only=True, positions="rope")
  c.model.num_layers = 2 if preset == "two_layers" else 1
  c.seq_len = 256
  c.batch_size = 32
  c.num_train_steps = 3000
  c.eval_every_steps = c.checkpoint_every_steps = 150
  c.eval_batches = 4
  c.optimizer.lr = 2e-3
  c.head_scores = True
  return c
