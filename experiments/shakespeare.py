"""Small GPTs on Shakespeare that train on a 2-core CPU in minutes.

  python -m launch.train --config=experiments/shakespeare.py:char --workdir=workdirs/char
  python -m launch.train --config=experiments/shakespeare.py:bpe  --workdir=workdirs/bpe
  python -m launch.train --config=experiments/shakespeare.py:tiny --workdir=/tmp/tiny   # seconds
"""

from experiments import base

PRESETS = ("char", "bpe", "tiny")


def get_config(preset: str = "char"):
  c = base.base_config()
  c.data.dataset = "shakespeare"
  # Sized for ~5 minutes on a 2-core CPU (nanoGPT's CPU recipe for shakespeare_char is similar).
  if preset == "char":
    c.data.tokenizer = "char"
    c.model = base.model_fields("cpu-small", d_model=128, context_length=128)
    c.seq_len = 128
    c.batch_size = 32
    c.num_train_steps = 1200
    c.eval_every_steps = 300
    c.checkpoint_every_steps = 300
    c.optimizer.lr = 2e-3
  elif preset == "bpe":
    c.data.tokenizer = "bpe"
    c.data.vocab_size = 4096
    c.model = base.model_fields("cpu-small", d_model=128, context_length=128)
    c.seq_len = 128
    c.batch_size = 32
    c.num_train_steps = 850
    c.eval_every_steps = 425
    c.checkpoint_every_steps = 425
    c.optimizer.lr = 2e-3
  elif preset == "tiny":  # for tests and smoke runs
    c.data.tokenizer = "char"
    c.model = base.model_fields("cpu-tiny")
    c.seq_len = 64
    c.batch_size = 8
    c.eval_batch_size = 8
    c.eval_batches = 2
    c.num_train_steps = 40
    c.log_every_steps = 5
    c.eval_every_steps = 20
    c.checkpoint_every_steps = 20
    c.optimizer.warmup_steps = 5
    c.sample.max_new_tokens = 40
  else:
    raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
  return c
