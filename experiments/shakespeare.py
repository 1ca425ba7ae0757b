"""Small GPTs on Shakespeare that train on a 2-core CPU in minutes.

python -m launch.train --config=experiments/shakespeare.py:char --workdir=workdirs/char
    # the main job: today's recipe (rotary, RMSNorm, ReLU², QK-norm, untied head, Muon)
python -m launch.train --config=experiments/shakespeare.py:char_gpt2 --workdir=workdirs/char-gpt2
    # its starting point: GPT-2's architecture, AdamW, cosine (experiments/README.md: the speedrun)
python -m launch.train --config=experiments/shakespeare.py:bpe  --workdir=workdirs/bpe
python -m launch.train --config=experiments/shakespeare.py:tiny --workdir=/tmp/tiny   # seconds
python -m launch.train --config=experiments/shakespeare.py:char_dense --workdir=workdirs/char-dense
    # also char_random, char_fixed_random: Synthesizer attention instead of dot products
python -m launch.train --config=experiments/shakespeare.py:lstm --workdir=workdirs/char-lstm
    # the recurrent baseline: a 2-layer LSTM on the same characters, for the same ~5 minutes
"""

from experiments import base

# char with Synthesizer self-attention (Tay et al. 2020) instead of dot products: the README compares them.
SYNTHESIZERS = {
  "char_dense": "synthesizer_dense",
  "char_random": "synthesizer_random",
  "char_fixed_random": "synthesizer_fixed_random",
}
PRESETS = ("char", "char_gpt2", "bpe", "tiny", "lstm", *SYNTHESIZERS)
# The GPT presets' batch of 32 windows is computed in two microbatches of 16 (gradient accumulation:
# the same update, the summed gradients divided by the batch's tokens; the losses equal to float
# rounding: no dropout here). On a CPU the two halves run faster than the whole (experiments/README.md).
GPT_MICROBATCHES = 2
LSTM_STEPS = 1500  # as many as fit in ~5 minutes of training on 2 CPU cores (experiments/README.md)


def _five_cpu_minutes(c, num_train_steps: int, eval_every_steps: int) -> None:
  """A 4-layer, 128-wide GPT on 128-token windows: ~5 minutes on a 2-core CPU (nanoGPT's CPU
  recipe for shakespeare_char is similar)."""
  c.model = base.model_fields("cpu-small", d_model=128, max_len=128)
  c.seq_len = 128
  c.batch_size = 32
  c.num_train_steps = num_train_steps
  c.eval_every_steps = c.checkpoint_every_steps = eval_every_steps
  c.optimizer.lr = 2e-3
  c.optimizer.accumulation_steps = GPT_MICROBATCHES


def _todays_recipe(c) -> None:
  """The main job: the same width, depth, windows and batch with what modded-nanogpt's speedrun
  changed in GPT-2 (each step's measured gain: experiments/README.md). Rotary positions, RMSNorm,
  ReLU², QK-norm and an untied head; Muon for the blocks' matrices (AdamW for the rest), with the
  cosine schedule (warmup-stable-decay to zero, `optimizer.schedule=wsd`, was worse here on two
  seeds). Its steps are a little slower (Muon's orthogonalisation), so fewer fit in ~5 minutes."""
  _five_cpu_minutes(c, num_train_steps=820, eval_every_steps=205)
  c.model.positions = "rope"
  c.model.block.norm = "rms_norm"
  c.model.block.activation = "relu2"
  c.model.block.qk_norm = True
  c.model.tie_embeddings = False
  c.optimizer.name = "muon"
  c.optimizer.muon_lr = 0.05


def get_config(preset: str = "char"):
  c = base.lm_config()
  c.data.dataset = "shakespeare"
  if preset == "char":
    c.data.tokenizer = "char"
    _todays_recipe(c)
  elif preset == "char_gpt2" or preset in SYNTHESIZERS:  # the Synthesizer study was measured on GPT-2's
    c.data.tokenizer = "char"
    _five_cpu_minutes(c, num_train_steps=1200, eval_every_steps=300)
    c.model.block.attention_mechanism = SYNTHESIZERS.get(preset, "dot_product")
  elif preset == "bpe":  # ~3.4 characters a token: fewer, slower steps (the 4096-way head)
    c.data.tokenizer = "bpe"
    c.data.vocab_size = 4096
    _five_cpu_minutes(c, num_train_steps=850, eval_every_steps=425)
  elif preset == "lstm":  # char's data and batches, an LSTM instead of the GPT, the same wall-clock
    c.data.tokenizer = "char"
    _five_cpu_minutes(c, num_train_steps=LSTM_STEPS, eval_every_steps=LSTM_STEPS // 4)
    c.model = base.family_fields("lstm", num_layers=2, d_model=256, max_len=1024)
    c.optimizer.accumulation_steps = 1  # a recurrence over the time steps: its batch is its parallelism
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
