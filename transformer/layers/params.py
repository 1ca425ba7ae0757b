"""Parameters: dtypes, initialisers, the projection every block is made of, and the norms.

Every parameter is created with its logical axis names (`nn.with_logical_partitioning`), so that
sharding is a matter of rules and a mesh (`transformer.sharding`), never of model edits.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax.numpy as jnp

from transformer import kernels
from transformer.layers.config import BlockConfig, dtype


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


def norm(cfg: BlockConfig, name: str | None = None) -> nn.Module:
  """The block's normalisation (`cfg.norm`) over the model width: LayerNorm or RMSNorm."""
  if cfg.norm == "rms_norm":
    return nn.RMSNorm(
      epsilon=cfg.layer_norm_epsilon,
      dtype=dtype(cfg.dtype),
      param_dtype=dtype(cfg.param_dtype),
      name=name,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
    )
  # epsilon explicitly: GPT-2 uses 1e-5, Flax's default is 1e-6.
  return nn.LayerNorm(
    epsilon=cfg.layer_norm_epsilon,
    dtype=dtype(cfg.dtype),
    use_bias=cfg.use_bias,
    param_dtype=dtype(cfg.param_dtype),
    name=name,
    scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
    bias_init=zeros(("embed",)),
  )
