"""A draw from softmax(logits) per row by a two-level inverse CDF (config.model.kernels: the CPU's and
the accelerators' forms; the reference is `generation.sampling.inverse_cdf`, one cumulative sum over
the whole vocabulary). Both take one uniform number u in [0, 1) a row and return the first token
whose cumulative probability exceeds u, so they draw the same tokens (tests/test_kernels.py).

One random number a row, where Gumbel noise (jax's `categorical`) needs one per vocabulary entry: on a
CPU, threefry's bits for 32 x 50,257 entries took most of a decoding step. In two levels, so that no
cumulative sum runs over the whole vocabulary: the weights exp(logits - max) summed in blocks of
`block` entries, the block where the cumulative weight passes u * total, then the entry inside it. A
token of weight 0 (excluded by top-k or top-p) is never drawn, also where float rounding puts
u * total on a block's or an entry's edge.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

BLOCK = 256  # entries of the vocabulary per block of the first level


def inverse_cdf(logits_BxV: jax.Array, u_B: jax.Array, block: int = BLOCK) -> jax.Array:
  """The first token of each row whose cumulative probability exceeds u_B, int32."""
  B, V = logits_BxV.shape
  C = min(block, V)
  N = -(-V // C)
  w_BxV = jnp.exp(logits_BxV - jnp.max(logits_BxV, axis=-1, keepdims=True))  # -inf -> 0; the max -> 1
  w_BxNxC = jnp.pad(w_BxV, ((0, 0), (0, N * C - V))).reshape(B, N, C)
  block_BxN = w_BxNxC.sum(axis=-1)
  cum_BxN = jnp.cumsum(block_BxN, axis=-1)
  target_B = u_B * cum_BxN[:, -1]
  # The first block whose cumulative weight exceeds the target has weight > 0; rounding may put the
  # count past the last such block (or the target below the first entry): hence the clip.
  j_B = clip_to_nonzero(jnp.sum(cum_BxN <= target_B[:, None], axis=-1), block_BxN)
  take = lambda x, i: jnp.take_along_axis(x, i[:, None], axis=1)[:, 0]
  w_BxC = jnp.take_along_axis(w_BxNxC, j_B[:, None, None], axis=1)[:, 0]
  rest_B = target_B - (take(cum_BxN, j_B) - take(block_BxN, j_B))
  k_B = clip_to_nonzero(jnp.sum(jnp.cumsum(w_BxC, axis=-1) <= rest_B[:, None], axis=-1), w_BxC)
  return (j_B * C + k_B).astype(jnp.int32)


def clip_to_nonzero(index_B: jax.Array, weights_BxN: jax.Array) -> jax.Array:
  """index_B clipped to the span between each row's first and last entry of positive weight."""
  positive_BxN = weights_BxN > 0
  N = weights_BxN.shape[-1]
  first_B = jnp.argmax(positive_BxN, axis=-1)
  last_B = N - 1 - jnp.argmax(positive_BxN[:, ::-1], axis=-1)
  return jnp.clip(index_B, first_B, last_B)
