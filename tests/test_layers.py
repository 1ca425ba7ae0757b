"""The shared layers (transformer.layers): positions, masks, attention, the decode-mode cache
positions; the model tests (test_gpt, test_seq2seq) cover blocks and stacks through the models."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer import layers


def test_sinusoidal_positions_formula():
  pe = layers.sinusoidal_positions(50, 16)
  chex.assert_shape(pe, (50, 16))
  pos, i = 7, 3
  assert np.isclose(pe[pos, 2 * i], np.sin(pos / 10000 ** (2 * i / 16)))
  assert np.isclose(pe[pos, 2 * i + 1], np.cos(pos / 10000 ** (2 * i / 16)))


def test_causal_mask():
  mask = layers.causal_mask(4)
  chex.assert_shape(mask, (1, 4, 4))
  np.testing.assert_array_equal(mask[0], np.tril(np.ones((4, 4), bool)))
  np.testing.assert_array_equal(layers.causal_mask(2, 5)[0], [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])


def _qkv(B=2, T=5, S=7, H=3, K=8, seed=0):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(kq, (B, T, H, K)), jax.random.normal(kk, (B, S, H, K)),
          jax.random.normal(kv, (B, S, H, K)))


class AttendTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_implementations_agree_and_masked_keys_do_not_count(self):
    q, k, v = _qkv()
    mask_BxTxS = jnp.ones((2, 5, 7), bool).at[:, :, 4:].set(False)
    out = {impl: self.variant(lambda q, k, v, m, impl=impl: layers.attend(q, k, v, m, impl))(q, k, v, mask_BxTxS)
           for impl in ("einsum", "xla")}
    chex.assert_shape(out["einsum"], (2, 5, 3, 8))
    chex.assert_tree_all_finite(out)
    np.testing.assert_allclose(out["xla"], out["einsum"], atol=1e-5)
    # The masked keys carry no weight: changing their values changes nothing.
    changed = layers.attend(q, k.at[:, 4:].set(9.0), v.at[:, 4:].set(-9.0), mask_BxTxS, "einsum")
    np.testing.assert_allclose(changed, out["einsum"], atol=1e-6)


def test_cache_positions_count_real_tokens_only():
  """Left-padded prompts in decode mode: padding takes no position and no query sees it."""
  module = layers.CachePositions()
  valid_BxT = jnp.array([[False, False, True, True], [True, True, True, True]])
  variables = module.init(jax.random.key(0), jnp.ones((2, 6), bool))  # a cache of 6 slots
  (positions_BxT, mask_BxTxS), variables = module.apply(variables, valid_BxT, mutable=["cache"])
  np.testing.assert_array_equal(positions_BxT, [[0, 0, 0, 1], [0, 1, 2, 3]])
  chex.assert_shape(mask_BxTxS, (2, 4, 6))
  np.testing.assert_array_equal(mask_BxTxS[0, 3], [False, False, True, True, False, False])
  # The next token: position = real tokens so far, and it sees every real slot and itself.
  (positions_BxT, mask_BxTxS), _ = module.apply(variables, jnp.ones((2, 1), bool), mutable=["cache"])
  np.testing.assert_array_equal(positions_BxT, [[2], [4]])
  np.testing.assert_array_equal(mask_BxTxS[0, 0], [False, False, True, True, True, False])


def test_projection_keeps_its_kernel_shape_and_axis_names():
  proj = layers.Projection((3, 4), ("embed", "heads", "kv"))
  boxed = proj.init(jax.random.key(0), jnp.ones((2, 5)))["params"]
  assert boxed["kernel"].names == ("embed", "heads", "kv")
  chex.assert_shape(nn.unbox(boxed)["kernel"], (5, 3, 4))
  chex.assert_shape(proj.apply({"params": nn.unbox(boxed)}, jnp.ones((2, 5))), (2, 3, 4))
