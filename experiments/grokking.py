"""Grokking modular addition (Power et al. 2022), with the progress measures of Nanda, Chan, Lieberum,
Smith & Steinhardt (ICLR 2023): config.task="modular" (transformer/tasks/modular.py), the analysis in
transformer/interp/fourier.py. The study and its phase table: experiments/README.md, "Grokking".

  python -m launch.train --config=experiments/grokking.py:paper --workdir=workdirs/grokking-113
  python -m launch.train --config=experiments/grokking.py:paper --config.seed=1 --config.split_seed=1 \
      --config.num_train_steps=10000 --workdir=workdirs/grokking-113-seed1
  python -m launch.train --config=experiments/grokking.py:paper --config.p=97 --config.train_fraction=0.35 \
      --config.num_train_steps=8000 --workdir=workdirs/grokking-97-35

Their recipe: p = 113, "a b =" (vocabulary p + 1; here also the word tokenizer's two specials, whose
logits are not read), the loss at "=" only, 30% of the p² pairs for training; one layer, d_model 128,
4 heads of 32, a ReLU MLP of 512, no LayerNorm (block.norm="none"), untied embedding and unembedding,
learned positions; AdamW at 1e-3 with weight decay 1.0 on every parameter (decay_embeddings and
decay_norms_and_biases: torch's AdamW decays all it is given), β = (0.9, 0.98), a 10-step linear
warm-up, full batch. Where this differs: biases in attention too (block.use_bias), and the kernels
Glorot-initialised (block.kernel_init="xavier": about 1/√d_model as theirs; the embeddings normal
0.02). GPT-2's kernels (normal 0.02) learn far slower here: at the tiny preset's size, 100% training
accuracy after 100 steps with Glorot's, 92% after 400 with GPT-2's.

The loss reads only "=", so the last block computes only that position (`answer_only`: GPT's
`last_only`, the same logits at half the cost); `steps_per_call` steps run as one compiled call;
evaluations (all p² pairs, the measures) come every `eval_every_steps`.
"""

from experiments import base
from transformer import tasks

PRESETS = ("paper", "tiny")


def get_config(preset: str = "paper"):
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
  c = tasks.defaults("modular")
  c.model = base.family_fields(
    "gpt",
    max_len=3,
    num_layers=1,
    tie_embeddings=False,
    d_model=128,
    num_heads=4,
    d_mlp=512,
    activation="relu",
    norm="none",
    attention="einsum",
    kernel_init="xavier",
  )
  c.optimizer.update(dict(lr=1e-3, b1=0.9, b2=0.98, weight_decay=1.0, warmup_steps=10, grad_clip_norm=0.0))
  c.optimizer.update(dict(decay_embeddings=True, decay_norms_and_biases=True))
  c.optimizer.schedule = "constant"
  c.p, c.operation, c.train_fraction = 113, "add", 0.3
  c.num_train_steps = 20_000
  c.steps_per_call = 100
  c.log_every_steps = c.eval_every_steps = 100
  c.checkpoint_every_steps = 1000
  if preset == "tiny":  # tests and smoke runs: memorises in 100 steps (and generalises by 300)
    c.p, c.train_fraction = 23, 0.8
    c.optimizer.lr = 3e-3
    c.model.block.d_model, c.model.block.d_mlp = 64, 256
    c.num_train_steps, c.steps_per_call = 200, 20
    c.log_every_steps = c.eval_every_steps = c.checkpoint_every_steps = 100
    c.num_key_frequencies = 3
  return c
