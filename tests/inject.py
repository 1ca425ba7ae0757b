"""Runs `launch.train` in this process with one fault injected at an exact point, for tests/test_faults.py.

  python tests/inject.py --kill_at_commit=20 -- --config=experiments/shakespeare.py:tiny --workdir=...

  --kill_at_commit=N   SIGKILL this process when Orbax is about to commit checkpoint step N: its files
                       are written into a temporary directory that is not yet renamed to N/.
  --nan_at_steps=7,8   the loss of those steps (counted from 1) is NaN, as a bad batch would make it.
  --max_file_bytes=N   no file may grow beyond N bytes (RLIMIT_FSIZE): writes fail with EFBIG, as on
                       a full disk.
  --sigterm_in_evaluation=N   SIGTERM this process as its N-th evaluation (counted from 1) begins: the
                       signal lands inside the evaluation however short it is.

The faults are real (a real SIGKILL, a real NaN through the compiled step, real failed writes); only
their timing is chosen, which a test cannot do from outside the process.
"""

import os
import resource
import runpy
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def kill_at_commit(step: str) -> None:
  from orbax.checkpoint._src.path import atomicity

  finalize = atomicity.AtomicRenameTemporaryPath.finalize

  async def finalize_or_die(self, *args, **kwargs):
    if self._final_path.name == step:
      os.kill(os.getpid(), signal.SIGKILL)
    return await finalize(self, *args, **kwargs)

  atomicity.AtomicRenameTemporaryPath.finalize = finalize_or_die


def nan_at_steps(steps: str) -> None:
  import jax.numpy as jnp

  from transformer import train

  bad = jnp.array([int(s) for s in steps.split(",")])
  train_step = train.train_step

  def poisoned(state, batch, *, loss_fn, **kwargs):
    def loss(params, batch, rng, is_training):
      loss_sum, tokens = loss_fn(params, batch, rng, is_training)
      return jnp.where(jnp.isin(state.step + 1, bad), jnp.nan, loss_sum), tokens

    return train_step(state, batch, loss_fn=loss, **kwargs)

  train.train_step = poisoned


def max_file_bytes(limit: str) -> None:
  resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), int(limit)))  # Python ignores SIGXFSZ: EFBIG


def sigterm_in_evaluation(n: str) -> None:
  from transformer.tasks import base

  evaluate, calls = base.Task.evaluate, []

  def evaluate_after_sigterm(self, *args, **kwargs):
    calls.append(None)
    if len(calls) == int(n):
      os.kill(os.getpid(), signal.SIGTERM)
    return evaluate(self, *args, **kwargs)

  base.Task.evaluate = evaluate_after_sigterm


FAULTS = {
  "--kill_at_commit": kill_at_commit,
  "--nan_at_steps": nan_at_steps,
  "--max_file_bytes": max_file_bytes,
  "--sigterm_in_evaluation": sigterm_in_evaluation,
}

if __name__ == "__main__":
  split = sys.argv.index("--")
  for arg in sys.argv[1:split]:
    name, _, value = arg.partition("=")
    FAULTS[name](value)
  sys.argv = ["launch.train", *sys.argv[split + 1 :]]
  runpy.run_module("launch.train", run_name="__main__", alter_sys=True)
