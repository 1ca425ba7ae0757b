"""Training checkpoints (Orbax): the train state, the data position and run metadata in one step
directory per save; async saves; the last `keep` plus the best by validation loss are kept.

Restoring checks every saved parameter's name and shape against what the config makes first, so a
changed model config fails with the parameter named instead of deep inside Orbax. (Hugging Face
GPT-2 weights are converted by `transformer.models.hf_gpt2`; a trained model for inference is
restored by `transformer.inference`.)
"""

from __future__ import annotations

from pathlib import Path

import flax.traverse_util
import jax

from transformer.errors import CheckpointError


class Checkpointer:
  """Orbax CheckpointManager for a training run: the train state, the data position and run
  metadata in one step directory; async saves; keeps the last `keep` and the best by val_loss."""

  def __init__(self, directory: str | Path, *, keep: int = 3, async_save: bool = True):
    import orbax.checkpoint as ocp
    self._ocp = ocp
    policies = ocp.checkpoint_managers
    preservation = policies.AnyPreservationPolicy([
        policies.LatestN(n=keep),
        # Sorted descending by val_loss, the last one kept is the lowest.
        policies.BestN(get_metric_fn=lambda m: m["val_loss"], reverse=True, n=1,
                       keep_checkpoints_without_metrics=False),
    ])
    options = ocp.CheckpointManagerOptions(preservation_policy=preservation, create=True,
                                           best_fn=lambda m: m["val_loss"], best_mode="min",
                                           enable_async_checkpointing=async_save,
                                           cleanup_tmp_directories=True)
    self.directory = Path(directory).absolute()
    self.manager = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
                       "meta": ocp.JsonCheckpointHandler()})

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def best_step(self) -> int | None:
    return self.manager.best_step()

  def save(self, step: int, state, data_state: dict, meta: dict, val_loss: float | None = None,
           force: bool = False) -> None:
    ocp = self._ocp
    metrics = {"val_loss": float(val_loss)} if val_loss is not None else None
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    data=ocp.args.JsonSave(data_state),
                                                    meta=ocp.args.JsonSave(meta)),
                      metrics=metrics, force=force)

  def check_step(self, step: int) -> None:
    steps = self.manager.all_steps()
    if step not in steps:
      raise CheckpointError(f"no checkpoint for step {step} in {self.directory}; it has steps "
                            f"{sorted(steps) or 'none'}")

  def check_shapes(self, step: int, abstract_params) -> None:
    """Compares the saved params with those the config makes; names the first mismatching one."""
    saved = self.manager.item_metadata(step)["state"]
    want = flax.traverse_util.flatten_dict(_as_dict(abstract_params), sep="/")
    have = flax.traverse_util.flatten_dict(_as_dict(saved["params"]), sep="/")
    for key, leaf in want.items():
      if key not in have:
        raise CheckpointError(f"checkpoint step {step} in {self.directory} has no '{key}'; it was written by "
                              f"a different model config (start a new workdir or restore the old config)")
      if tuple(have[key].shape) != tuple(leaf.shape):
        raise CheckpointError(f"checkpoint step {step} in {self.directory}: '{key}' has shape "
                              f"{tuple(have[key].shape)} but the config makes {tuple(leaf.shape)}; the "
                              f"model config changed since it was saved (use another workdir or the old config)")
    extra = sorted(set(have) - set(want))
    if extra:
      raise CheckpointError(f"checkpoint step {step} in {self.directory} has '{extra[0]}', which the config's "
                            f"model does not; it was written by a different model config")

  def restore(self, step: int, abstract_state):
    ocp = self._ocp
    self.check_step(step)
    self.check_shapes(step, abstract_state.params)
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore(),
        meta=ocp.args.JsonRestore()))
    return restored["state"], restored["data"], restored["meta"]

  def restore_params(self, step: int, abstract_params):
    """The params alone (no optimizer state is read): for sampling and evaluation. `abstract_params`
    are ShapeDtypeStructs whose shardings say where each restored array goes."""
    ocp = self._ocp
    self.check_step(step)
    self.check_shapes(step, abstract_params)
    target = {"params": abstract_params}
    restored = ocp.PyTreeCheckpointer().restore(
        self.directory / str(step) / "state",
        args=ocp.args.PyTreeRestore(item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                                    partial_restore=True))
    return restored["params"]

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def _as_dict(tree) -> dict:
  """A state pytree (dataclasses, optax states, tuples) as nested dicts keyed by path names."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  keys = lambda path: tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
  return flax.traverse_util.unflatten_dict({keys(path): leaf for path, leaf in flat})
