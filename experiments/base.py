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
