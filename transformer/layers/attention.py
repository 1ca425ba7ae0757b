"""Attention: softmax(scores) V over the keys a mask allows (`mix`), by dot products with their fused
forms (`attend`, `attend_cached`), and the two attention modules: self-attention, whose scores a
mechanism makes (transformer.layers.mechanisms), and cross-attention from the decoder to the encoder."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import kernels
from transformer.layers import heads, kv_cache
from transformer.layers.config import BlockConfig
from transformer.layers.mechanisms import MECHANISMS, dot_product_scores
from transformer.layers.params import projections, qk_normalised
from transformer.layers.points import point, points_of
from transformer.layers.positions import causal_mask, rotated, window_mask


def mix(
  scores_BxHxTxS,
  v_BxSxHxK,
  mask_BxTxS,
  dropout: nn.Dropout | None = None,
  deterministic: bool = True,
  points=None,
  values: str = "bshk",
  softcap: float = 0.0,
) -> jax.Array:
  """softmax(scores) V over the keys that `mask` allows (True = attend; None: causal), however the
  scores were made. Scores in float32; masking by jnp.where, never by adding a large negative number
  (which overflows in half precision). `points(name, x) -> x`, when given, is the attention module's
  named points (`point`): the masked scores, "attn_scores", and the probabilities, "pattern", pass
  through it.
  `values`: the layout of V ("bhsk": a KV cache's). `softcap` > 0: the scores bounded by
  softcap * tanh(scores / softcap) before the mask (Gemma 2)."""
  if mask_BxTxS is None:
    mask_BxTxS = causal_mask(*scores_BxHxTxS.shape[-2:])
  scores_BxHxTxS = scores_BxHxTxS.astype(jnp.float32)
  if softcap:
    scores_BxHxTxS = softcap * jnp.tanh(scores_BxHxTxS / softcap)
  scores_BxHxTxS = jnp.where(mask_BxTxS[:, None], scores_BxHxTxS, jnp.finfo(jnp.float32).min)
  if points is not None:
    scores_BxHxTxS = points("attn_scores", scores_BxHxTxS)
  probs_BxHxTxS = jax.nn.softmax(scores_BxHxTxS, axis=-1)
  if points is not None:
    probs_BxHxTxS = points("pattern", probs_BxHxTxS)
  if dropout is not None:
    probs_BxHxTxS = dropout(probs_BxHxTxS, deterministic=deterministic)
  return jnp.einsum(f"bhts,{values}->bthk", probs_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK)


def attend(
  q_BxTxHxK,
  k_BxSxHxK,
  v_BxSxHxK,
  mask_BxTxS,
  implementation: str = "einsum",
  forms: str = "reference",
  dropout: nn.Dropout | None = None,
  deterministic: bool = True,
  points=None,
  softcap: float = 0.0,
) -> jax.Array:
  """softmax(Q Kᵀ / √K) V over the keys that `mask` allows (True = attend; None: causal, query t sees
  keys 0..t); `softcap` as `mix` (the einsum's alone). The reference is the einsum below
  (`forms="reference"`, `implementation="einsum"`, and always with named points to pass (`points`: a run
  read or patched), attention dropout or a soft-cap, which need the scores); otherwise the fused forms
  of transformer.kernels.attention compute the same (XLA's or cuDNN's kernel, causal blocks)."""
  fast = kernels.form("attention", forms)
  if fast is None or implementation == "einsum" or points is not None or dropout is not None or softcap:
    scores_BxHxTxS = dot_product_scores(None, None, q_BxTxHxK, k_BxSxHxK, None)
    return mix(scores_BxHxTxS, v_BxSxHxK, mask_BxTxS, dropout, deterministic, points, softcap=softcap)
  return fast(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask_BxTxS, implementation, forms)


def attend_cached(
  q_BxTxHxK,
  k_BxGxKxS,
  v_BxGxSxK,
  mask_BxTxS,
  forms: str = "reference",
  dropout: nn.Dropout | None = None,
  deterministic: bool = True,
  points=None,
  softcap: float = 0.0,
) -> jax.Array:
  """`attend` over a KV cache (keys B x G x K x S, values B x G x S x K: kv_cache.CACHE_LAYOUTS; G kv
  heads, each read by H/G query heads). With the CPU's forms one new token per sequence (every step
  after the prompt) takes matrix-vector products over the cache as it is
  (transformer.kernels.attention.one_token_cpu); the reference repeats the kv heads."""
  fast = kernels.form("attention_one_token", forms)
  if fast is not None and q_BxTxHxK.shape[1] == 1 and points is None and dropout is None and not softcap:
    return fast(q_BxTxHxK, k_BxGxKxS, v_BxGxSxK, mask_BxTxS)
  H = q_BxTxHxK.shape[2]
  k_BxHxKxS, v_BxHxSxK = kv_cache.repeat_kv(k_BxGxKxS, H, 1), kv_cache.repeat_kv(v_BxGxSxK, H, 1)
  scale = 1.0 / math.sqrt(q_BxTxHxK.shape[-1])
  scores_BxHxTxS = jnp.einsum("bthk,bhks->bhts", q_BxTxHxK, k_BxHxKxS, preferred_element_type=jnp.float32) * scale
  return mix(scores_BxHxTxS, v_BxHxSxK, mask_BxTxS, dropout, deterministic, points, values="bhsk", softcap=softcap)


def _attention_dropout(cfg: BlockConfig) -> nn.Dropout | None:
  return nn.Dropout(cfg.attention_dropout_rate) if cfg.attention_dropout_rate else None


class SelfAttention(nn.Module):
  """Multi-head self-attention, its scores made by the block's mechanism (MECHANISMS).

  With `decode=True` it keeps a KV cache in the "cache" collection: each call writes its keys and
  values (or values alone, for a mechanism without keys) at the cache index and attends over the
  whole cache (the caller's mask says which slots are real; see `CachePositions`). The cache's
  length is that of the input `init` sees. With grouped-query attention (block.num_kv_heads) the
  keys and values, their named points and the cache have the kv heads alone; each query head reads
  its group's. A sliding window (block.sliding_window, on a `local` layer) is a mask over the same
  cache: every slot is kept, so local and global layers are one program shape, and a window only
  saves memory past its length (where a ring buffer would pay in a gather per step)."""

  cfg: BlockConfig
  forms: str = "reference"  # the model's fast forms (transformer.kernels.resolve)
  max_len: int = 0  # the model's longest sequence: a by-position mechanism's number of positions
  rope: bool = False  # queries and keys rotated by their positions (the model's positions == "rope")
  residual_std: float = 0.02  # of the output projection: GPT-2 scales it by 1/sqrt(2 * layers)
  decode: bool = False
  local: bool = True  # a layer of the sliding window (block.sliding_window) and rotary.local_theta

  def projection(self, features, names, *, name: str, contract: int = 1, std: float = 0.02, use_bias=None):
    """A projection of this block's kind (`projections`), created in this module."""
    bias = self.cfg.use_bias if use_bias is None else use_bias
    return projections(self.cfg, self.forms)(features, names, contract=contract, std=std, name=name, use_bias=bias)

  @nn.compact
  def __call__(
    self, x_BxTxD, mask_BxTxS, *, positions, deterministic: bool = True, last_query: bool = False, local=None
  ):
    """`positions`: (of the queries B x T, of the keys B x S), as `Mechanism.scores` takes them.
    `last_query`: the output at the last position only (B x 1 x D), its query alone against every key:
    all that a loss reading only that position needs (GPT's `last_only`).
    `x_BxTxD` may instead be three inputs per head, (queries', keys', values') each B x T x H x D
    (keys' and values' at the kv heads): a run that patches the block's `q_input`, `k_input` or
    `v_input` (Block), where one head's queries, keys or values see another residual stream than the rest."""
    cfg, mechanism = self.cfg, MECHANISMS[self.cfg.attention_mechanism]
    H, K = cfg.num_heads, cfg.head_dim
    local = self.local if local is None else local  # (a traced bool: a scanned mix of layer kinds)
    per_head_inputs = isinstance(x_BxTxD, tuple)
    if per_head_inputs and not mechanism.keys:
      raise ValueError(
        f"per-head inputs (q_input, k_input, v_input) need queries and keys; {cfg.attention_mechanism!r} has none"
      )
    if last_query and self.decode:
      raise ValueError("last_query needs dot-product attention (its scores from one query), not decoding")
    q_BxTxHxK = k_BxSxGxK = None
    if mechanism.keys:
      q_BxTxHxK, k_BxSxGxK, v_BxSxGxK = heads.qkv(self, x_BxTxD)
      q_BxTxHxK, k_BxSxGxK = qk_normalised(cfg, q_BxTxHxK, k_BxSxGxK)
      q_BxTxHxK, k_BxSxGxK = point(self, "q", q_BxTxHxK), point(self, "k", k_BxSxGxK)
      if self.rope:  # this call's keys are its queries' tokens: both at the queries' positions
        q_BxTxHxK = point(self, "rot_q", rotated(cfg.rotary, q_BxTxHxK, positions[0], local))
        k_BxSxGxK = point(self, "rot_k", rotated(cfg.rotary, k_BxSxGxK, positions[0], local))
      if cfg.attention_scale:  # Q Kᵀ times attention_scale, not 1/√K: the queries scaled to cancel the √K
        q_BxTxHxK = q_BxTxHxK * jnp.asarray(cfg.attention_scale * math.sqrt(K), q_BxTxHxK.dtype)
      q_BxTxHxK = nn.with_logical_constraint(q_BxTxHxK, ("batch", "length", "heads", "kv"))
    else:
      v_BxSxGxK = self.projection((H, K), ("embed", "heads", "kv"), name="v")(x_BxTxD)
    v_BxSxGxK = point(self, "v", v_BxSxGxK)
    if cfg.sliding_window and local is not False:
      mask_BxTxS = window_mask(mask_BxTxS, *positions, cfg.sliding_window, local)
    mixing = (_attention_dropout(cfg), deterministic, points_of(self))  # mix's dropout and named points
    softcap = {"softcap": cfg.attention_softcap} if cfg.attention_softcap else {}
    if self.decode:
      out_BxTxHxK = self._over_the_cache(
        mechanism, x_BxTxD, q_BxTxHxK, k_BxSxGxK, v_BxSxGxK, mask_BxTxS, positions, mixing, softcap
      )
    else:
      k_BxSxHxK = None if k_BxSxGxK is None else kv_cache.repeat_kv(k_BxSxGxK, H, 2)
      v_BxSxHxK = kv_cache.repeat_kv(v_BxSxGxK, H, 2)
      out_BxTxHxK = _attention(
        self, mechanism, x_BxTxD, q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask_BxTxS, positions, mixing, softcap, last_query
      )
    z_BxTxHxK = point(self, "z", out_BxTxHxK)  # each head's output, before the output projection
    out = self.projection((cfg.d_model,), ("heads", "kv", "embed"), contract=2, std=self.residual_std, name="out")
    return heads.output(self, out, z_BxTxHxK)

  def _over_the_cache(
    self, mechanism, x_BxTxD, q_BxTxHxK, k_BxTxGxK, v_BxTxGxK, mask_BxTxS, positions, mixing, softcap
  ):
    """Decoding: this call's keys and values (values alone without keys) written into the cache (kv_cache),
    then its queries' attention over the whole cache (keys B x G x K x S, values B x G x S x K; each
    query head reads its group's)."""
    H = self.cfg.num_heads
    if not mechanism.keys:
      v_BxHxSxK = kv_cache.write(self, value=v_BxTxGxK)["value"]
      scores_BxHxTxS = mechanism.scores(self, x_BxTxD, None, None, positions)
      return mix(scores_BxHxTxS, v_BxHxSxK, mask_BxTxS, *mixing, values="bhsk", **softcap)
    cache = kv_cache.write(self, key=k_BxTxGxK, value=v_BxTxGxK)
    if mechanism.scaled_dot_product:  # with its own form for one new token (attend_cached)
      return attend_cached(q_BxTxHxK, cache["key"], cache["value"], mask_BxTxS, self.forms, *mixing, **softcap)
    k_BxHxKxS, v_BxHxSxK = kv_cache.repeat_kv(cache["key"], H, 1), kv_cache.repeat_kv(cache["value"], H, 1)
    scores_BxHxTxS = mechanism.scores(self, x_BxTxD, q_BxTxHxK, k_BxHxKxS.transpose(0, 3, 1, 2), positions)
    return mix(scores_BxHxTxS, v_BxHxSxK, mask_BxTxS, *mixing, values="bhsk", **softcap)


# A part of SelfAttention's call as a function of the module, not a method: Flax puts a method's name in
# the name stack of every op it traces, which would rename the ops of a program that did not change
# (its HLO, its profiles). (So is heads.qkv.)


def _attention(
  self: SelfAttention,
  mechanism,
  x_BxTxD,
  q_BxTxHxK,
  k_BxSxHxK,
  v_BxSxHxK,
  mask_BxTxS,
  positions,
  mixing,
  softcap,
  last_query,
):
  """softmax(scores) V without a cache: the last query alone, a fused form, or the mechanism's scores."""
  if last_query:
    if not mechanism.scaled_dot_product:
      raise ValueError("last_query needs dot-product attention (its scores from one query), not decoding")
    T = q_BxTxHxK.shape[1]
    mask_Bx1xS = (causal_mask(T) if mask_BxTxS is None else mask_BxTxS)[:, -1:]
    scores_BxHx1xS = dot_product_scores(None, None, q_BxTxHxK[:, -1:], k_BxSxHxK, None)
    return mix(scores_BxHx1xS, v_BxSxHxK, mask_Bx1xS, *mixing, **softcap)
  if mechanism.scaled_dot_product:  # Q Kᵀ / √K has fused forms (attend)
    return attend(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask_BxTxS, self.cfg.attention, self.forms, *mixing, **softcap)
  scores_BxHxTxS = mechanism.scores(self, x_BxTxD, q_BxTxHxK, k_BxSxHxK, positions)
  return mix(scores_BxHxTxS, v_BxSxHxK, mask_BxTxS, *mixing, **softcap)


class CrossAttention(nn.Module):
  """Attention from x (queries: the decoder's tokens) to `context_BxSxD` (keys and values: the
  encoder's output), by dot products. With `decode=True` the context's keys and values are made once,
  on the call that passes `context_BxSxD`, and read from the cache on the calls that pass None."""

  cfg: BlockConfig
  forms: str = "reference"
  residual_std: float = 0.02
  decode: bool = False

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxTxS, *, context_BxSxD=None, deterministic: bool = True):
    cfg, projection = self.cfg, projections(self.cfg, self.forms)
    H, K = cfg.num_heads, cfg.head_dim
    q_BxTxHxK = projection((H, K), ("embed", "heads", "kv"), name="q")(x_BxTxD)
    kv = projection((2, H, K), ("embed", None, "heads", "kv"), name="kv")
    kv_BxSx2xHxK = kv(context_BxSxD) if context_BxSxD is not None else None
    if self.decode:
      cached = self.variable("cache", "context_kv", lambda: kv_BxSx2xHxK)
      if context_BxSxD is not None:
        cached.value = kv_BxSx2xHxK
      kv_BxSx2xHxK = cached.value
    q_BxTxHxK, k_BxSxHxK = qk_normalised(cfg, q_BxTxHxK, kv_BxSx2xHxK[:, :, 0])
    q_BxTxHxK = nn.with_logical_constraint(point(self, "q", q_BxTxHxK), ("batch", "length", "heads", "kv"))
    k_BxSxHxK, v_BxSxHxK = point(self, "k", k_BxSxHxK), point(self, "v", kv_BxSx2xHxK[:, :, 1])
    out_BxTxHxK = attend(
      q_BxTxHxK,
      k_BxSxHxK,
      v_BxSxHxK,
      mask_BxTxS,
      cfg.attention,
      self.forms,
      _attention_dropout(cfg),
      deterministic,
      points_of(self),
    )
    z_BxTxHxK = point(self, "z", out_BxTxHxK)
    out = projection((cfg.d_model,), ("heads", "kv", "embed"), contract=2, std=self.residual_std, name="out")
    return heads.output(self, out, z_BxTxHxK)
