"""Training checkpoints (Orbax): the train state, the data position and run metadata in one step
directory per save; async saves; the last `keep` plus the best by an evaluation metric (the
validation loss, or a task's own, e.g. dev BLEU) are kept.

Restoring checks every saved parameter's name and shape against what the config makes first, so a
changed model config fails with the parameter named instead of deep inside Orbax. A step directory
that cannot be read (its files torn by a crash or a full disk) is not a checkpoint: `restore_latest`
moves it aside to `unreadable_checkpoints/` with a warning and falls back to the newest intact one.
A save that Orbax did not finish (the process killed while writing) stays a temporary directory,
which Orbax ignores and removes. (Hugging Face GPT-2 weights are converted by
`transformer.models.formats.gpt2`; a trained model for inference is restored by `transformer.inference`.)
"""

from __future__ import annotations

import contextlib
import json
import logging as logging_std
import math
import os
import time
from pathlib import Path

import flax.traverse_util
import jax
from absl import logging
from jax.experimental import multihost_utils

from transformer.errors import CheckpointError, WorkdirError

# What every step directory holds as JSON (its metrics, written only with a validation loss, may be absent).
_JSON_FILES = ("_CHECKPOINT_METADATA", "state/_METADATA", "data/metadata", "meta/metadata")
_OPTIONAL_JSON = ("metrics/metrics",)
UNREADABLE = "unreadable_checkpoints"  # beside the checkpoints directory: where damaged steps are moved


def unreadable_reason(step_dir: Path) -> str | None:
  """Why a step directory is not a whole checkpoint (a missing or torn file), or None. This reads the
  small files; torn array data shows when the step is restored."""
  for name in _JSON_FILES + _OPTIONAL_JSON:
    path = step_dir / name
    if not path.exists():
      if name in _OPTIONAL_JSON:
        continue
      return f"{name} is missing"
    try:
      json.loads(path.read_text())
    except (OSError, ValueError) as e:
      return f"{name} is unreadable ({type(e).__name__}: {e})"
  return None


class Checkpointer:
  """Orbax CheckpointManager for a training run: the train state, the data position and run
  metadata in one step directory; async saves; keeps the last `keep` and the best by `best`, an
  evaluation metric and "min" or "max" (`Task.best_metric`). `read_only` (inference) reads the step
  directories without a manager and moves nothing."""

  def __init__(
    self,
    directory: str | Path,
    *,
    keep: int = 3,
    async_save: bool = True,
    read_only: bool = False,
    best: tuple[str, str] = ("val_loss", "min"),
  ):
    import orbax.checkpoint as ocp

    self._ocp = ocp
    self.directory = Path(directory).absolute()
    self.best = best
    self.manager = None
    self.unreadable = {}  # step -> why
    for step in self._step_dirs():
      reason = unreadable_reason(self.directory / str(step))
      if reason:
        self.unreadable[step] = reason
    if read_only:
      for step, reason in self.unreadable.items():
        logging.warning("checkpoint step %d in %s is unreadable (%s); skipping it", step, self.directory, reason)
      return
    if self.unreadable and not self.steps():
      self._none_intact()
    for step, reason in sorted(self.unreadable.items()):
      self.set_aside(step, reason)  # the manager would fail on them, and a new save of that step too
    policies = ocp.checkpoint_managers
    name, mode = best
    # Sorted by the metric (descending for "min"), the last one kept is the best; a checkpoint saved
    # without that metric ranks last.
    worst = math.inf if mode == "min" else -math.inf
    metric = lambda m: m.get(name, worst)
    preservation = policies.AnyPreservationPolicy(
      [
        policies.LatestN(n=keep),
        policies.BestN(get_metric_fn=metric, reverse=mode == "min", n=1, keep_checkpoints_without_metrics=False),
      ]
    )
    options = ocp.CheckpointManagerOptions(
      preservation_policy=preservation,
      create=True,
      best_fn=metric,
      best_mode=mode,
      enable_async_checkpointing=async_save,
      cleanup_tmp_directories=True,
    )
    self.manager = ocp.CheckpointManager(
      self.directory,
      options=options,
      item_handlers={
        "state": ocp.StandardCheckpointHandler(),
        "data": ocp.JsonCheckpointHandler(),
        "meta": ocp.JsonCheckpointHandler(),
      },
    )
    self._saving: int | None = None  # the step of a save that may still be in flight

  def _step_dirs(self) -> list[int]:
    if not self.directory.is_dir():
      return []
    return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit() and p.is_dir())

  def steps(self) -> list[int]:
    """The intact steps, oldest first."""
    return [s for s in self._step_dirs() if s not in self.unreadable]

  def _none_intact(self):
    listed = "; ".join(f"step {s}: {why}" for s, why in sorted(self.unreadable.items()))
    raise CheckpointError(
      f"no checkpoint in {self.directory} can be read ({listed}). Move them out of the way "
      f"to train from scratch in this workdir, or use another --workdir"
    )

  def set_aside(self, step: int, reason: str) -> None:
    """Moves an unreadable step directory to <workdir>/unreadable_checkpoints/ (never deletes it)."""
    aside = self.directory.parent / UNREADABLE / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
    if jax.process_index() == 0:  # every process finds the same damage; one moves it
      aside.parent.mkdir(parents=True, exist_ok=True)
      os.rename(self.directory / str(step), aside)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"set aside checkpoint {step}")
    self.unreadable[step] = reason
    logging.warning("checkpoint step %d in %s is unreadable (%s); moved it to %s", step, self.directory, reason, aside)
    if self.manager is not None:
      self.manager.reload()

  def latest_step(self) -> int | None:
    steps = self.steps()
    return steps[-1] if steps else None

  def best_step(self) -> int | None:
    """The intact step with the best `self.best` metric (None if none was saved with it)."""
    name, mode = self.best
    values = {}
    for step in self.steps():
      path = self.directory / str(step) / "metrics" / "metrics"
      if path.exists() and name in (saved := json.loads(path.read_text())):
        values[step] = saved[name]
    if not values:
      return None
    return (min if mode == "min" else max)(values, key=values.get)

  def save(
    self, step: int, state, data_state: dict, meta: dict, metrics: dict | None = None, force: bool = False
  ) -> None:
    """`metrics`: the evaluation of this step (those that are finite numbers are kept with it)."""
    ocp = self._ocp
    metrics = {
      k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float)) and math.isfinite(v)
    } or None
    with self._writing(step):
      self.manager.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state), meta=ocp.args.JsonSave(meta)
        ),
        metrics=metrics,
        force=force,
      )
    self._saving = step

  @contextlib.contextmanager
  def _writing(self, step: int):
    """A failed write (a full disk, no permission) -> one WorkdirError; the earlier checkpoints stay."""
    try:
      yield
    except CheckpointError:
      raise
    except Exception as e:  # from tensorstore, Orbax's threads or the OS, each in its own type
      failed = self._saving if self._saving is not None else step
      intact = [s for s in self.steps() if s != failed]
      cause = str(e) if len(str(e)) < 200 else "... " + str(e).rsplit(": ", 1)[-1]  # the OS's words end it
      # Orbax's other write futures fail alike and asyncio would log each at exit: this error says it.
      logging_std.getLogger("asyncio").setLevel(logging_std.CRITICAL)
      raise WorkdirError(
        f"could not write checkpoint step {failed} to {self.directory}: {cause}. Free space or "
        f"fix the permissions of the workdir; the checkpoints written before it ({intact or 'none'}) "
        f"are intact, and launching again resumes from the latest"
      ) from None

  def check_step(self, step: int) -> None:
    if step in self.unreadable:
      raise CheckpointError(
        f"checkpoint step {step} in {self.directory} is unreadable ({self.unreadable[step]}); "
        f"the intact steps are {self.steps() or 'none'}"
      )
    if step not in self.steps():
      raise CheckpointError(f"no checkpoint for step {step} in {self.directory}; it has steps {self.steps() or 'none'}")

  def check_shapes(self, step: int, abstract_params) -> None:
    """Compares the saved params with those the config makes; names the first mismatching one."""
    saved = self._ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / "state")
    want, have = flat_params(abstract_params), flat_params(saved["params"])
    kind, key = first_mismatch(want, have) or (None, None)
    if kind == "missing":
      raise CheckpointError(
        f"checkpoint step {step} in {self.directory} has no '{key}'; it was written by "
        f"a different model config (start a new workdir or restore the old config)"
      )
    if kind == "shape":
      raise CheckpointError(
        f"checkpoint step {step} in {self.directory}: '{key}' has shape "
        f"{tuple(have[key].shape)} but the config makes {tuple(want[key].shape)}; the "
        f"model config changed since it was saved (use another workdir or the old config)"
      )
    if kind == "extra":
      raise CheckpointError(
        f"checkpoint step {step} in {self.directory} has '{key}', which the config's "
        f"model does not; it was written by a different model config"
      )

  def restore(self, step: int, abstract_state):
    ocp = self._ocp
    self.check_step(step)
    self.check_shapes(step, abstract_state.params)
    restored = self.manager.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()
      ),
    )
    return restored["state"], restored["data"], restored["meta"]

  def restore_latest(self, abstract_state):
    """(step, state, data position, meta) of the newest checkpoint that can be read, or None when
    there are none. Unreadable ones on the way are moved aside; a checkpoint of another model
    (CheckpointError) is not damage, and stops here."""
    for step in reversed(self.steps()):
      try:
        return (step, *self.restore(step, abstract_state))
      except CheckpointError:
        raise
      except Exception as e:  # torn array data: tensorstore, Orbax and json each raise their own
        if step == self.steps()[0]:
          self.unreadable[step] = f"{type(e).__name__}: {str(e)[:200]}"
          self._none_intact()
        self.set_aside(step, f"{type(e).__name__}: {str(e)[:200]}")
    return None

  def restore_params(self, step: int, abstract_params):
    """The params alone (no optimizer state is read): for sampling and evaluation. `abstract_params`
    are ShapeDtypeStructs whose shardings say where each restored array goes."""
    ocp = self._ocp
    self.check_step(step)
    self.check_shapes(step, abstract_params)
    target = {"params": abstract_params}
    try:
      restored = ocp.PyTreeCheckpointer().restore(
        self.directory / str(step) / "state",
        args=ocp.args.PyTreeRestore(
          item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
        ),
      )
    except Exception as e:  # torn array data
      self.unreadable[step] = f"{type(e).__name__}: {str(e)[:200]}"
      self.check_step(step)  # raises, naming it
    return restored["params"]

  def average_params(self, steps: list[int], abstract_params):
    """The element-wise mean of the params of checkpoints `steps` (checkpoint averaging, as in the
    paper's section 6.1: the last 5 or 20 checkpoints), read one at a time."""
    if not steps:
      raise CheckpointError(f"no checkpoints to average in {self.directory}")
    total = None
    for step in steps:
      params = self.restore_params(step, abstract_params)
      total = params if total is None else jax.tree.map(lambda a, b: a + b, total, params)
    return jax.tree.map(lambda a: (a / len(steps)).astype(a.dtype), total)

  def steps_to_average(self, last: int, count: int) -> list[int]:
    """The `count` intact steps up to and including `last`, oldest first; an error naming what is
    kept when there are fewer."""
    steps = [s for s in self.steps() if s <= last][-count:]
    if len(steps) < count:
      raise CheckpointError(
        f"averaging {count} checkpoints up to step {last} needs {count}, but {self.directory} "
        f"keeps {steps or 'none'} up to it; average fewer, or train with a larger "
        f"--config.keep_checkpoints"
      )
    return steps

  def wait(self) -> None:
    if self.manager is not None:
      with self._writing(self._saving):
        self.manager.wait_until_finished()

  def close(self) -> None:
    if self.manager is not None:
      self.wait()
      self.manager.close()


def _as_dict(tree) -> dict:
  """A state pytree (dataclasses, optax states, tuples) as nested dicts keyed by path names."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  keys = lambda path: tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
  return flax.traverse_util.unflatten_dict({keys(path): leaf for path, leaf in flat})


def flat_params(tree) -> dict:
  """A parameter tree as {"a/b/kernel": leaf}: the names the shape checks report."""
  return flax.traverse_util.flatten_dict(_as_dict(tree), sep="/")


def first_mismatch(want: dict, have: dict, extra: bool = True) -> tuple[str, str] | None:
  """How two flat parameter trees (`flat_params`; leaves with a shape) first differ, in `want`'s
  order: ("missing", name) for a tensor `have` lacks, ("shape", name) for one shaped otherwise, then,
  with `extra`, ("extra", name) for one only `have` has. None where every name and shape agree."""
  for name, leaf in want.items():
    if name not in have:
      return "missing", name
    if tuple(have[name].shape) != tuple(leaf.shape):
      return "shape", name
  extras = sorted(set(have) - set(want)) if extra else []
  return ("extra", extras[0]) if extras else None
