"""What every experiment config starts from. The defaults of every field are those of the typed
config pieces (transformer.config, transformer.tasks.*), so each is written once; any field is
overridable from the command line (`--config.optimizer.lr=3e-4`)."""

import ml_collections

from transformer import config, models, tasks
from transformer.models import gpt


def model_fields(preset: str, family=gpt, **overrides) -> ml_collections.ConfigDict:
  """All config fields of a model preset (`family`: models.gpt or models.seq2seq; vocab_size 0:
  taken from the tokenizer), so any can be overridden; `overrides` of the block's fields (d_model=...)
  go to config.model.block."""
  return config.model_dict(family.PRESETS[preset].replace(**{"vocab_size": 0, **overrides}))


def family_fields(family: str, **overrides) -> ml_collections.ConfigDict:
  """config.model for `family` (transformer.models.families(): gpt, encoder, lstm, transformer): every
  field at its default (vocab_size 0: the tokenizer's), then `overrides` (the block's fields go to
  config.model.block)."""
  return config.model_dict(models.families()[family]().replace(**{"vocab_size": 0, **overrides}))


def lm_config() -> ml_collections.ConfigDict:
  """Language modelling (config.task="lm"): a small GPT on windows of a text corpus."""
  c = tasks.defaults("lm")
  c.model = model_fields("cpu-small")
  return c


def labelled_config(
  task: str, dataset: str, *, vocab_size: int, num_train_steps: int, eval_every_steps: int, lr: float
) -> ml_collections.ConfigDict:
  """A labelled task (config.task: classification or tagging) on a named data set split 80/10/10:
  words (the training split's `vocab_size` most frequent; the rest <|unk|>) in texts of up to 64,
  batches of 32, `num_train_steps` at `lr` after 100 warmup steps, evaluated and saved every
  `eval_every_steps`. The presets then choose the model."""
  c = tasks.defaults(task)
  c.data.dataset = dataset
  c.data.validation_fraction = 0.1
  c.data.test_fraction = 0.1
  c.data.tokenizer = "word"
  c.data.vocab_size = vocab_size
  c.max_len = 64
  c.batch_size = 32
  c.num_train_steps = num_train_steps
  c.eval_every_steps = c.checkpoint_every_steps = eval_every_steps
  c.log_every_steps = 50
  c.optimizer.lr = lr
  c.optimizer.warmup_steps = 100
  return c


def tiny_labelled(c: ml_collections.ConfigDict, model: ml_collections.ConfigDict) -> None:
  """A labelled config made a tiny run, for tests and smoke runs: `model` on 2,000 words in texts of
  up to 32, 20 steps."""
  c.model = model
  c.data.vocab_size = 2000
  c.max_len = 32
  c.num_train_steps = 20
  c.eval_every_steps = c.checkpoint_every_steps = 10
  c.log_every_steps = 5
  c.optimizer.warmup_steps = 5
