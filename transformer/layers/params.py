"""Parameters: dtypes, initialisers, the projection every block is made of, and the norms.

Every parameter is created with its logical axis names (`nn.with_logical_partitioning`), so that
sharding is a matter of rules and a mesh (`transformer.sharding`), never of model edits.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import kernels
from transformer.layers.config import BlockConfig, dtype
from transformer.layers.points import intervened, point


def kernel_init(kind: str, std: float, names: tuple[str | None, ...], contract: int):
  """A kernel's initialiser (`kind`: KERNEL_INITS) with its logical axis names; the first `contract`
  axes are contracted with the input."""
  if kind == "gpt2":
    return nn.with_logical_partitioning(nn.initializers.normal(std), names)
  # Glorot: fans are the contracted dims and the feature dims; a fused q/k/v axis (named None) is a
  # batch axis, so q, k and v each get the scale of a separate projection.
  features = range(contract, len(names))
  init = nn.initializers.variance_scaling(
    1.0,
    "fan_avg",
    "uniform",
    in_axis=tuple(range(contract)),
    out_axis=tuple(i for i in features if names[i] is not None),
    batch_axis=tuple(i for i in features if names[i] is None),
  )
  return nn.with_logical_partitioning(init, names)


def zeros(names):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


class Projection(nn.Module):
  """x @ kernel over the last `contract` dims of x, into `features` dims: Dense for any rank.

  Flax's DenseGeneral initialises a flattened kernel and reshapes it, which breaks logical sharding
  of multi-dimensional kernels; this creates the kernel in its real shape with its axis names."""

  features: tuple[int, ...]
  names: tuple[str | None, ...]  # logical names of the kernel: contracted dims, then features
  contract: int = 1
  std: float = 0.02  # kernel_init "gpt2"
  use_bias: bool = True
  dtype: str = "float32"
  param_dtype: str = "float32"
  kernel_init: str = "gpt2"  # or "xavier" (config.KERNEL_INITS)
  forms: str = "reference"  # the model's (transformer.kernels.resolve)

  @nn.compact
  def __call__(self, x):
    shape = (*x.shape[x.ndim - self.contract :], *self.features)
    init = kernel_init(self.kernel_init, self.std, self.names, self.contract)
    kernel = self.param("kernel", init, shape, dtype(self.param_dtype))
    x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
    fast = kernels.form("projection", self.forms)
    y = fast(x, kernel, self.contract) if fast else jnp.tensordot(x, kernel, self.contract)
    if self.use_bias:
      bias = self.param("bias", zeros(self.names[self.contract :]), self.features, dtype(self.param_dtype))
      y = y + bias.astype(self.dtype)
    return y

  def weights(self) -> tuple[jax.Array, jax.Array | None]:
    """(kernel, bias or None), in the compute dtype: for the per-head forms of a projection that a
    read or patched run takes (transformer.layers.attention: each head's input, each head's result)."""
    params = nn.unbox(self.variables["params"])
    bias = params.get("bias")
    return params["kernel"].astype(self.dtype), None if bias is None else bias.astype(self.dtype)


def projections(cfg: BlockConfig, forms: str):
  """`Projection` with the block's bias, dtypes and initialisation and the model's forms: what every
  projection of a block is, given its features, logical names and name."""
  return functools.partial(
    Projection,
    use_bias=cfg.use_bias,
    dtype=cfg.dtype,
    param_dtype=cfg.param_dtype,
    kernel_init=cfg.kernel_init,
    forms=forms,
  )


class Norm(nn.Module):
  """LayerNorm (`cfg.norm == "layer_norm"`), RMSNorm or nothing ("none") over the model width, computed as Flax's
  (statistics in float32, variance as E[x²] - E[x]²), with TransformerLens's two named points when a run reads
  or patches: `scale`, the divisor √(var + ε) (B x T x 1), and `normalized`, the input centred and divided by
  it, before the learned scale and bias. Fixing `scale` at a run's value makes the norm linear in its input:
  what direct logit attribution and `ActivationCache.apply_ln` use."""

  cfg: BlockConfig

  @nn.compact
  def __call__(self, x, points: bool = True):
    """`points=False`: no named points (each head's own copy of the stream, B x T x H x D, which the
    block normalises apart from the stream itself: its points stay the stream's)."""
    cfg = self.cfg
    if cfg.norm == "none":  # the identity: no statistics, no parameters, no named points
      return x
    # Flax's order of operations (nn.LayerNorm, nn.RMSNorm): the same numbers as Flax's own norms, and a
    # run that neither reads nor patches compiles to the program of one without named points.
    x32 = x.astype(jnp.promote_types(dtype(cfg.dtype), jnp.float32))
    square = jax.lax.square(x32)
    if cfg.norm == "rms_norm":
      var = jnp.mean(square, -1)
      mean = jnp.zeros_like(var)
    else:
      mean, mean_of_square = jnp.mean(x32, -1), jnp.mean(square, -1)
      var = jnp.maximum(0.0, mean_of_square - jax.lax.square(mean))
    mean, var = mean[..., None], var[..., None]
    centred = x - mean
    features = (1,) * (x.ndim - 1) + (x.shape[-1],)
    ones = nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",))
    weight = lambda: self.param("scale", ones, (x.shape[-1],), dtype(cfg.param_dtype)).reshape(features)
    if cfg.norm_offset:  # Gemma's (1 + w): w starts at 0, the factor at 1
      offset = nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",))
      w = lambda: self.param("scale", offset, (x.shape[-1],), dtype(cfg.param_dtype)).reshape(features)
      weight = lambda: cfg.norm_offset + w().astype(jnp.float32)  # in float32: 1 + w in bfloat16 would round w away
    if points and intervened(self, ("scale", "normalized")):
      scale = point(self, "scale", jnp.sqrt(var + cfg.layer_norm_epsilon))
      y = point(self, "normalized", centred / scale) * weight()
    else:
      y = centred * (jax.lax.rsqrt(var + cfg.layer_norm_epsilon) * weight())
    if cfg.norm != "rms_norm" and cfg.use_bias:
      y = y + self.param("bias", zeros(("embed",)), (x.shape[-1],), dtype(cfg.param_dtype)).reshape(features)
    return y.astype(dtype(cfg.dtype))


def norm(cfg: BlockConfig, name: str | None = None) -> nn.Module:
  """The block's normalisation (`cfg.norm`) over the model width: LayerNorm or RMSNorm (`Norm`).
  GPT-2's epsilon is 1e-5 (Flax's default 1e-6): the config's, always."""
  return Norm(cfg, name=name)


def qk_normalised(cfg: BlockConfig, q_BxTxHxK, k_BxSxGxK):
  """With `qk_norm`, each head's queries and keys RMS-normalised (a learned scale per channel, made in
  the calling module as q_norm and k_norm): the scores stay bounded whatever the projections' scale,
  which allows larger learning rates. `qk_norm_over="heads"`: over all heads' channels at once, as OLMo 2
  normalises the projections' outputs; `norm_offset`: Gemma 3's (1 + w)."""
  if not cfg.qk_norm:
    return q_BxTxHxK, k_BxSxGxK
  if cfg.qk_norm_over == "head" and not cfg.norm_offset:
    head_norm = functools.partial(
      nn.RMSNorm,
      epsilon=cfg.layer_norm_epsilon,
      dtype=dtype(cfg.dtype),
      param_dtype=dtype(cfg.param_dtype),
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("kv",)),
    )
    return head_norm(name="q_norm")(q_BxTxHxK), head_norm(name="k_norm")(k_BxSxGxK)
  if cfg.qk_norm_over == "head":
    return HeadNorm(cfg, ("kv",), name="q_norm")(q_BxTxHxK), HeadNorm(cfg, ("kv",), name="k_norm")(k_BxSxGxK)
  over_heads = lambda x, name: HeadNorm(cfg, (None,), name=name)(x.reshape(*x.shape[:2], -1)).reshape(x.shape)
  return over_heads(q_BxTxHxK, "q_norm"), over_heads(k_BxSxGxK, "k_norm")


class HeadNorm(nn.Module):
  """RMSNorm over the last axis with a scale of its width, (norm_offset + scale), in float32 as
  transformers' Qwen3, OLMo 2 and Gemma 3 norms compute it."""

  cfg: BlockConfig
  names: tuple[str | None, ...]

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), -1, keepdims=True) + cfg.layer_norm_epsilon)
    init = nn.initializers.zeros_init() if cfg.norm_offset else nn.initializers.ones_init()
    scale = self.param("scale", nn.with_logical_partitioning(init, self.names), (x.shape[-1],), dtype(cfg.param_dtype))
    return (y * (cfg.norm_offset + scale.astype(jnp.float32))).astype(dtype(cfg.dtype))
