"""What every experiment config starts from. The defaults of every field are those of the typed
config pieces (transformer.config, transformer.tasks.*), so each is written once; any field is
overridable from the command line (`--config.optimizer.lr=3e-4`)."""

import dataclasses

import ml_collections

from transformer import tasks
from transformer.models import gpt


def model_fields(preset: str, family=gpt, **overrides) -> ml_collections.ConfigDict:
  """All config fields of a model preset (`family`: models.gpt or models.seq2seq; vocab_size 0:
  taken from the tokenizer), so any can be overridden."""
  fields = {"family": family.PRESETS[preset].family, **dataclasses.asdict(family.PRESETS[preset])}
  fields.update({"vocab_size": 0, **overrides})
  return ml_collections.ConfigDict(fields)


def family_fields(family: str, **overrides) -> ml_collections.ConfigDict:
  """config.model for `family` (transformer.models.families(): gpt, encoder, lstm, transformer): every
  field at its default (vocab_size 0: the tokenizer's), then `overrides`."""
  from transformer import models
  fields = {"family": family, **dataclasses.asdict(models.families()[family]()), "vocab_size": 0}
  return ml_collections.ConfigDict({**fields, **overrides})


def lm_config() -> ml_collections.ConfigDict:
  """Language modelling (config.task="lm"): a small GPT on windows of a text corpus."""
  c = tasks.defaults("lm")
  c.model = model_fields("cpu-small")
  return c
