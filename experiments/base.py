"""Defaults every experiment starts from; each field is overridable from the command line
(`--config.optimizer.lr=3e-4`). Names follow the flax examples where they overlap."""

import dataclasses

import ml_collections

from transformer import sharding
from transformer.models import gpt


def model_fields(preset: str, family=gpt, **overrides) -> ml_collections.ConfigDict:
  """All config fields of a model preset (`family`: models.gpt or models.seq2seq; vocab_size 0:
  taken from the tokenizer), so any can be overridden."""
  fields = dataclasses.asdict(family.PRESETS[preset])
  fields.update({"vocab_size": 0, **overrides})
  return ml_collections.ConfigDict(fields)


def common_config() -> ml_collections.ConfigDict:
  """The fields every task's loop reads (experiments/translation.py starts from these too)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.num_train_steps = 1000
  c.log_every_steps = 10
  c.eval_every_steps = 200
  c.checkpoint_every_steps = 200
  c.keep_checkpoints = 3  # the last 3, plus the best by validation loss
  c.async_checkpointing = True

  c.data = ml_collections.ConfigDict()
  c.data.dataset = "shakespeare"  # a named data set (transformer.data.NAMED) ...
  c.data.input_files = ()  # ... or your own files (text documents; a pairs TSV for translation): overrides `dataset`
  c.data.tokenizer = "gpt2"
  c.data.vocab_size = 0  # for tokenizer="bpe"
  c.data.root = "data"  # prepared shards go to <root>/<dataset>-<tokenizer>
  c.data.dir = ""  # or exactly here
  c.data.validation_fraction = 0.1
  c.data.test_fraction = 0.0
  c.data.split_seed = 0

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = "adamw"
  c.optimizer.lr = 1e-3
  c.optimizer.schedule = "cosine"  # | "constant" | "inverse_sqrt"
  c.optimizer.warmup_steps = 100
  c.optimizer.min_lr_ratio = 0.1
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.95
  c.optimizer.eps = 1e-8
  c.optimizer.weight_decay = 0.1
  c.optimizer.decay_embeddings = False
  c.optimizer.decay_norms_and_biases = False
  c.optimizer.grad_clip_norm = 1.0
  c.optimizer.accumulation_steps = 1

  c.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
  c.logical_axis_rules = [(name, list(axes) if isinstance(axes, tuple) else axes)
                          for name, axes in sharding.DEFAULT_RULES]
  return c


def base_config() -> ml_collections.ConfigDict:
  """Language modelling (config.task="lm"): a GPT on windows of a text corpus."""
  c = common_config()
  c.task = "lm"
  c.batch_size = 32  # global, in sequences; split over the data-parallel devices
  c.seq_len = 256
  c.eval_batches = 8  # fixed validation windows, the same at every evaluation
  c.eval_batch_size = 32
  c.data.piece_chars = 16384  # documents are split into pieces of about this size for the split
  c.data.sampling = "windows"  # "windows" (random) | "packed" (every token once an epoch)

  c.model = model_fields("cpu-small")

  c.sample = ml_collections.ConfigDict()
  c.sample.prompt = ""  # empty: start from <|endoftext|>
  c.sample.max_new_tokens = 200
  c.sample.temperature = 0.8
  c.sample.top_k = 0
  c.sample.top_p = 1.0
  c.sample.seed = 0
  return c
