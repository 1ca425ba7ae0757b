"""What classification and tagging share: token sequences with labels in fixed-shape padded batches,
a body (encoder, gpt or lstm: transformer.models.classifier) under a head, the loss over the labelled
positions, compiled prediction, and starting the body from a pretrained model (`init_from`).

A batch is a dict of `tokens` (B, L) int32, `valid` (B, L) bool (False: padding) and `labels`: (B, 1)
per text or (B, L) per token, int32, -1 where nothing is scored (padding, a word's later subwords,
filler rows). Every batch has the same shape (batch_size x max_len), so the step compiles once.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import ClassVar

import flax.linen as nn
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer import checkpoints, metrics, tokenizers
from transformer import workdir as workdir_files
from transformer.config import RunConfig, check_positive
from transformer.errors import ConfigError, DataError
from transformer.models import classifier
from transformer.models.formats.gpt2 import import_hf_gpt2
from transformer.tasks.base import Task


@dataclasses.dataclass(frozen=True)
class LabelledConfig:
  """The fields both labelled tasks have (their configs add their own)."""

  max_len: int = 128  # tokens per row (classification cuts a longer text; tagging splits it into rows)
  batch_size: int = 32
  eval_batch_size: int = 64
  init_from: str = ""  # a workdir or a Hugging Face GPT-2 directory whose weights the body starts from
  body_lr_scale: float = 1.0  # with init_from: the body's updates times this (0 freezes it)

  may_change: ClassVar[tuple[str, ...]] = ("eval_batch_size",)

  def check(self, run: RunConfig, data_parallel: int | None) -> None:
    check_common(self, run, data_parallel)


def check_common(c, run: RunConfig, data_parallel: int | None) -> None:
  """The checks of a labelled task's config `c` (batch_size, eval_batch_size, max_len, body_lr_scale)."""
  check_positive(c, ("batch_size", "eval_batch_size", "max_len"))
  if c.max_len > run.model.max_len:
    raise ConfigError(
      f"--config.max_len={c.max_len} is longer than the model's longest sequence "
      f"({run.model.max_len}: --config.model.max_len); lower the one or "
      f"raise the other"
    )
  if not c.body_lr_scale >= 0:
    raise ConfigError(f"--config.body_lr_scale must be >= 0 (0 freezes the body), got {c.body_lr_scale}")
  if c.body_lr_scale != 1 and not c.init_from:
    raise ConfigError("--config.body_lr_scale scales a pretrained body's updates; give --config.init_from too")
  accum = run.optimizer.accumulation_steps
  if c.batch_size % accum:
    raise ConfigError(
      f"--config.batch_size={c.batch_size} is not divisible by --config.optimizer.accumulation_steps={accum}"
    )
  if data_parallel is not None:
    for name, size in (("batch_size", c.batch_size // accum), ("eval_batch_size", c.eval_batch_size)):
      if size % data_parallel:
        raise ConfigError(
          f"--config.{name}={getattr(c, name)} is not divisible by the data-parallel size "
          f"{data_parallel} (mesh data*fsdp); use a multiple of {data_parallel}"
        )


def pad_batch(examples: list, max_len: int, per_token: bool, rows: int) -> dict:
  """(ids, label) examples -> one padded batch of `rows` rows (filler rows score nothing)."""
  batch = {
    "tokens": np.zeros((rows, max_len), np.int32),
    "valid": np.zeros((rows, max_len), bool),
    "labels": np.full((rows, max_len if per_token else 1), -1, np.int32),
  }  # batch-major, rank 2
  for r, (ids, label) in enumerate(examples):
    batch["tokens"][r, : len(ids)] = ids
    batch["valid"][r, : len(ids)] = True
    if per_token:
      batch["labels"][r, : len(ids)] = label
    else:
      batch["labels"][r, 0] = label
  return batch


def fixed_batches(examples: list, max_len: int, per_token: bool, batch_size: int) -> list[dict]:
  """Every example once, in order: evaluation's batches."""
  return [
    pad_batch(examples[i : i + batch_size], max_len, per_token, batch_size) for i in range(0, len(examples), batch_size)
  ]


class ShuffledBatches:
  """Training batches: each epoch every example once in a new order (the last partial batch of an
  epoch is dropped). Like a grain iterator, `get_state()`/`set_state()` are the exact position."""

  def __init__(self, examples: list, *, batch_size: int, max_len: int, per_token: bool, seed: int):
    if len(examples) < batch_size:
      raise DataError(
        f"the training split has {len(examples)} examples, fewer than one batch of {batch_size}; "
        f"lower --config.batch_size or give more data"
      )
    self.examples, self.batch_size, self.max_len, self.per_token, self.seed = (
      examples,
      batch_size,
      max_len,
      per_token,
      seed,
    )
    self.epoch, self.index = 0, 0
    self.per_epoch = len(examples) // batch_size

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self.index == self.per_epoch:
      self.epoch, self.index = self.epoch + 1, 0
    order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.examples))
    chosen = order[self.index * self.batch_size : (self.index + 1) * self.batch_size]
    self.index += 1
    return pad_batch([self.examples[i] for i in chosen], self.max_len, self.per_token, self.batch_size)

  def get_state(self) -> dict:
    return {"epoch": self.epoch, "index": self.index}

  def set_state(self, state: dict) -> None:
    self.epoch, self.index = int(state["epoch"]), int(state["index"])


def labelled_loss(model, params, batch: dict, rng, train: bool):
  """(summed cross-entropy over the labelled positions, their number)."""
  logits = model.apply(
    {"params": params}, batch["tokens"], valid_BxT=batch["valid"], deterministic=not train, rngs={"dropout": rng}
  )
  labels = batch["labels"].reshape(logits.shape[:-1])  # (B, 1) -> (B,) for a label per text
  scored = labels >= 0
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
  return jnp.where(scored, ce, 0.0).sum(), scored.sum().astype(jnp.float32)


class LabelledTask(Task):
  """The shared part of classification and tagging; subclasses set `per_token`, make `examples`
  and `labels`, and report their metrics."""

  families = ("encoder", "gpt", "lstm")
  per_token: bool
  # Small labelled sets are overfit within a run: the checkpoint of the best dev accuracy is the one
  # scored on test at the end and served (launch.classify/tag/evaluate --step=best, their default).
  best_metric = ("dev_accuracy", "max")
  finish_with_best = True

  def init_inputs(self) -> tuple:
    return (jnp.zeros((1, 8), jnp.int32),)

  def loss(self, params, batch, rng, train: bool):
    return labelled_loss(self.model, params, batch, rng, train)

  def train_batches(self):
    c = self.config
    return ShuffledBatches(
      self.examples["train"],
      batch_size=c.batch_size,
      max_len=c.max_len,
      per_token=self.per_token,
      seed=self.run.loop.seed,
    )

  def eval_batches(self) -> list:
    return self.batches("validation")

  def batches(self, split: str) -> list[dict]:
    c = self.config
    return fixed_batches(self.examples[split], c.max_len, self.per_token, c.eval_batch_size)

  def count_tokens(self, batch: dict) -> int:
    return int(batch["valid"].sum())

  def tokens_per_step(self) -> int:
    return self.config.batch_size * self.config.max_len

  def flops_per_token(self, num_params: int) -> float:
    cfg = self.model_config
    attention_layers = 0 if cfg.family == "lstm" else cfg.num_layers
    return metrics.flops_per_token(num_params, attention_layers, classifier.body_width(cfg), self.config.max_len)

  @functools.cached_property
  def _predict(self):
    return jax.jit(
      lambda params, tokens, valid: jax.nn.softmax(
        self.model.apply({"params": params}, tokens, valid_BxT=valid), axis=-1
      )
    )

  def probabilities(self, params, batches: list[dict]) -> np.ndarray:
    """Class probabilities of every real row of `batches` (B, C) or (B, L, C), concatenated."""
    out = []
    for b in batches:
      tokens, valid = self.put_global((b["tokens"], b["valid"]))
      out.append(np.asarray(self._predict(params, tokens, valid)))
    return np.concatenate(out)

  def encode_texts(self, texts: list[str]) -> list[list[int]]:
    """Token ids of each text (a character vocabulary folds what it lacks: tokenizers.fit_text)."""
    out = []
    for i, text in enumerate(texts):
      if not text.strip():
        raise DataError(f"text {i + 1} is empty; give some words to label")
      out.append(self.tokenizer.encode(tokenizers.fit_text(self.tokenizer, text)))
    return out

  # --- Fine-tuning from a pretrained body (config.init_from). ---

  def update_scale(self):
    scale = self.config.body_lr_scale
    if scale == 1:
      return None
    return lambda params: {k: jax.tree.map(lambda _: scale if k == "body" else 1.0, v) for k, v in params.items()}

  def init_params(self, params, restore):
    if not self.config.init_from:
      return params
    pretrained = load_pretrained_body(self.config.init_from, self.model_config, self.tokenizer, restore)
    return {**params, "body": fit_body(pretrained, params["body"], self.config.init_from)}


def load_pretrained_body(path: str, model_config, tokenizer, restore) -> dict:
  """The body params of a pretrained model at `path`: a training workdir of this codebase (its
  latest checkpoint through `restore`, i.e. `inference.restore`: a GPT or LSTM language model, or
  another classifier/tagger's body) or a Hugging Face GPT-2 directory. Its tokenizer must be the one
  this run's data was tokenized with."""
  directory = Path(path).expanduser()
  # A workdir has checkpoints/ (a Hugging Face directory has a config.json too).
  if (directory / workdir_files.CHECKPOINTS).is_dir():
    theirs = tokenizers.load_tokenizer(directory / workdir_files.TOKENIZER)
    _check_same_tokenizer(theirs, tokenizer, path)
    trained = restore(directory)
    if trained.run.model.family != model_config.family:
      raise ConfigError(
        f"--config.init_from={path} holds a {trained.run.model.family} model, but "
        f"--config.model.family={model_config.family}; use the same family"
      )
    params = jax.device_get(trained.params)
    if "body" in params:  # a classifier or tagger
      return params["body"]
    return params["lstm"] if model_config.family == "lstm" else params
  if model_config.family != "gpt":
    raise ConfigError(
      f"--config.init_from={path} is not a training workdir (no {workdir_files.CHECKPOINTS}/); a "
      f"Hugging Face directory holds GPT-2 weights, for --config.model.family=gpt"
    )
  if tokenizer.name != "gpt2":
    raise ConfigError(
      f"--config.init_from={path} is GPT-2, which reads gpt2 tokens; set --config.data.tokenizer=gpt2 "
      f"(this run's data is tokenized with {tokenizer.name})"
    )
  _, params = import_hf_gpt2(str(directory))
  return jax.device_get(params)


def _check_same_tokenizer(theirs, ours, path: str) -> None:
  if not tokenizers.identical(theirs, ours):
    raise ConfigError(
      f"--config.init_from={path} was trained on other tokens ({theirs}) than this run's data "
      f"({ours}); tokenize the data with its tokenizer: --config.data.tokenizer={path}/tokenizer"
    )


def fit_body(pretrained: dict, body: dict, path: str) -> dict:
  """`pretrained` cut to the body's tensors (an LM head is left out), each checked against the body's
  shape: a tensor that is missing or shaped otherwise is one error naming it."""
  theirs, ours = checkpoints.flat_params(pretrained), checkpoints.flat_params(nn.unbox(body))
  kind, name = checkpoints.first_mismatch(ours, theirs, extra=False) or (None, None)
  if kind == "missing":
    raise ConfigError(
      f"--config.init_from={path} has no tensor {name} that the body needs (it has "
      f"{', '.join(sorted(theirs)[:6])}, ...); set --config.model.* like the pretrained model's"
    )
  if kind == "shape":
    raise ConfigError(
      f"--config.init_from={path}: tensor {name} is {tuple(theirs[name].shape)} there but "
      f"{tuple(ours[name].shape)} in this body; set --config.model.* (block.d_model, num_layers, "
      f"block.num_heads, max_len, ...) like the pretrained model's"
    )
  out = {name: jnp.asarray(theirs[name], mine.dtype) for name, mine in ours.items()}
  return flax.traverse_util.unflatten_dict(out, sep="/")
