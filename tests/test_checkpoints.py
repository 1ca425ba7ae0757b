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
    ckpt.save(step, _state(value=step), {"next_index": step}, {"tokens": step}, val_loss=val)
  ckpt.wait()
  kept = sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit())
  assert kept == [2, 5, 6]  # the best (val 1.0) plus the last two
  assert ckpt.best_step() == 2 and ckpt.latest_step() == 6
  state, data_state, meta = ckpt.restore(2, _state())
  assert data_state == {"next_index": 2} and meta == {"tokens": 2}
  np.testing.assert_array_equal(state.params["dense"]["kernel"], np.full((4, 3), 2.0))
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
