"""The KV cache of decoding: where a new token's positions and mask come from (`CachePositions`), and
how a self-attention layer writes its keys and values (`write`) in the layouts the products read.
Its variables live in the "cache" collection; its length is that of the input `init` sees."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

# A KV cache's layouts, as logical axis names (sharded like the activations that fill it). A call
# writes B x T x H x K arrays, transposed into them. Keys: positions last, so that a new token's scores
# run along contiguous rows; values: positions third, so that a step writes K contiguous numbers per
# head instead of K numbers S apart. (With B x S x H x K, XLA:CPU copied the whole cache every step.)
CACHE_LAYOUTS = {"key": ("batch", "heads", "kv", "length"), "value": ("batch", "heads", "length", "kv")}
_WRITTEN_AXES = ("batch", "length", "heads", "kv")


class CachePositions(nn.Module):
  """Decode mode (a KV cache, `SelfAttention(decode=True)`): the positions of the T new tokens,
  which of the cache's S slots each may attend to (those written so far that hold real tokens, and
  itself), and the position of the token in every slot (a synthesizer's scores are by position).

  The cache remembers, per slot, whether it holds a real token (valid_BxT; False for padding), and
  per sequence how many real tokens it has seen: a token's position is that count, whatever padding
  came before it. The cache's length S is that of the input `init` sees."""

  @nn.compact
  def __call__(self, valid_BxT):
    B, T = valid_BxT.shape
    initialising = not self.has_variable("cache", "valid")  # `init` sizes the cache: T is its length
    valid = self.variable("cache", "valid", jnp.zeros, (B, T), bool)
    count = self.variable("cache", "count", jnp.zeros, (B,), jnp.int32)
    index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    slot_positions = self.variable("cache", "positions", jnp.zeros, (B, T), jnp.int32)
    positions_BxT = jnp.maximum(count.value[:, None] + jnp.cumsum(valid_BxT, axis=1) - 1, 0)
    slots_T = index.value + jnp.arange(T)
    if not initialising:
      valid.value = jax.lax.dynamic_update_slice_in_dim(valid.value, valid_BxT, index.value, axis=1)
      slot_positions.value = jax.lax.dynamic_update_slice_in_dim(
        slot_positions.value, positions_BxT, index.value, axis=1
      )
      count.value = count.value + valid_BxT.sum(axis=1, dtype=jnp.int32)
      index.value = index.value + T
    slots_S = jnp.arange(valid.value.shape[1])
    earlier_TxS = slots_S[None, :] <= slots_T[:, None]
    itself_TxS = slots_S[None, :] == slots_T[:, None]
    mask_BxTxS = earlier_TxS[None] & (valid.value[:, None, :] | itself_TxS[None])
    return positions_BxT, mask_BxTxS, slot_positions.value if not initialising else positions_BxT


def write(module: nn.Module, **arrays_BxTxHxK):
  """Writes a call's T keys and/or values (B x T x H x K each) into `module`'s cache at its index;
  returns the whole cache by name, in the layouts CACHE_LAYOUTS gives (those the products read, so
  that a step's write is its only copy of the cache). `init` only sizes the cache."""
  initialising = not module.has_variable("cache", "index")
  arrays = {
    name: x.transpose([_WRITTEN_AXES.index(axis) for axis in CACHE_LAYOUTS[name]]) for name, x in arrays_BxTxHxK.items()
  }
  cache = {name: module.variable("cache", name, jnp.zeros, x.shape, x.dtype) for name, x in arrays.items()}
  index = module.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
  if initialising:  # `init` only sizes the cache
    return arrays
  i = index.value
  for name, x in arrays.items():
    names = CACHE_LAYOUTS[name]
    written = jax.lax.dynamic_update_slice_in_dim(
      cache[name].value, x.astype(cache[name].value.dtype), i, axis=names.index("length")
    )
    cache[name].value = nn.with_logical_constraint(written, names)
  index.value = i + next(iter(arrays_BxTxHxK.values())).shape[1]
  return {name: variable.value for name, variable in cache.items()}


def repeat_kv(x, heads: int, axis: int):
  """Keys or values of G heads repeated for `heads` query heads (head h reads kv head h // (heads/G),
  transformers' repeat_kv): grouped-query attention as plain multi-head attention."""
  return x if x.shape[axis] == heads else jnp.repeat(x, heads // x.shape[axis], axis=axis)
