"""Cross-layer transcoders (Ameisen, Lindsey et al. 2025, "Circuit Tracing"): one encoder a layer, reading that
layer's MLP input, and decoders from each layer's latents to its own MLP's output and every later one's, trained
jointly, so that a feature computed once writes wherever the model uses it:

    z_l = activation(x_l W_enc[l] + b_enc[l])                 layer l's latents (Z), from its MLP's input x_l
    ŷ_m = Σ_{l ≤ m} z_l W_dec_l[:, m - l] + b_dec[m]          layer m's MLP output, from every layer up to it

in the scaled spaces the SAEs learn in (layer l's input times input_scale[l], layer m's output times
output_scale[m]; each set from the data, as an SAE's). A `CLTConfig` configures one (TopK a layer, JumpReLU or
ReLU + L1, whose penalty weighs a latent by the norm of all its decoders); the SAE task trains it with
--config.cross_layer (transformer.tasks.sae: `CLTConfig.of` its config.model) and transformer.interp.graph draws
graphs through it. Its decoders are kept as circuit-tracer keeps them, `W_dec_<l>`: Z x (L - l) x d_out.

    >>> clt = CrossLayerTranscoder(CLTConfig(layers=4, d_in=64, d_out=64, d_sae=256, activation="topk", k=8))
    >>> y_LxNxO, z_LxNxZ = clt.apply({"params": params}, x_LxNxD)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.errors import ConfigError
from transformer.models import sae
from transformer.models.sae import SAEConfig, init_decoder_bias, norm_scale, step

ACTIVATIONS = ("topk", "jumprelu", "relu")


@dataclasses.dataclass(frozen=True)
class CLTConfig:
  """A cross-layer transcoder's shape and recipe (the fields an SAEConfig shares keep its meaning there)."""

  layers: int  # L: the layers it reads and writes (the model's)
  d_in: int  # each layer's input width
  d_out: int  # each layer's output width
  d_sae: int = 0  # latents a layer (0: expansion x d_in)
  expansion: int = 8
  activation: str = "topk"  # ACTIVATIONS
  k: int = 32  # topk: latents a row, a layer
  l1_coefficient: float = 5.0
  l0_coefficient: float = 1.0
  bandwidth: float = 0.05
  initial_threshold: float = 0.01
  initial_density: float = 1e-3
  decoder_init_norm: float = 0.1
  dtype: str = "float32"
  param_dtype: str = "float32"

  transcoder: ClassVar[bool] = True  # as SAEConfig.transcoder: it writes another point than it reads

  @classmethod
  def of(cls, config: SAEConfig, layers: int) -> CLTConfig:
    """The cross-layer transcoder over `layers` layers of the SAE task's config.model (an SAEConfig: what
    --config.model.* sets), its shared fields kept."""
    check_recipe(config)
    shared = {f.name: getattr(config, f.name) for f in dataclasses.fields(cls) if f.name != "layers"}
    return cls(layers=layers, **shared).check()

  def replace(self, **changes) -> CLTConfig:
    return dataclasses.replace(self, **changes)

  @property
  def latents(self) -> int:
    return self.d_sae or self.expansion * self.d_in

  @property
  def out_width(self) -> int:
    return self.d_out

  def check(self) -> CLTConfig:
    if self.layers <= 0 or self.d_in <= 0 or self.d_out <= 0:
      raise ConfigError(
        f"a cross-layer transcoder needs its layers, d_in and d_out (all positive); got {self.layers}, "
        f"{self.d_in}, {self.d_out}"
      )
    if self.activation not in ACTIVATIONS:
      raise ConfigError(f"a cross-layer transcoder's activation is {', '.join(ACTIVATIONS)}, not {self.activation!r}")
    # The checks of the fields it shares with an SAE (widths, k, the penalties) are an SAE's.
    SAEConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "layers"}).check()
    return self


def check_recipe(config: SAEConfig) -> None:
  """Refuses what an SAE's config may ask and a cross-layer transcoder has no recipe for: a skip path, BatchTopK."""
  if config.skip or config.activation not in ACTIVATIONS:
    raise ConfigError(
      "a cross-layer transcoder is TopK, JumpReLU or ReLU + L1, without a skip path: set "
      "--config.model.activation to one of those and --config.model.skip=False"
    )


class CrossLayerTranscoder(nn.Module):
  """The cross-layer transcoder of `config` (layers L, d_in D, latents Z a layer, d_out O)."""

  config: CLTConfig

  def setup(self):
    cfg = self.config
    L, D, Z, O = cfg.layers, cfg.d_in, cfg.latents, cfg.out_width
    dtype = jnp.dtype(cfg.param_dtype)

    def rows(shape, axis):  # random directions of norm decoder_init_norm along `axis`
      def init(key, shape=shape, dtype=dtype):
        w = jax.random.normal(key, shape, dtype)
        return cfg.decoder_init_norm * w / jnp.linalg.norm(w, axis=axis, keepdims=True)

      return init

    # The latents' axis is the SAE's ("mlp": the mesh's tensor axis by the logical axis rules), the model's width
    # "embed", the layers' axis replicated: a mesh shards a cross-layer transcoder's latents as an SAE's.
    axes = lambda init, *names: nn.with_logical_partitioning(init, names)
    zeros, ones = nn.initializers.zeros_init(), nn.initializers.ones_init()
    self.W_enc = self.param("W_enc", axes(rows((L, D, Z), 1), None, "embed", "mlp"), (L, D, Z), dtype)
    self.b_enc = self.param("b_enc", axes(zeros, None, "mlp"), (L, Z), dtype)
    # A latent's decoders to the L - l layers it writes, shared in norm across them (a feature's one size).
    decoder = lambda l: axes(rows((Z, L - l, O), (1, 2)), "mlp", None, "embed")
    self.W_dec = [self.param(f"W_dec_{l}", decoder(l), (Z, L - l, O), dtype) for l in range(L)]
    self.b_dec = self.param("b_dec", axes(zeros, None, "embed"), (L, O), dtype)
    if cfg.activation == "jumprelu":
      threshold = axes(nn.initializers.constant(cfg.initial_threshold), None, "mlp")
      self.threshold = self.param("threshold", threshold, (L, Z), dtype)
    self.since_fired = self.param("since_fired", axes(zeros, None, "mlp"), (L, Z), jnp.float32)
    self.input_scale = self.param("input_scale", axes(ones, None), (L,), jnp.float32)
    self.output_scale = self.param("output_scale", axes(ones, None), (L,), jnp.float32)

  def pre_activations(self, x_LxNxD) -> jax.Array:
    """Of inputs already scaled (each layer's times its input_scale)."""
    return jnp.einsum("lnd,lds->lns", x_LxNxD, self.W_enc) + self.b_enc[:, None]

  def activate(self, pre_LxNxZ) -> jax.Array:
    """Every layer's latents of its pre-activations (`activation`, layer by layer)."""
    each = functools.partial(activation, self.config)
    if self.config.activation == "jumprelu":
      return jax.vmap(each)(pre_LxNxZ, self.threshold)
    return jax.vmap(each)(pre_LxNxZ)

  def decode(self, z_LxNxZ) -> jax.Array:
    """Each layer's output (scaled space) from every layer's latents up to it, plus its b_dec."""
    L = self.config.layers
    y_LxNxO = jnp.broadcast_to(self.b_dec[:, None], (L, z_LxNxZ.shape[1], self.b_dec.shape[-1]))
    for l in range(L):
      y_MxNxO = jnp.einsum("ns,smo->mno", z_LxNxZ[l], self.W_dec[l])
      y_LxNxO = y_LxNxO.at[l:].add(y_MxNxO)
    return y_LxNxO

  def decoder_norms(self) -> jax.Array:
    """L x Z: each latent's decoders' norm, over all the layers it writes."""
    return jnp.stack([jnp.sqrt(jnp.sum(jnp.square(w), axis=(1, 2))) for w in self.W_dec])

  def __call__(self, x_LxNxD, train: bool = False):
    """(every layer's output L x N x O, the latents L x N x Z) of every layer's input, in the model's units."""
    z_LxNxZ = self.activate(self.pre_activations(x_LxNxD * self.input_scale[:, None, None]))
    return self.decode(z_LxNxZ) / self.output_scale[:, None, None], z_LxNxZ


def activation(config: CLTConfig, pre_NxZ, threshold_Z=None) -> jax.Array:
  """One layer's latents of its pre-activations (N x Z): an SAE's activation, JumpReLU's at that layer's
  `threshold_Z` clamped at 0. What training and a replacement model reading one layer at a time both call."""
  return sae.activate(config, pre_NxZ, None if threshold_Z is None else jnp.maximum(threshold_Z, 0.0))


def clt_loss(clt: CrossLayerTranscoder, params, x_LxNxD, y_LxNxO, dead_tokens: float | None = None):
  """(the loss, its parts, the statistics' new values), as `sae_loss` for a transcoder: the squared error
  of every layer's output (summed over d_out and the layers, averaged over rows) plus the activation's
  sparsity term (relu: L1 weighted by the latents' decoder norms; jumprelu: L0 through the step's
  estimator; TopK none: no AuxK here), and `since_fired` after this batch."""
  cfg = clt.config
  N = x_LxNxD.shape[1]

  def inside(module: CrossLayerTranscoder):
    x_scaled = x_LxNxD * jax.lax.stop_gradient(module.input_scale)[:, None, None]
    target = y_LxNxO * jax.lax.stop_gradient(module.output_scale)[:, None, None]
    pre_LxNxZ = module.pre_activations(x_scaled)
    z_LxNxZ = module.activate(pre_LxNxZ)
    mse = jnp.sum(jnp.mean(jnp.sum(jnp.square(module.decode(z_LxNxZ) - target), -1), -1))
    parts = {"mse": mse}
    if cfg.activation == "relu":
      parts["l1"] = cfg.l1_coefficient * jnp.sum(jnp.mean(z_LxNxZ * module.decoder_norms()[:, None], 1))
    elif cfg.activation == "jumprelu":
      fired = step(pre_LxNxZ, jnp.maximum(module.threshold, 0.0)[:, None], cfg.bandwidth)
      parts["l0"] = cfg.l0_coefficient * jnp.sum(jnp.mean(jnp.sum(fired, -1), -1))
    fired_LxZ = jnp.any(z_LxNxZ > 0, axis=1)
    stats = {"since_fired": jnp.where(fired_LxZ, 0.0, module.since_fired + N)}
    return sum(parts.values()), parts, jax.lax.stop_gradient(stats)

  return nn.apply(inside, clt)({"params": params})


def init_clt_params(clt: CrossLayerTranscoder, params, x_LxNxD, y_LxNxO, normalize: bool, init_b_dec: str) -> dict:
  """What an SAE's first rows set, a layer at a time: each layer's input and output scale (`norm_scale`), its
  b_dec at its target's mean or geometric median (`init_b_dec`: or "zeros"), and with `initial_density`
  JumpReLU's θ₀ from its pre-activations (`threshold_from_data`)."""
  cfg = clt.config
  x, y = np.asarray(x_LxNxD, np.float32), np.asarray(y_LxNxO, np.float32)
  s_in = np.array([norm_scale(a) if normalize else 1.0 for a in x], np.float32)
  s_out = np.array([norm_scale(a) if normalize else 1.0 for a in y], np.float32)
  params = {**params, "input_scale": jnp.asarray(s_in), "output_scale": jnp.asarray(s_out)}
  if init_b_dec != "zeros":
    centre = lambda rows: init_decoder_bias({"b_dec": jnp.zeros(rows.shape[1])}, rows, init_b_dec)["b_dec"]
    params["b_dec"] = jnp.stack([centre(y[l] * s_out[l]) for l in range(cfg.layers)]).astype(params["b_dec"].dtype)
  if cfg.activation == "jumprelu" and cfg.initial_density > 0:
    pre_LxNxZ = jnp.einsum("lnd,lds->lns", x * s_in[:, None, None], params["W_enc"]) + params["b_enc"][:, None]
    params["threshold"] = jnp.maximum(jnp.quantile(pre_LxNxZ, 1.0 - cfg.initial_density, axis=1), 0.0)
  return params
