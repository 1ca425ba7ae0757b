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


def rotary_frequencies(rotary_config, head_dim: int, local: bool = False) -> tuple[np.ndarray, float]:
  """(inverse frequencies of the R/2 rotated channel pairs, the factor on cos and sin) of a
  `layers.RotaryConfig` for heads of `head_dim` channels (R = its `fraction` of them), as the released
  checkpoints compute them (transformers' modeling_rope_utils): theta^(-2i/R), divided by `factor`
  ("linear"), its low frequencies alone with a smooth band between ("llama3"), or YaRN's ramp between
  interpolated and extrapolated frequencies ("yarn"). A local (sliding-window) layer with its own
  `local_theta` is unscaled (Gemma 3)."""
  r = rotary_config
  R = int(head_dim * r.fraction)
  theta = r.local_theta if local and r.local_theta else r.theta
  inv_freq = 1.0 / theta ** (np.arange(0, R, 2, dtype=np.float64) / R)
  scaling = "none" if local and r.local_theta else r.scaling
  if scaling == "linear":
    return inv_freq / r.factor, 1.0
  if scaling == "llama3":
    low_wavelen, high_wavelen = r.original_max_len / r.low_freq_factor, r.original_max_len / r.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq)
    smooth = (r.original_max_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor)
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, (1 - smooth) * scaled / r.factor + smooth * scaled, scaled), 1.0
  if scaling == "yarn":
    return _yarn(inv_freq, r, R, theta)
  return inv_freq, 1.0


def _yarn(inv_freq: np.ndarray, r, R: int, theta: float) -> tuple[np.ndarray, float]:
  """YaRN (Peng et al. 2023) as transformers computes it: the channels that turn fewer than
  `beta_slow` times over the trained context interpolated (divided by `factor`), those that turn more
  than `beta_fast` times kept, a linear ramp between; cos and sin scaled by 0.1 ln(factor) + 1."""
  corrections = [
    R * math.log(r.original_max_len / (turns * 2 * math.pi)) / (2 * math.log(theta))
    for turns in (r.beta_fast, r.beta_slow)
  ]
  low, high = max(math.floor(corrections[0]), 0), min(math.ceil(corrections[1]), R - 1)
  ramp = np.clip((np.arange(R // 2) - low) / ((high - low) or 0.001), 0, 1)
  kept = 1 - ramp
  attention_factor = r.attention_factor or (0.1 * math.log(r.factor) + 1.0 if r.factor > 1 else 1.0)
  return inv_freq / r.factor * (1 - kept) + inv_freq * kept, attention_factor


def rotary(
  x_BxTxHxK: jax.Array,
  positions_BxT: jax.Array,
  base: float = 10000.0,
  *,
  frequencies: tuple[np.ndarray, float] | None = None,
  layout: str = "halves",
) -> jax.Array:
  """Rotary position embedding (Su et al. 2021, "RoFormer"): channel pairs of every head rotated by the
  angle position * frequency, so that a query-key product depends on the two positions only through
  their distance. `frequencies`: (inverse frequencies, factor on cos and sin) from `rotary_frequencies`
  (default: base^(-2i/K) over all K channels); the channels past the rotated ones pass unchanged
  (GPT-NeoX's partial rotary). Pairs are channels i and i + R/2 ("halves") or 2i and 2i + 1
  ("interleaved", GPT-J). Computed in float32; the result in x's dtype."""
  K = x_BxTxHxK.shape[-1]
  if frequencies is None:
    inv_freq, factor = base ** (-jnp.arange(0, K, 2, dtype=jnp.float32) / K), 1.0
  else:
    inv_freq, factor = jnp.asarray(frequencies[0], jnp.float32), frequencies[1]
  R = 2 * inv_freq.shape[0]
  angles_BxTx1xR2 = (positions_BxT.astype(jnp.float32)[..., None] * inv_freq)[:, :, None]
  sin, cos = jnp.sin(angles_BxTx1xR2), jnp.cos(angles_BxTx1xR2)
  if factor != 1.0:
    sin, cos = sin * factor, cos * factor
  x = x_BxTxHxK.astype(jnp.float32)
  rotated = x if R == K else x[..., :R]
  if layout == "interleaved":
    x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
    turned = jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).reshape(rotated.shape)
  else:
    x1, x2 = jnp.split(rotated, 2, axis=-1)
    turned = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  out = turned if R == K else jnp.concatenate([turned, x[..., R:]], axis=-1)
  return out.astype(x_BxTxHxK.dtype)


def rotated(rotary_config, x_BxTxHxK: jax.Array, positions_BxT: jax.Array, local) -> jax.Array:
  """`rotary` as a block's `layers.RotaryConfig` sets it (`local`: a sliding-window layer, which may have
  its own base; a traced bool in a scanned mix of local and global layers, which rotates both ways and
  keeps its own); GPT's default config runs the default form."""
  if rotary_config == type(rotary_config)():
    return rotary(x_BxTxHxK, positions_BxT)
  K, layout = x_BxTxHxK.shape[-1], rotary_config.layout
  turn = lambda kind: rotary(
    x_BxTxHxK, positions_BxT, frequencies=rotary_frequencies(rotary_config, K, kind), layout=layout
  )
  if not rotary_config.local_theta or local is False:
    return turn(False)
  return turn(True) if local is True else jnp.where(local, turn(True), turn(False))


def causal_mask(length_q: int, length_k: int | None = None) -> jax.Array:
  """True where query t may attend to key s (s <= t), shape (1, T, S)."""
  length_k = length_q if length_k is None else length_k
  return (jnp.arange(length_k)[None, :] <= jnp.arange(length_q)[:, None])[None]


def window_mask(mask_BxTxS, q_positions_BxT, k_positions_BxS, window: int, local=True) -> jax.Array:
  """`mask_BxTxS` (None: causal) narrowed to a sliding window: a query sees the keys less than `window`
  positions before it, itself included (Mistral's and Gemma's local layers; transformers' sliding
  window). By positions, not slots: a packed document's or a padded row's window counts its own tokens.
  `local`: a traced bool in a scanned mix of local and global layers (False: the mask as it is)."""
  T, S = q_positions_BxT.shape[1], k_positions_BxS.shape[1]
  near_BxTxS = (q_positions_BxT[:, :, None] - k_positions_BxS[:, None, :]) < window
  if local is not True:
    near_BxTxS = near_BxTxS | jnp.logical_not(local)
  return (causal_mask(T, S) if mask_BxTxS is None else mask_BxTxS) & near_BxTxS


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
