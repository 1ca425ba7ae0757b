import jax.numpy as jnp
import numpy as np
import pytest

from transformer.checkpoints import Checkpointer
from transformer.errors import CheckpointError
from transformer.train import TrainState


def _state(width=4, value=0.0):
  params = {"dense": {"kernel": jnp.full((width, 3), value), "bias": jnp.zeros(3)}}
  return TrainState(step=jnp.array(0), params=params, opt_state=(), rng=jnp.zeros(2, jnp.uint32))


def test_keeps_last_k_and_the_best(tmp_path):
  ckpt = Checkpointer(tmp_path, keep=2, async_save=False)
  for step, val in zip(range(1, 7), [3.0, 1.0, 2.0, 4.0, None, 5.0]):
    ckpt.save(
      step,
      _state(value=step),
      {"next_index": step},
      {"tokens": step},
      metrics=None if val is None else {"val_loss": val},
    )
  ckpt.wait()
  kept = sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit())
  assert kept == [2, 5, 6]  # the best (val 1.0) plus the last two
  assert ckpt.best_step() == 2 and ckpt.latest_step() == 6
  state, data_state, meta = ckpt.restore(2, _state())
  assert data_state == {"next_index": 2} and meta == {"tokens": 2}
  np.testing.assert_array_equal(state.params["dense"]["kernel"], np.full((4, 3), 2.0))
  ckpt.close()


def test_the_best_can_be_the_highest_of_a_task_metric(tmp_path):
  ckpt = Checkpointer(tmp_path, keep=1, async_save=False, best=("dev_bleu", "max"))
  for step, bleu in zip(range(1, 5), [2.0, 7.5, float("nan"), 3.0]):
    ckpt.save(step, _state(value=step), {}, {}, metrics={"val_loss": 1.0 / step, "dev_bleu": bleu})
  ckpt.wait()
  kept = sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit())
  assert kept == [2, 4] and ckpt.best_step() == 2  # not step 4, whose loss is lowest; NaN is never best
  ckpt.close()


def test_averaging_identical_checkpoints_gives_that_checkpoint_and_two_their_mean(tmp_path):
  ckpt = Checkpointer(tmp_path, keep=5, async_save=False)
  kernels = {1: np.arange(12.0).reshape(4, 3), 2: np.arange(12.0).reshape(4, 3), 3: np.full((4, 3), 7.0)}
  for step, kernel in kernels.items():
    state = _state()
    state = state.replace(params={"dense": {"kernel": jnp.asarray(kernel), "bias": jnp.full(3, float(step))}})
    ckpt.save(step, state, {}, {})
  ckpt.wait()
  abstract = _state().params
  same = ckpt.average_params([1, 2], abstract)
  np.testing.assert_array_equal(same["dense"]["kernel"], kernels[1])
  mean = ckpt.average_params(ckpt.steps_to_average(3, 2), abstract)  # steps 2 and 3
  np.testing.assert_allclose(mean["dense"]["kernel"], (kernels[2] + kernels[3]) / 2)
  np.testing.assert_allclose(mean["dense"]["bias"], np.full(3, 2.5))
  with pytest.raises(CheckpointError, match=r"averaging 4 checkpoints up to step 3 needs 4, but .* keeps \[1, 2, 3\]"):
    ckpt.steps_to_average(3, 4)
  ckpt.close()


def test_shape_mismatch_names_the_parameter(tmp_path):
  ckpt = Checkpointer(tmp_path, keep=1, async_save=False)
  ckpt.save(1, _state(width=4), {}, {})
  ckpt.wait()
  with pytest.raises(CheckpointError, match=r"'dense/kernel' has shape \(4, 3\) but the config makes \(5, 3\)"):
    ckpt.restore(1, _state(width=5))
  other = _state()
  other = other.replace(params={**other.params, "extra": {"kernel": jnp.zeros(2)}})
  with pytest.raises(CheckpointError, match="has no 'extra/kernel'"):
    ckpt.restore(1, other)
  ckpt.close()
