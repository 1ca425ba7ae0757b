"""GPT-2 124M-1.5B recipes (nanoGPT / llm.c): ~0.5M tokens per step through accumulation,
AdamW lr 6e-4 with 700 warmup steps and cosine decay to 10%, betas (0.9, 0.95), weight decay
0.1, clipping 1.0, bf16 compute with float32 master weights. For GPU/TPU meshes.

  python -m launch.train --config=experiments/gpt2.py:gpt2 --workdir=workdirs/gpt2 \\
      --config.mesh.fsdp=8 --config.mesh.data=-1
"""

from experiments import base

PRESETS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
# (micro-batch sequences per step before accumulation, lr) per size, as in nanoGPT / llm.c.
_RECIPES = {"gpt2": (64, 6e-4), "gpt2-medium": (32, 3e-4), "gpt2-large": (16, 2.5e-4), "gpt2-xl": (8, 2e-4)}
TOKENS_PER_STEP = 524_288  # 2**19 ~ 0.5M
MICROBATCH = {preset: micro for preset, (micro, _) in _RECIPES.items()}


def get_config(preset: str = "gpt2"):
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
  micro, lr = _RECIPES[preset]
  c = base.lm_config()
  c.data.tokenizer = "gpt2"
  c.model = base.model_fields(preset, dtype="bfloat16", vocab_size=50304, attention="xla")
  c.seq_len = 1024
  c.batch_size = TOKENS_PER_STEP // c.seq_len  # 512 sequences per optimizer step
  c.optimizer.accumulation_steps = c.batch_size // micro
  c.optimizer.lr = lr
  c.optimizer.warmup_steps = 700
  c.optimizer.weight_decay = 0.1
  c.num_train_steps = 19_073  # 10B tokens
  c.eval_every_steps = 250
  c.eval_batch_size = micro
  c.eval_batches = 20
  c.checkpoint_every_steps = 1000
  c.log_every_steps = 10
  return c
