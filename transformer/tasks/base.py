"""The task interface: everything `train_and_evaluate` and `inference.restore` need of a task, and
nothing they may ask about which task it is. What only a trained model's user needs (labelling,
tagging, translating new texts) is in transformer.inference.

A task owns what differs between problems: its config fields, its model, the loss, the training
batches and their position (saved with each checkpoint), evaluation and the end-of-run output. The
loop (transformer.train) owns what they share: the mesh and shardings, the jit-compiled steps,
checkpoints, metrics. A loss returns (sum over target tokens, number of target tokens), so that
gradient accumulation and padding weigh every real token the same.

Adding a task is one module with a `Task` subclass and one line in `transformer/tasks/__init__.py`
(or `tasks.register(MyTask)` from anywhere, e.g. a test).
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, ClassVar, Protocol

import flax.linen as nn
import jax
import numpy as np

from transformer import data, models, sharding
from transformer.config import RunConfig
from transformer.errors import ConfigError, DataError


class ResumableIterator(Protocol):
  """Training batches whose position can be saved and restored exactly (grain iterators are)."""

  def __next__(self) -> Any: ...

  def get_state(self) -> dict: ...

  def set_state(self, state: dict) -> None: ...


class Task(abc.ABC):
  """One problem to train a model on. Subclasses set the class attributes and the abstract methods.

  Built with the resolved run, the tokenizer, the device mesh, and the task's data (`load_data`'s
  result), or `data=None` when only the model is needed (restoring a trained model)."""

  name: ClassVar[str]  # the value of config.task
  Config: ClassVar[type]  # the task's own config fields: a frozen dataclass with `check(run, data_parallel)`
  # The model families (config.model.family: transformer.models.families()) it trains; the first is
  # the default.
  families: ClassVar[tuple[str, ...]]
  data_kind: ClassVar[str]  # what config.data is prepared as: "text" | "pairs" | ... (transformer.data)
  # The evaluation metric that picks the best checkpoint (kept beside the last ones; `--step=best`),
  # and whether "min" or "max" is best.
  best_metric: ClassVar[tuple[str, str]] = ("val_loss", "min")
  # Whether the scores at the end (`finish`) are the best checkpoint's rather than the last step's:
  # early stopping, for tasks that overfit their data within a run (classification, tagging).
  finish_with_best: ClassVar[bool] = False
  # Evaluation metrics drawn by minutes of training beside the losses (loss.png), e.g. ("dev_bleu",).
  curves: ClassVar[tuple[str, ...]] = ()
  # Whether `load_data` takes `load` (inference.load, which the loop hands over): a task whose data a
  # trained model computes (sae); tasks.load_data calls it so.
  data_from_model: ClassVar[bool] = False

  def __init__(
    self, run: RunConfig, tokenizer, mesh: jax.sharding.Mesh, data=None, labels: tuple[str, ...] | None = None
  ):
    """`labels`: the names of the classes or tags a trained model predicts, as `labels` gave them
    when it was trained (the workdir keeps them); a task without labels ignores them."""
    self.run, self.config, self.tokenizer, self.mesh, self.data = run, run.task_config, tokenizer, mesh, data
    self.rules = run.mesh.rules
    self.model_config = run.model_config(tokenizer.vocab_size).check()
    self.model = self.build_model(self.model_config)
    self.batch_sharding = sharding.batch_sharding(mesh, self.rules)

  @classmethod
  def model_config_class(cls, family: str | None) -> type:
    """The model config class of config.model.family=`family` (None: the task's default)."""
    family = family or cls.families[0]
    if family not in cls.families:
      raise ConfigError(
        f"--config.model.family={family!r} cannot be trained by config.task={cls.name!r}; choose "
        f"one of {', '.join(cls.families)}"
      )
    return models.families()[family]

  @abc.abstractmethod
  def build_model(self, model_config) -> nn.Module:
    """The task's model from the resolved model config (see transformer.models for the calls)."""

  @property
  def labels(self) -> tuple[str, ...] | None:
    """The names of what the model predicts (classes, tags) when they are not in the config; the
    workdir keeps them for inference (`Task(..., labels=...)`)."""
    return None

  def save_files(self, workdir: Path) -> None:
    """Writes what a restored model needs beside its params and tokenizer (e.g. a translation
    memory), when a launch may write into the workdir."""

  def load_files(self, workdir: Path) -> None:
    """Reads back what `save_files` wrote, when a model is restored from `workdir`."""

  def init_params(self, params, restore):
    """The params a new run starts from: `params` (freshly initialised) unless the task loads some
    from elsewhere (a pretrained body: config.init_from), e.g. from a trained workdir through
    `restore` (`inference.restore`, which the loop hands over)."""
    return params

  def update_scale(self):
    """None, or a function of the params giving a tree of multipliers of each parameter's update (0
    freezes it; transformer.optim)."""
    return None

  @classmethod
  def load_data(cls, run: RunConfig):
    """The task's data (with a `.tokenizer`): config.data prepared as `data_kind` records, now if it
    has not been. Tasks that make their own data override this; one whose data a trained model makes
    (sae) sets `data_from_model` and takes `load` (inference.load) too: `tasks.load_data`."""
    source = data.source_of(run.data, cls.data_kind)
    cls.check_source(run, source)
    prepared = data.prepared_for(run.data, source)
    if prepared.kind != cls.data_kind:
      raise DataError(
        f"config.task={cls.name!r} trains on {cls.data_kind} data, but {prepared.directory} holds "
        f"{prepared.kind}; choose a {cls.data_kind} data set (--config.data.dataset or "
        f"--config.data.input_files)"
      )
    return prepared

  @classmethod
  def check_data(cls, data_config) -> None:
    """config.data checked as `load_data` will prepare it (before any file is read): one error naming
    the value. A task that makes its own data, or reads config.data otherwise, overrides this."""
    data.check_config(data_config)

  @classmethod
  def check_source(cls, run: RunConfig, source) -> None:
    """Config checks that need the data set's files but not their tokens (e.g. its columns): they
    run before the data is prepared, so a bad value fails in seconds, not after tokenizing."""

  # --- What the loop calls. ---

  @abc.abstractmethod
  def init_inputs(self) -> tuple:
    """Example inputs for `model.init` (their shapes do not matter beyond the rank)."""

  @abc.abstractmethod
  def loss(self, params, batch, rng: jax.Array, train: bool) -> tuple[jax.Array, jax.Array]:
    """(summed loss over the batch's target tokens, their number); `train` turns dropout on. A task
    whose params hold statistics that a step sets rather than learns returns, in training, (summed
    loss, (number, {param name: new value})) instead (the sae task's firing counts)."""

  @abc.abstractmethod
  def train_batches(self) -> ResumableIterator:
    """Host batches for training (arrays or dicts of arrays, batch-major), endlessly."""

  @abc.abstractmethod
  def eval_batches(self) -> list:
    """The fixed host batches that every evaluation scores."""

  @abc.abstractmethod
  def count_tokens(self, host_batch) -> int:
    """Tokens a training batch holds (for tokens/s), over all processes."""

  @abc.abstractmethod
  def flops_per_token(self, num_params: int) -> float:
    """Training FLOPs per counted token (for MFU)."""

  def batch_shapes(self):
    """A global training batch as `jax.ShapeDtypeStruct`s, for compiling the train step ahead of time
    (transformer.plan). By default those of the first training batch; a task whose batches vary in
    shape gives its largest, and one whose processes read slices gives the global shape."""
    first = next(iter(self.train_batches()))
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), first)

  def tokens_per_step(self) -> int | None:
    """The tokens of a full training batch (padding included: it is computed too) that
    `flops_per_token` counts per, for the planner's analytic FLOPs; None: no analytic count."""
    return None

  def put(self, host_batch):
    """A training batch -> global arrays split over the data-parallel devices. By default every
    process holds the whole batch (`put_global`); a task whose processes each read their own slice
    overrides this."""
    return self.put_global(host_batch)

  def put_global(self, host_batch):
    """A batch that every process holds whole -> global arrays (each process puts in its own shards)."""
    return sharding.global_array(host_batch, self.batch_sharding)

  def evaluate(self, params, eval_fn, batches: list) -> dict:
    """Metrics of `params` on the eval batches; `eval_fn(params, device_batch)` is the compiled
    (summed loss, tokens) without dropout. By default: validation loss and perplexity."""
    sums = [tuple(map(float, eval_fn(params, self.put_global(b)))) for b in batches]
    loss = sum(s for s, _ in sums) / max(sum(n for _, n in sums), 1.0)
    return {"val_loss": loss, "val_perplexity": float(np.exp(min(loss, 50.0)))}

  def describe(self, result: dict) -> str:
    """One line for the log from `evaluate`'s result."""
    return f"validation loss {result['val_loss']:.4f} (perplexity {result['val_perplexity']:.2f})"

  def finish(self, params, workdir: Path, mean_of_last) -> dict:
    """The end-of-run output (a sample, test scores); its numbers go to metrics.jsonl.
    `mean_of_last(count)`: (steps, the mean of their params) of the run's last `count` checkpoints
    (`inference.mean_of_last`, which the loop hands over), for a task that scores an average."""
    return {}
