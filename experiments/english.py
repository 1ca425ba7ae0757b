"""A GPT pretrained on general English, the body that the sentiment and tagging presets `gpt_english`
fine-tune (experiments/README.md: "Pretraining that pays").

  python -m launch.train --config=experiments/english.py:gpt --workdir=workdirs/english-gpt   # ~15 min, 2 cores
  python -m launch.probe --workdir=workdirs/english-gpt --compare --word=Harry \
      --text="Harry Potter is a wizard." --text="Prince Harry married Meghan Markle."

The text (the named data set "english", transformer/data/sources.py): the Brown corpus's samples that
the tagging presets train on, as running text (the samples their split holds out for validation
and test are left out), Shakespeare's works, and the English sides of the Ding sentence pairs;
10.9 MB, ~3M BPE tokens. Not the sentiment snippets. A BPE of 8,192 tokens trained on it; the main
job's recipe (rotary positions, RMSNorm, ReLU², QK-norm, untied head, Muon) at its width and depth.
"""

import ml_collections

from experiments import shakespeare

PRESETS = ("gpt", "tiny")
VOCAB_SIZE = 8192


def get_config(preset: str = "gpt"):
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
  c = shakespeare.get_config("char")
  c.data.dataset = "english"
  c.data.tokenizer = "bpe"
  c.data.vocab_size = VOCAB_SIZE
  c.num_train_steps = 1000  # ~1.2 epochs, ~14 minutes on 2 cores (0.85 s a step: the 8,192-way head)
  c.eval_every_steps = c.checkpoint_every_steps = 250
  if preset == "tiny":  # the same model, a few steps on a smaller vocabulary: for tests and smoke runs
    c.data.vocab_size = 512
    c.batch_size, c.eval_batch_size, c.eval_batches = 8, 8, 2
    c.optimizer.accumulation_steps = 1
    c.num_train_steps = 10
    c.eval_every_steps = c.checkpoint_every_steps = 10
    c.optimizer.warmup_steps = 2
    c.sample.max_new_tokens = 0
  return c


# The labelled presets on this GPT (experiments/sentiment.py, pos.py): the same model and tokenizer
# from scratch, with the pretrained body frozen (a linear probe of what pretraining put into it),
# and fine-tuned from it.
RUN = "workdirs/english-gpt"
LABELLED_PRESETS = ("gpt_english_scratch", "gpt_english_frozen", "gpt_english")


def labelled_body(c: ml_collections.ConfigDict, preset: str, run: str = RUN) -> None:
  """config.model, the tokenizer and init_from of a labelled task's `preset` (LABELLED_PRESETS)."""
  c.model = get_config("gpt").model
  c.model.block.dropout_rate = 0.1
  c.data.tokenizer = f"{run}/tokenizer"
  if preset != "gpt_english_scratch":
    c.init_from = run
  if preset == "gpt_english_frozen":
    c.body_lr_scale = 0.0
