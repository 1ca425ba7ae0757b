"""Where each token is: sinusoidal and rotary positions, positions within packed segments, and the masks
that say which keys a query may attend to."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

SINUSOID_LAYOUTS = ("interleaved", "halves")


def sinusoidal_positions(length: int, d_model: int, layout: str = "interleaved") -> np.ndarray:
  """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)); shape (length, d).
  layout "halves": the same sines in channels [0, d/2) and cosines in [d/2, d), as Marian (OPUS-MT)
  and fairseq lay them out."""
  pos_Lx1 = np.arange(length, dtype=np.float64)[:, None]
  freq = np.exp(-math.log(10000.0) * np.arange(0, d_model, 2, dtype=np.float64) / d_model)
  sines, cosines = np.sin(pos_Lx1 * freq), np.cos(pos_Lx1 * freq)[:, : d_model // 2]
  pe_LxD = np.zeros((length, d_model), dtype=np.float32)
  if layout == "halves":
    pe_LxD[:, : sines.shape[1]], pe_LxD[:, sines.shape[1] :] = sines, cosines
  else:
    pe_LxD[:, 0::2], pe_LxD[:, 1::2] = sines, cosines
  return pe_LxD


def rotary(x_BxTxHxK: jax.Array, positions_BxT: jax.Array, base: float = 10000.0) -> jax.Array:
  """Rotary position embedding (Su et al. 2021, "RoFormer"): channels i and i + K/2 of every head
  rotated by the angle position * base^(-2i/K), so that a query-key product depends on the two
  positions only through their distance. Computed in float32; the result in x's dtype."""
  K = x_BxTxHxK.shape[-1]
  inv_freq = base ** (-jnp.arange(0, K, 2, dtype=jnp.float32) / K)
  angles_BxTx1xK2 = (positions_BxT.astype(jnp.float32)[..., None] * inv_freq)[:, :, None]
  sin, cos = jnp.sin(angles_BxTx1xK2), jnp.cos(angles_BxTx1xK2)
  x1, x2 = jnp.split(x_BxTxHxK.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x_BxTxHxK.dtype)


def causal_mask(length_q: int, length_k: int | None = None) -> jax.Array:
  """True where query t may attend to key s (s <= t), shape (1, T, S)."""
  length_k = length_q if length_k is None else length_k
  return (jnp.arange(length_k)[None, :] <= jnp.arange(length_q)[:, None])[None]


def segment_positions(valid_BxT: jax.Array | None, segments_BxT: jax.Array | None) -> jax.Array:
  """Each token's position: how many real tokens (valid_BxT; padding takes no position) come before
  it in its segment. Segments are runs of equal `segments_BxT` ids: the documents (or sentences)
  packed into one row, each of which starts again at position 0. Either may be None."""
  like = valid_BxT if valid_BxT is not None else segments_BxT
  real_BxT = jnp.ones(like.shape, jnp.int32) if valid_BxT is None else valid_BxT.astype(jnp.int32)
  seen_BxT = jnp.cumsum(real_BxT, axis=1)  # real tokens up to and including this one
  if segments_BxT is None:
    return jnp.maximum(seen_BxT - 1, 0)
  starts_BxT = jnp.concatenate(
    [jnp.ones_like(segments_BxT[:, :1], bool), segments_BxT[:, 1:] != segments_BxT[:, :-1]], axis=1
  )
  # Real tokens before the current segment began: carried forward from each segment's first token.
  before_BxT = jax.lax.cummax(jnp.where(starts_BxT, seen_BxT - real_BxT, 0), axis=1)
  return jnp.maximum(seen_BxT - before_BxT - 1, 0)


def self_attention_mask(valid_BxT: jax.Array | None, segments_BxT: jax.Array | None, *, causal: bool) -> jax.Array:
  """B x T x T, True where query t may attend to key s: a real key (valid) of the same segment, and,
  when `causal`, not after it. Every query may attend to itself, so that no softmax row is empty
  (a padding query's output is never used)."""
  like = valid_BxT if valid_BxT is not None else segments_BxT
  B, T = like.shape
  mask_BxTxT = jnp.ones((B, T, T), bool) if valid_BxT is None else jnp.broadcast_to(valid_BxT[:, None, :], (B, T, T))
  if segments_BxT is not None:
    mask_BxTxT = mask_BxTxT & (segments_BxT[:, :, None] == segments_BxT[:, None, :])
  if causal:
    mask_BxTxT = mask_BxTxT & causal_mask(T)
  return mask_BxTxT | jnp.eye(T, dtype=bool)[None]
