"""The run's configuration, resolved once.

Experiments write an `ml_collections.ConfigDict` (experiments/*.py) and the command line overrides
any field of it (`--config.optimizer.lr=3e-4`). At the top of a run, `tasks.resolve` turns that dict
into typed, frozen pieces (`resolve_for` here, with the task that config.task names), checks every
value before anything is built, and computes what derives from it (the mesh shape and the
data-parallel size); modules then receive the piece they need:

  RunConfig
    task         config.task: which registered task trains (transformer.tasks)
    loop         LoopConfig: steps, logging, evaluation and checkpoint intervals (top-level fields)
    optimizer    OptimizerConfig (config.optimizer.*)
    mesh         MeshConfig (config.mesh.* and config.logical_axis_rules)
    data         DataConfig (config.data.*): which data set, and how it is tokenized and split
    model        the task's model config (GPTConfig, Seq2SeqConfig, ...) from config.model.*; its class
                 is the family config.model.family names (one of the task's `families`)
    task_config  the task's own fields (e.g. LMConfig: seq_len, batch_size, config.sample.*)

Each piece is a frozen dataclass whose fields are the config's keys, with their defaults: the
ConfigDict an experiment starts from is made from them (`defaults`), so every default is written
once, here or in the task's module. A field stored under another key than `<section>.<name>` says
so with `at("data.sampling", ...)`. A key that no piece reads is an error, as is a value of the
wrong type; every error names the `--config.` flag to change. A piece's `may_change` names the
fields that may differ when a run resumes (`resume_changes`); every other field is fixed for the run.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, ClassVar

import ml_collections

from transformer import sharding
from transformer.errors import ConfigError, UserError

ALL = ("*",)  # `may_change` of a config piece whose every field may change when a run resumes


def at(key: str, default: Any) -> Any:
  """A field stored at config key `key` (dotted), not at its section's `<section>.<name>`."""
  return dataclasses.field(default=default, metadata={"key": key})


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """What the training loop reads (top-level fields)."""

  seed: int = 0
  num_train_steps: int = 1000
  log_every_steps: int = 10
  eval_every_steps: int = 200
  checkpoint_every_steps: int = 200
  keep_checkpoints: int = 3  # the last 3, plus the best (Task.best_metric: val loss; dev BLEU for translation)
  async_checkpointing: bool = True
  # A step whose loss or gradient norm is not finite is never applied. Then "stop"
  # (exit 1, naming the step and its batch; the last good checkpoint stays the latest) or "skip"
  # (log it in metrics.jsonl, go on), stopping after more than max_consecutive_skips in a row.
  on_nonfinite: str = "stop"
  max_consecutive_skips: int = 5
  # Python modules imported before the config is read, by every program that trains, restores or uses
  # the run (transformer.tasks.resolve does it): where a task (tasks.register) or an attention
  # mechanism (layers.register_mechanism) of one's own is registered. config.json records them, so a
  # run's extensions cross the process boundary with it. Importable names: on PYTHONPATH, or in the
  # directory a program runs in. `--config.imports=my_mechanisms` (several: a,b).
  imports: tuple[str, ...] = ()
  # Training steps one compiled call runs (a lax.scan over that many batches): for a step so short
  # that the loop's Python round trip per step shows in its time. The intervals above and
  # num_train_steps are then multiples of it.
  steps_per_call: int = 1

  may_change: ClassVar[tuple[str, ...]] = (
    "imports",
    "steps_per_call",
    "num_train_steps",
    "log_every_steps",
    "eval_every_steps",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "async_checkpointing",
    "on_nonfinite",
    "max_consecutive_skips",
  )

  def check(self) -> None:
    check_positive(
      self,
      (
        "num_train_steps",
        "eval_every_steps",
        "checkpoint_every_steps",
        "log_every_steps",
        "keep_checkpoints",
        "max_consecutive_skips",
        "steps_per_call",
      ),
    )
    for name in ("num_train_steps", "log_every_steps", "eval_every_steps", "checkpoint_every_steps"):
      if getattr(self, name) % self.steps_per_call:
        raise ConfigError(
          f"--config.{name}={getattr(self, name)} is not a multiple of --config.steps_per_call="
          f"{self.steps_per_call} (the steps one compiled call runs); make it one, or lower steps_per_call"
        )
    if self.on_nonfinite not in NONFINITE_POLICIES:
      raise ConfigError(
        f"--config.on_nonfinite={self.on_nonfinite!r} is unknown; choose one of {', '.join(NONFINITE_POLICIES)}"
      )


NONFINITE_POLICIES = ("stop", "skip")


SCHEDULES = ("cosine", "linear", "wsd", "constant", "inverse_sqrt")
OPTIMIZERS = ("adamw", "muon")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """config.optimizer: AdamW or Muon, the schedule, clipping and gradient accumulation (transformer.optim)."""

  # "adamw"; "muon" (Jordan et al. 2024): the blocks' matrices by orthogonalised momentum at muon_lr,
  # everything else (embeddings, head, norms, biases) by AdamW at lr.
  name: str = "adamw"
  lr: float = 1e-3
  # After warmup: "cosine" or "linear" decay to lr*min_lr_ratio at the last step; "wsd" (warmup-stable-
  # decay) constant, then linear to lr*min_lr_ratio over the last decay_fraction of the steps;
  # "constant"; "inverse_sqrt" (the 2017 Transformer's).
  schedule: str = "cosine"
  warmup_steps: int = 100
  min_lr_ratio: float = 0.1
  decay_fraction: float = 0.2  # schedule "wsd"
  muon_lr: float = 0.02  # name "muon": the matrices' learning rate (the schedule scales it as it scales lr)
  muon_momentum: float = 0.95  # name "muon": Nesterov momentum of the matrices' updates
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  weight_decay: float = 0.1
  decay_embeddings: bool = False
  decay_norms_and_biases: bool = False
  grad_clip_norm: float = 1.0  # 0: no clipping
  accumulation_steps: int = 1  # microbatches per optimizer step (a scan inside the step)

  may_change: ClassVar = ALL  # hyperparameters; the optimizer state's structure is the same

  def check(self) -> None:
    if self.name not in OPTIMIZERS:
      raise ConfigError(f"--config.optimizer.name={self.name!r} is unknown; choose one of {', '.join(OPTIMIZERS)}")
    if self.schedule not in SCHEDULES:
      raise ConfigError(
        f"--config.optimizer.schedule={self.schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}"
      )
    check_positive(self, ("lr", "accumulation_steps", "eps", "muon_lr"), "optimizer.")
    if not 0 < self.decay_fraction <= 1:
      raise ConfigError(f"--config.optimizer.decay_fraction must be in (0, 1], got {self.decay_fraction}")
    for name in ("warmup_steps", "weight_decay", "grad_clip_norm", "min_lr_ratio"):
      if getattr(self, name) < 0:
        raise ConfigError(f"--config.optimizer.{name} must be >= 0, got {getattr(self, name)}")
    for name in ("b1", "b2", "muon_momentum"):
      if not 0 <= getattr(self, name) < 1:
        raise ConfigError(f"--config.optimizer.{name} must be in [0, 1), got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """config.mesh: the device mesh (data, fsdp, tensor; -1 takes the remaining devices) and the
  logical axis rules that map the model's axis names onto it (transformer.sharding)."""

  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  logical_axis_rules: tuple = at("logical_axis_rules", sharding.DEFAULT_RULES)
  # Derived by `resolve` from the number of devices (empty when resolved without devices).
  shape: tuple[int, ...] = dataclasses.field(default=(), metadata={"derived": True})
  data_parallel: int = dataclasses.field(default=1, metadata={"derived": True})

  may_change: ClassVar = ALL  # checkpoints restore onto any mesh

  @property
  def rules(self) -> tuple:
    return self.logical_axis_rules

  def sizes(self) -> dict:
    return {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}

  def fitted(self, num_devices: int) -> MeshConfig:
    """This mesh on `num_devices` devices: its shape with -1 filled in, and the data-parallel size."""
    shape = sharding.mesh_shape(self.sizes(), num_devices)
    data_parallel = sharding.data_parallel_size(dict(zip(sharding.MESH_AXES, shape)), self.rules)
    return dataclasses.replace(self, shape=shape, data_parallel=data_parallel)


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """config.data: which text, and how it is tokenized and split. The data set is prepared on first use
  into `<root>/<dataset>-<tokenizer>` (or `dir`) and reused after. What these values do is
  transformer.data's (`data.source_of`, `data.prepared_for`, `data.check_config`): this piece only
  holds them, so that the config stands below the data package."""

  dataset: str = "shakespeare"  # a named data set (transformer.data.NAMED) ...
  input_files: tuple[str, ...] = ()  # ... or your own files, which override `dataset`
  tokenizer: str = "gpt2"  # gpt2 | cl100k_base | char | bpe | word | a saved tokenizer's directory
  vocab_size: int = 0  # for tokenizer="bpe" and "word" (the most frequent words of the training split)
  lowercase: bool = False  # for tokenizer="word"
  root: str = "data"
  dir: str = ""  # prepare exactly here instead
  validation_fraction: float = 0.1
  test_fraction: float = 0.0
  split_seed: int = 0
  piece_chars: int = 16384  # text documents are cut into pieces of about this size for the split
  # Translation: training-only pairs beside the sentence pairs, "dictionary" (the data set's own word
  # and phrase entries: ding_de_en) or a TSV file of pairs; how much of them a step sees is the
  # task's (config.lexicon_share).
  lexicon: str = ""

  may_change: ClassVar[tuple[str, ...]] = ("root", "dir")  # where it is prepared; its content is checked


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Everything a run is made from, typed and checked (see the module docstring)."""

  task: str
  loop: LoopConfig
  optimizer: OptimizerConfig
  mesh: MeshConfig
  data: DataConfig
  model: Any  # the task's model config; vocab_size 0 means "the tokenizer's" (`model_config`)
  task_config: Any

  def model_config(self, vocab_size: int):
    """The model config for a tokenizer of `vocab_size` tokens (vocab_size 0 takes it; a larger one
    pads the vocabulary, e.g. to a multiple of the tensor-parallel size)."""
    if not _has_vocabulary(self.model):
      return self.model
    if not self.model.vocab_size:
      return self.model.replace(vocab_size=vocab_size)
    if self.model.vocab_size < vocab_size:
      raise ConfigError(
        f"--config.model.vocab_size={self.model.vocab_size} is smaller than the tokenizer's "
        f"{vocab_size}; set it to 0 (take the tokenizer's) or at least {vocab_size}"
      )
    return self.model


def resolve_for(task_cls, config: ml_collections.ConfigDict, *, num_devices: int | None = None) -> RunConfig:
  """The ConfigDict as a checked RunConfig of the task class `task_cls` (what config.task names:
  `tasks.resolve` looks it up). With `num_devices` (training), the mesh is fitted to that many
  devices and the task's batch sizes are checked against the data-parallel size; without (restoring
  a trained model elsewhere), only what does not depend on devices is checked."""
  task_name = task_cls.name
  used: set[str] = {"task", "model.family"}
  loop = _read(LoopConfig, config, "", used)
  optimizer = _read(OptimizerConfig, config, "optimizer.", used)
  mesh = _read(MeshConfig, config, "mesh.", used)
  data_config = _read(DataConfig, config, "data.", used)
  family = _lookup(config, "model.family")
  model = _read(task_cls.model_config_class(None if family is _MISSING else family), config, "model.", used)
  task_config = _read(task_cls.Config, config, "", used)
  _check_all_read(config, used)

  loop.check()
  optimizer.check()
  task_cls.check_data(data_config)
  try:  # every model check but the vocabulary size, which may come from the tokenizer
    (model.replace(vocab_size=model.vocab_size or 1) if _has_vocabulary(model) else model).check()
  except UserError as e:
    raise ConfigError(f"--config.model: {e}") from None
  if num_devices is not None:
    mesh = mesh.fitted(num_devices)
  run = RunConfig(task_name, loop, optimizer, mesh, data_config, model, task_config)
  task_config.check(run, mesh.data_parallel if num_devices is not None else None)
  return run


def resume_changes(saved: RunConfig, new: RunConfig) -> tuple[list[str], list[str]]:
  """What differs between the config a run was started with and a new launch on its workdir, as
  "key=new (the run's: old)" lines: (those that may not change on resume, those that may). What may
  change is each piece's `may_change`: loop cadence, optimizer, mesh, evaluation and sampling; the
  task, model, data and batch shapes may not (the checkpoints and the data position depend on them)."""
  fixed, allowed = [], []
  if saved.task != new.task:
    return [f"task={new.task} (the run's: {saved.task})"], []
  if saved.model.family != new.model.family:
    return [f"model.family={new.model.family} (the run's: {saved.model.family})"], []
  for old_piece, new_piece, prefix in zip(_pieces(saved), _pieces(new), _PREFIXES):
    _diff(old_piece, new_piece, prefix, getattr(new_piece, "may_change", ()), fixed, allowed)
  return fixed, allowed


def _pieces(run: RunConfig) -> tuple:
  return run.loop, run.optimizer, run.mesh, run.data, run.model, run.task_config


_PREFIXES = ("", "optimizer.", "mesh.", "data.", "model.", "")  # the config keys of `_pieces`


def _diff(old, new, prefix: str, may_change: tuple, fixed: list, allowed: list) -> None:
  for f, key, hint in _fields(type(new), prefix):
    a, b = getattr(old, f.name), getattr(new, f.name)
    changeable = may_change == ALL or f.name in may_change
    if dataclasses.is_dataclass(hint):
      _diff(a, b, key + ".", ALL if changeable else getattr(b, "may_change", ()), fixed, allowed)
    elif a != b:
      (allowed if changeable else fixed).append(f"{key}={b!r} (the run's: {a!r})")


def defaults_for(task_cls) -> ml_collections.ConfigDict:
  """The ConfigDict of every field's default for the task class `task_cls` (`tasks.defaults` looks it
  up by name): what experiments start from."""
  c = ml_collections.ConfigDict({"task": task_cls.name})
  for piece, prefix in (
    (LoopConfig(), ""),
    (OptimizerConfig(), "optimizer."),
    (MeshConfig(), "mesh."),
    (DataConfig(), "data."),
    (_defaults(task_cls.model_config_class(None)), "model."),
    (task_cls.Config(), ""),
  ):
    _write(piece, c, prefix)
  return c


def _has_vocabulary(model_config) -> bool:
  """A model config of tokens (vocab_size), not of activations (an SAE's)."""
  return hasattr(model_config, "vocab_size")


def _defaults(config_class):
  """A model config class's defaults, its vocabulary taken from the tokenizer (vocab_size 0) where it has one."""
  return config_class(vocab_size=0) if _has_vocabulary(config_class) else config_class()


def model_dict(model_config) -> ml_collections.ConfigDict:
  """config.model for a model config: its family and every field (the block as config.model.block),
  e.g. a preset that an experiment starts from."""
  c = ml_collections.ConfigDict()
  _write(model_config, c, "model.")
  return c.model


def to_config_dict(run: RunConfig) -> ml_collections.ConfigDict:
  """The inverse of `resolve` (what config.json holds): resolving it again gives `run`."""
  c = ml_collections.ConfigDict({"task": run.task})
  for piece, prefix in zip(_pieces(run), _PREFIXES):
    _write(piece, c, prefix)
  return c


# ---------------------------------------------------------------------------------------------
# ConfigDict <-> dataclasses.

_MISSING = object()


def _fields(cls, prefix: str):
  """(field, config key, type) of a config dataclass; derived fields are not config keys."""
  hints = typing.get_type_hints(cls)
  for f in dataclasses.fields(cls):
    if not f.metadata.get("derived"):
      yield f, f.metadata.get("key", prefix + f.name), hints[f.name]


def _lookup(config, key: str):
  node = config
  for part in key.split("."):
    if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
      return _MISSING
    node = node[part]
  return node


def _read(cls, config, prefix: str, used: set[str], default=None):
  """An instance of `cls` from the keys under `prefix`; a missing key keeps `default`'s value (or
  the class's default)."""
  values = {}
  for f, key, hint in _fields(cls, prefix):
    if dataclasses.is_dataclass(hint):  # a section of its own, e.g. config.sample, config.model.block
      values[f.name] = _read(hint, config, key + ".", used, _field_default(f))
      continue
    value = _lookup(config, key)
    if value is not _MISSING:
      used.add(key)
      values[f.name] = _coerce(value, hint, key)
  return cls(**values) if default is None else dataclasses.replace(default, **values)


def _field_default(f: dataclasses.Field):
  """A section's default value: e.g. each model family's own block (GPT-2's, the 2017 paper's)."""
  if f.default is not dataclasses.MISSING:
    return f.default
  return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def _coerce(value, hint, key: str):
  origin = typing.get_origin(hint) or hint
  wrong = ConfigError(f"--config.{key}={value!r} is not a {getattr(origin, '__name__', origin)}; give one")
  if origin is bool:
    if not isinstance(value, (bool, int)) or value not in (0, 1):
      raise wrong
    return bool(value)
  if origin is int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
      raise wrong
    return int(value)
  if origin is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise wrong
    return float(value)
  if origin is str:
    if not isinstance(value, str):
      raise wrong
    return value
  if origin is tuple:
    return _frozen(value)
  return value


def _frozen(value):
  """Lists (JSON, ConfigDict) as tuples, all the way down: frozen pieces hold hashable values."""
  if isinstance(value, (list, tuple)):
    return tuple(_frozen(v) for v in value)
  return value


def _write(piece, c: ml_collections.ConfigDict, prefix: str) -> None:
  if prefix == "model.":  # which family's fields these are
    c.model = c.get("model") or ml_collections.ConfigDict()
    c.model.family = piece.family
  for f, key, hint in _fields(type(piece), prefix):
    value = getattr(piece, f.name)
    if dataclasses.is_dataclass(hint):
      _write(value, c, key + ".")
      continue
    *sections, name = key.split(".")
    node = c
    for section in sections:
      if section not in node:
        node[section] = ml_collections.ConfigDict()
      node = node[section]
    node[name] = value


def _leaf_keys(config, prefix: str = ""):
  for name, value in config.items():
    if isinstance(value, (ml_collections.ConfigDict, dict)) and value:
      yield from _leaf_keys(value, f"{prefix}{name}.")
    else:
      yield prefix + name


def _check_all_read(config, used: set[str]) -> None:
  """A key no piece reads would be silently ignored (a typo, or a field of another task): refuse it."""
  unread = [k for k in _leaf_keys(config) if k not in used]
  if unread:
    section = unread[0].rpartition(".")[0]
    known = sorted(k.rpartition(".")[2] for k in used if k.rpartition(".")[0] == section)
    hint = ""
    if section.split(".")[0] == "model":  # e.g. --config.model.family=lstm on a preset of another family
      hint = (
        f" (config.model.family={config.model.get('family')!r}: config.model must hold that family's fields; "
        f"start from a preset of that family, or experiments.base.family_fields)"
      )
    where = (
      f"the fields {'of config.' + section if section else 'at the top level'} are {', '.join(known)}"
      if known
      else f"config.{section} is not a section of it"
    )
    raise ConfigError(
      f"--config.{unread[0]} is not a field of this task's config (it would be ignored); {where}" + hint
    )


def check_positive(piece, names, prefix: str = "") -> None:
  """Each of `names` (fields of `piece`, whose keys are `<prefix><name>`) must be > 0 and finite."""
  for name in names:
    value = getattr(piece, name)
    if not value > 0 or (isinstance(value, float) and not math.isfinite(value)):
      raise ConfigError(f"--config.{prefix}{name} must be positive, got {value}")
