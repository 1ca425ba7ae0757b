"""What every experiment config starts from. The defaults of every field are those of the typed
config pieces (transformer.config, transformer.tasks.*), so each is written once; any field is
overridable from the command line (`--config.optimizer.lr=3e-4`)."""

import dataclasses

import ml_collections

from transformer import config
from transformer.models import gpt


def model_fields(preset: str, family=gpt, **overrides) -> ml_collections.ConfigDict:
  """All config fields of a model preset (`family`: models.gpt or models.seq2seq; vocab_size 0:
  taken from the tokenizer), so any can be overridden."""
  fields = dataclasses.asdict(family.PRESETS[preset])
  fields.update({"vocab_size": 0, **overrides})
  return ml_collections.ConfigDict(fields)


def lm_config() -> ml_collections.ConfigDict:
  """Language modelling (config.task="lm"): a small GPT on windows of a text corpus."""
  c = config.defaults("lm")
  c.model = model_fields("cpu-small")
  return c
