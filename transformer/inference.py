"""A trained model restored from a training workdir, for sampling, translation and evaluation: the
params of one checkpoint (no optimizer state), the tokenizer, and the task that says what the model
is, on this machine's devices.

    >>> trained = restore("workdirs/shakespeare-char", step="best")
    >>> sampling.generate(trained.model, trained.params, ...)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from transformer import checkpoints, sharding, tasks
from transformer.config import MeshConfig, RunConfig, resolve
from transformer.errors import CheckpointError, ConfigError
from transformer.tokenizers import load_tokenizer


@dataclasses.dataclass
class Trained:
  """What a workdir's checkpoint gives for inference."""
  task: tasks.Task  # task.model, task.model_config
  params: Any
  tokenizer: Any
  mesh: jax.sharding.Mesh
  step: int
  run: RunConfig

  @property
  def model(self):
    return self.task.model

  @property
  def rules(self) -> tuple:
    return self.run.mesh.rules


def _fitted_mesh(mesh: MeshConfig) -> MeshConfig:
  """The run's mesh on this machine's devices, or plain data parallelism over them when it was
  trained on another number of devices."""
  try:
    return mesh.fitted(jax.device_count())
  except ConfigError:
    return MeshConfig(logical_axis_rules=mesh.rules).fitted(jax.device_count())


def restore(workdir: str | Path, step: str | int = "latest", task: str | None = None) -> Trained:
  """The params of a workdir's checkpoint `step` ("latest", "best" by validation loss, or a number),
  sharded over this machine's devices with the run's logical axis rules. `task` (a config.task
  name), when given, is what the caller can use: another one is an error naming the program that
  can."""
  workdir = Path(workdir)
  files = {"config": workdir / "config.json", "tokenizer": workdir / "tokenizer",
           "checkpoints": workdir / "checkpoints"}
  missing = [str(p) for p in files.values() if not p.exists()]
  if missing:
    raise CheckpointError(f"{workdir} is not a training workdir: looked for {', '.join(missing)} "
                          f"(launch.train writes them); check the --workdir path")
  run = resolve(ml_collections.ConfigDict(json.loads(files["config"].read_text())))
  if task is not None and run.task != task:
    raise CheckpointError(f"{workdir} holds a {run.task!r} model, not a {task!r} one; use python -m "
                          f"{tasks.get(run.task).program}")
  run = dataclasses.replace(run, mesh=_fitted_mesh(run.mesh))
  mesh = sharding.make_mesh(run.mesh.shape)
  trained_task = tasks.get(run.task)(run, load_tokenizer(files["tokenizer"]), mesh)
  boxed, param_sh = sharding.param_shardings(trained_task.model, trained_task.init_inputs(), mesh, run.mesh.rules)
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), nn.unbox(boxed), param_sh)
  ckpt = checkpoints.Checkpointer(files["checkpoints"], async_save=False)
  try:
    if step in ("latest", "best"):
      chosen = ckpt.latest_step() if step == "latest" else ckpt.best_step()
    elif str(step).isdigit():
      chosen = int(step)
    else:
      raise CheckpointError(f"step must be 'latest', 'best' or a step number, got {step!r}")
    if chosen is None:
      what = "checkpoints" if step == "latest" else "checkpoint with a validation loss"
      raise CheckpointError(f"no {what} in {files['checkpoints']}; train longer or pass --step")
    params = ckpt.restore_params(chosen, abstract)
  finally:
    ckpt.close()
  return Trained(trained_task, params, trained_task.tokenizer, mesh, chosen, run)
