"""Greedy decoding's argmax over the vocabulary in the forms XLA:CPU runs fastest (config.model.kernels:
the CPU's forms; the reference is `jnp.argmax`). Every form returns jnp.argmax's index, the first
index of the maximum (tests/test_kernels.py).

For several rows it is a max and then a min over the indices that reach it, for a large vocabulary by
blocks (`block_size`): XLA:CPU's own argmax (a variadic reduce) was several times slower there, a
third of a decoding step at a 50k vocabulary. For one row jnp.argmax fuses well with the head's
matrix-vector product and the max+min does not. By blocks of C entries: the blocks' maxima (the one
pass over x), the first block that holds the maximum, then the first entry of that block that
equals it; the maximum over all of x and then the first index that holds it took two more passes
over x (a select, a reduction).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# From this vocabulary size the argmax reduces in blocks (and a batch split over a CPU's cores gets
# larger parts: kernels.decode_threads).
LARGE_VOCAB = 4096


def argmax(x_BxV: jax.Array, vocab_major: bool = False) -> jax.Array:
  """jnp.argmax(x_BxV, axis=-1) as int32. `vocab_major`: x_BxV is the transpose of a V x B array
  (kernels.decode_head): the reductions then run down its columns, the two transposes cancelling."""
  if x_BxV.shape[0] == 1:
    return jnp.argmax(x_BxV, axis=-1).astype(jnp.int32)
  if vocab_major:
    return first_max_index(x_BxV.T, axis=0)
  return first_max_index(x_BxV, axis=1)


def first_max_index(x: jax.Array, axis: int) -> jax.Array:
  """The first index of the maximum along `axis` (0 or 1 of a 2-d array), flattened."""
  V = x.shape[axis]
  # Indices as float32 (exact below 2^24) keep both reductions floating-point maxima and minima,
  # which XLA:CPU vectorises down columns; int32 otherwise.
  dtype = jnp.float32 if V < 2**24 else jnp.int32
  C = block_size(V)
  if C is None:
    return _first_index(x == jnp.max(x, axis=axis, keepdims=True), axis, dtype).reshape(-1)
  blocks, entries = axis, axis + 1  # V x B -> N x C x B; B x V -> B x N x C
  x = x.reshape(x.shape[:axis] + (V // C, C) + x.shape[axis + 1 :])
  max_blocks = jnp.max(x, axis=entries, keepdims=True)
  max_all = jnp.max(max_blocks, axis=blocks, keepdims=True)
  block = _first_index(max_blocks == max_all, blocks, dtype)
  entry = _first_index(jnp.take_along_axis(x, block, axis=blocks) == max_all, entries, dtype)
  return (block * C + entry).reshape(-1)


def _first_index(hits: jax.Array, axis: int, dtype) -> jax.Array:
  """The first index along `axis` that is True (the last index where none is), kept as a size-1 axis."""
  n = hits.shape[axis]
  index = jnp.min(jnp.where(hits, jax.lax.broadcasted_iota(dtype, hits.shape, axis), n - 1), axis=axis, keepdims=True)
  return index.astype(jnp.int32)


def block_size(V: int) -> int | None:
  """The block size of `argmax` over V entries (None: no blocks): for a large vocabulary, the divisor
  of V nearest sqrt(V) that leaves at least 16 blocks of at least 16 (GPT-2's 50,257 = 1,733 x 29:
  blocks of 29); none for a V with no such divisor, e.g. a prime."""
  if V < LARGE_VOCAB:
    return None
  divisors = [c for c in range(16, V // 16 + 1) if V % c == 0]
  return min(divisors, key=lambda c: abs(math.log(c / math.sqrt(V))), default=None)
