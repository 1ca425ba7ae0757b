"""Induction heads at CPU scale (Olsson et al. 2022, "In-context Learning and Induction Heads"):
attention-only GPTs of one and two layers on Shakespeare's characters, in windows of 256 characters,
long enough that names and words recur inside one (a speaker's name every few lines). Every
evaluation scores each head as a previous-token, duplicate-token and induction head and records the
in-context score (config.head_scores; metrics.jsonl, TensorBoard, heads.png). The study so far:
experiments/README.md, "Induction heads" (in 3,000 steps no induction head forms on this text, nor
with repeated random spans mixed in: the data on which they form here is still to be found).

  python -m launch.train --config=experiments/induction.py:two_layers --workdir=workdirs/induction-2
  python -m launch.train --config=experiments/induction.py:one_layer  --workdir=workdirs/induction-1
  python -m launch.probe --workdir=workdirs/induction-2 --heads --out=probes/induction-2
"""

from experiments import base

PRESETS = ("two_layers", "one_layer")


def get_config(preset: str = "two_layers"):
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
  c = base.lm_config()
  c.data.dataset = "shakespeare"
  c.data.tokenizer = "char"
  num_layers = 2 if preset == "two_layers" else 1
  c.model = base.model_fields("cpu-small", d_model=128, max_len=256, attention_only=True)
  c.model.num_layers = num_layers
  c.seq_len = 256
  c.batch_size = 32
  c.num_train_steps = 3000
  c.eval_every_steps = c.checkpoint_every_steps = 150
  c.eval_batches = 4
  c.optimizer.lr = 2e-3
  c.head_scores = True
  return c
