"""Attention: softmax(scores) V over the keys a mask allows (`mix`), by dot products with their fused
forms (`attend`, `attend_cached`), and the two attention modules: self-attention, whose scores a
mechanism makes (transformer.layers.mechanisms), and cross-attention from the decoder to the encoder."""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import kernels
from transformer.layers import kv_cache
from transformer.layers.config import BlockConfig, dtype
from transformer.layers.mechanisms import MECHANISMS, dot_product_scores
from transformer.layers.params import Projection, projections
from transformer.layers.points import intervened, point, points_of
from transformer.layers.positions import causal_mask, rotary


def mix(
  scores_BxHxTxS,
  v_BxSxHxK,
  mask_BxTxS,
  dropout: nn.Dropout | None = None,
  deterministic: bool = True,
  at=None,
  values: str = "bshk",
) -> jax.Array:
  """softmax(scores) V over the keys that `mask` allows (True = attend; None: causal), however the
  scores were made. Scores in float32; masking by jnp.where, never by adding a large negative number
  (which overflows in half precision). `at(name, x) -> x`, when given, is the attention module's
  named points (`point`): the masked scores, "attn_scores", and the probabilities, "pattern", pass
  through it.
  `values`: the layout of V ("bhsk": a KV cache's)."""
  if mask_BxTxS is None:
    mask_BxTxS = causal_mask(*scores_BxHxTxS.shape[-2:])
  scores_BxHxTxS = jnp.where(mask_BxTxS[:, None], scores_BxHxTxS.astype(jnp.float32), jnp.finfo(jnp.float32).min)
  if at is not None:
    scores_BxHxTxS = at("attn_scores", scores_BxHxTxS)
  probs_BxHxTxS = jax.nn.softmax(scores_BxHxTxS, axis=-1)
  if at is not None:
    probs_BxHxTxS = at("pattern", probs_BxHxTxS)
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
  at=None,
) -> jax.Array:
  """softmax(Q Kᵀ / √K) V over the keys that `mask` allows (True = attend; None: causal, query t sees
  keys 0..t). The reference is the einsum below (`forms="reference"`, `implementation="einsum"`, and
  always with named points to pass (`at`: a run read or patched) or attention dropout, which need the
  scores); otherwise the fused forms of transformer.kernels.attention compute the same (XLA's or
  cuDNN's kernel, causal blocks)."""
  fast = kernels.form("attention", forms)
  if fast is None or implementation == "einsum" or at is not None or dropout is not None:
    scores_BxHxTxS = dot_product_scores(None, None, q_BxTxHxK, k_BxSxHxK, None)
    return mix(scores_BxHxTxS, v_BxSxHxK, mask_BxTxS, dropout, deterministic, at)
  return fast(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask_BxTxS, implementation, forms)


def attend_cached(
  q_BxTxHxK,
  k_BxHxKxS,
  v_BxHxSxK,
  mask_BxTxS,
  forms: str = "reference",
  dropout: nn.Dropout | None = None,
  deterministic: bool = True,
  at=None,
) -> jax.Array:
  """`attend` over a KV cache (keys B x H x K x S, values B x H x S x K: kv_cache.CACHE_LAYOUTS). With the
  CPU's forms one new token per sequence (every step after the prompt) takes matrix-vector products
  (transformer.kernels.attention.one_token_cpu)."""
  fast = kernels.form("attention_one_token", forms)
  if fast is not None and q_BxTxHxK.shape[1] == 1 and at is None and dropout is None:
    return fast(q_BxTxHxK, k_BxHxKxS, v_BxHxSxK, mask_BxTxS)
  scale = 1.0 / math.sqrt(q_BxTxHxK.shape[-1])
  scores_BxHxTxS = jnp.einsum("bthk,bhks->bhts", q_BxTxHxK, k_BxHxKxS, preferred_element_type=jnp.float32) * scale
  return mix(scores_BxHxTxS, v_BxHxSxK, mask_BxTxS, dropout, deterministic, at, values="bhsk")


def _attention_dropout(cfg: BlockConfig) -> nn.Dropout | None:
  return nn.Dropout(cfg.attention_dropout_rate) if cfg.attention_dropout_rate else None


def _normalised(cfg: BlockConfig, q_BxTxHxK, k_BxSxHxK):
  """With `qk_norm`, each head's queries and keys RMS-normalised (a learned scale per channel, made in
  the calling module as q_norm and k_norm): the scores stay bounded whatever the projections' scale,
  which allows larger learning rates."""
  if not cfg.qk_norm:
    return q_BxTxHxK, k_BxSxHxK
  head_norm = functools.partial(
    nn.RMSNorm,
    epsilon=cfg.layer_norm_epsilon,
    dtype=dtype(cfg.dtype),
    param_dtype=dtype(cfg.param_dtype),
    scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("kv",)),
  )
  return head_norm(name="q_norm")(q_BxTxHxK), head_norm(name="k_norm")(k_BxSxHxK)


def _per_head_projection(qkv: Projection, inputs) -> jax.Array:
  """The fused q/k/v projection (kernel D x 3 x H x K) of three inputs per head (queries', keys',
  values', each B x T x H x D): head h's queries read its own copy of the stream, and so on."""
  kernel_Dx3xHxK, bias_3xHxK = qkv.weights()
  qkv_BxTx3xHxK = jnp.stack(
    [
      jnp.einsum("bthd,dhk->bthk", x_BxTxHxD.astype(kernel_Dx3xHxK.dtype), kernel_Dx3xHxK[:, i])
      for i, x_BxTxHxD in enumerate(inputs)
    ],
    axis=2,
  )
  return qkv_BxTx3xHxK if bias_3xHxK is None else qkv_BxTx3xHxK + bias_3xHxK


def _output(module: nn.Module, out: Projection, z_BxTxHxK) -> jax.Array:
  """The output projection of the heads' outputs. A run that reads or patches takes it head by head:
  each head's `result` (B x T x H x D, what it adds to the residual stream, TransformerLens's
  `attn.hook_result`) is a named point, summed over heads, plus the bias."""
  if not intervened(module) or module.is_initializing():
    return out(z_BxTxHxK)
  kernel_HxKxD, bias_D = out.weights()
  result_BxTxHxD = point(
    module, "result", jnp.einsum("bthk,hkd->bthd", z_BxTxHxK.astype(kernel_HxKxD.dtype), kernel_HxKxD)
  )
  out_BxTxD = result_BxTxHxD.sum(axis=2)
  return out_BxTxD if bias_D is None else out_BxTxD + bias_D


class SelfAttention(nn.Module):
  """Multi-head self-attention, its scores made by the block's mechanism (MECHANISMS).

  With `decode=True` it keeps a KV cache in the "cache" collection: each call writes its keys and
  values (or values alone, for a mechanism without keys) at the cache index and attends over the
  whole cache (the caller's mask says which slots are real; see `CachePositions`). The cache's
  length is that of the input `init` sees."""

  cfg: BlockConfig
  forms: str = "reference"  # the model's fast forms (transformer.kernels.resolve)
  max_len: int = 0  # the model's longest sequence: a by-position mechanism's number of positions
  rope: bool = False  # queries and keys rotated by their positions (the model's positions == "rope")
  residual_std: float = 0.02  # of the output projection: GPT-2 scales it by 1/sqrt(2 * layers)
  decode: bool = False

  def projection(self, features, names, *, name: str, contract: int = 1, std: float = 0.02) -> Projection:
    """A projection of this block's kind (`projections`), created in this module."""
    return projections(self.cfg, self.forms)(features, names, contract=contract, std=std, name=name)

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxTxS, *, positions, deterministic: bool = True, last_query: bool = False):
    """`positions`: (of the queries B x T, of the keys B x S), as `Mechanism.scores` takes them.
    `last_query`: the output at the last position only (B x 1 x D), its query alone against every key:
    all that a loss reading only that position needs (GPT's `last_only`).
    `x_BxTxD` may instead be three inputs per head, (queries', keys', values') each B x T x H x D: a
    run that patches the block's `q_input`, `k_input` or `v_input` (Block), where one head's queries,
    keys or values see another residual stream than the rest."""
    cfg, mechanism = self.cfg, MECHANISMS[self.cfg.attention_mechanism]
    H, K = cfg.num_heads, cfg.head_dim
    per_head_inputs = isinstance(x_BxTxD, tuple)
    if per_head_inputs and not mechanism.keys:
      raise ValueError(
        f"per-head inputs (q_input, k_input, v_input) need queries and keys; {cfg.attention_mechanism!r} has none"
      )
    q_BxTxHxK = k_BxSxHxK = None
    if mechanism.keys:
      qkv = self.projection((3, H, K), ("embed", None, "heads", "kv"), name="qkv")
      if per_head_inputs:
        qkv_BxTx3xHxK = _per_head_projection(qkv, x_BxTxD)
      else:
        qkv_BxTx3xHxK = qkv(x_BxTxD)
      q_BxTxHxK, k_BxSxHxK, v_BxSxHxK = (qkv_BxTx3xHxK[:, :, i] for i in range(3))
      q_BxTxHxK, k_BxSxHxK = _normalised(cfg, q_BxTxHxK, k_BxSxHxK)
      q_BxTxHxK, k_BxSxHxK = point(self, "q", q_BxTxHxK), point(self, "k", k_BxSxHxK)
      if self.rope:  # this call's keys are its queries' tokens: both at the queries' positions
        q_BxTxHxK = point(self, "rot_q", rotary(q_BxTxHxK, positions[0]))
        k_BxSxHxK = point(self, "rot_k", rotary(k_BxSxHxK, positions[0]))
      q_BxTxHxK = nn.with_logical_constraint(q_BxTxHxK, ("batch", "length", "heads", "kv"))
    else:
      v_BxSxHxK = self.projection((H, K), ("embed", "heads", "kv"), name="v")(x_BxTxD)
    v_BxSxHxK = point(self, "v", v_BxSxHxK)
    mixing = (_attention_dropout(cfg), deterministic, points_of(self))  # mix's dropout and named points
    if last_query:
      if not mechanism.scaled_dot_product or self.decode:
        raise ValueError("last_query needs dot-product attention (its scores from one query), not decoding")
      T = q_BxTxHxK.shape[1]
      mask_Bx1xS = (causal_mask(T) if mask_BxTxS is None else mask_BxTxS)[:, -1:]
      scores_BxHx1xS = dot_product_scores(None, None, q_BxTxHxK[:, -1:], k_BxSxHxK, None)
      out_BxTxHxK = mix(scores_BxHx1xS, v_BxSxHxK, mask_Bx1xS, *mixing)
    elif self.decode:
      out_BxTxHxK = self._over_the_cache(
        mechanism, x_BxTxD, q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask_BxTxS, positions, mixing
      )
    elif mechanism.scaled_dot_product:  # Q Kᵀ / √K has fused forms (attend)
      out_BxTxHxK = attend(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask_BxTxS, cfg.attention, self.forms, *mixing)
    else:
      scores_BxHxTxS = mechanism.scores(self, x_BxTxD, q_BxTxHxK, k_BxSxHxK, positions)
      out_BxTxHxK = mix(scores_BxHxTxS, v_BxSxHxK, mask_BxTxS, *mixing)
    z_BxTxHxK = point(self, "z", out_BxTxHxK)  # each head's output, before the output projection
    out = self.projection((cfg.d_model,), ("heads", "kv", "embed"), contract=2, std=self.residual_std, name="out")
    return _output(self, out, z_BxTxHxK)

  def _over_the_cache(self, mechanism, x_BxTxD, q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, mask_BxTxS, positions, mixing):
    """Decoding: this call's keys and values (values alone without keys) written into the cache (kv_cache),
    then its queries' attention over the whole cache (keys B x H x K x S, values B x H x S x K)."""
    if not mechanism.keys:
      v_BxHxSxK = kv_cache.write(self, value=v_BxTxHxK)["value"]
      scores_BxHxTxS = mechanism.scores(self, x_BxTxD, None, None, positions)
      return mix(scores_BxHxTxS, v_BxHxSxK, mask_BxTxS, *mixing, values="bhsk")
    cache = kv_cache.write(self, key=k_BxTxHxK, value=v_BxTxHxK)
    k_BxHxKxS, v_BxHxSxK = cache["key"], cache["value"]
    if mechanism.scaled_dot_product:  # with its own form for one new token (attend_cached)
      return attend_cached(q_BxTxHxK, k_BxHxKxS, v_BxHxSxK, mask_BxTxS, self.forms, *mixing)
    scores_BxHxTxS = mechanism.scores(self, x_BxTxD, q_BxTxHxK, k_BxHxKxS.transpose(0, 3, 1, 2), positions)
    return mix(scores_BxHxTxS, v_BxHxSxK, mask_BxTxS, *mixing, values="bhsk")


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
    q_BxTxHxK, k_BxSxHxK = _normalised(cfg, q_BxTxHxK, kv_BxSx2xHxK[:, :, 0])
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
    return _output(self, out, z_BxTxHxK)
