"""Sparse autoencoders: a point's activations x (d_in) as a sparse combination of learned directions.

    pre = (x - b_dec) W_enc + b_enc            d_sae pre-activations ("pre-encoder bias": b_dec subtracted)
    z   = activation(pre)                     sparse latents (the features)
    x̂   = z W_dec + b_dec                     the reconstruction; W_dec's rows are the features' directions

The activations (`SAEConfig.activation`):
  topk       the k largest pre-activations of each row, through a ReLU (Gao et al. 2024)
  batchtopk  the k·B largest of a batch of B rows (k a row on average); at inference a threshold,
             set from training batches, keeps what a batch would (Bussmann et al. 2024)
  jumprelu   pre where pre > θ (a learned threshold per latent), its L0 penalised through a
             straight-through estimator of the step's gradient (Rajamanoharan et al. 2024)
  relu       ReLU and an L1 penalty weighted by the decoder rows' norms (Bricken et al. 2023)

A **transcoder** (Dunefsky et al. 2024) is the same dictionary from one point to another: `d_out` > 0
reads x (d_in: an MLP's input) and writes y (d_out: its output), with no pre-encoder bias (b_dec lives
in y's space), and `skip` adds a learned linear map x W_skip ("skip transcoders", Paulo et al. 2025):

    z = activation(x W_enc + b_enc),   ŷ = z W_dec + b_dec (+ x W_skip)

The decoder's rows are unit vectors by construction (W_dec is the parameter divided by its row norms)
for every activation but relu, whose L1 penalty is weighted by the norms instead: the recipe of each.
TopK and BatchTopK add AuxK (Gao et al.): the aux_k largest pre-activations among dead latents
reconstruct the residual error, weighted 1/32, which gives dead latents a gradient.

Two params are statistics that each training step sets rather than learns (`sae_loss` returns their
new values; the loop writes them, transformer.train): `since_fired`, the tokens since each latent
last fired (dead: at least `dead_tokens`), and BatchTopK's inference `threshold`, a moving average
of the smallest activation the batch selection keeps (SAELens's). Kept in the params, they are
checkpointed, restored and sharded with the SAE.

    >>> sae = SAE(SAEConfig(d_in=64, d_sae=512, activation="topk", k=32))
    >>> x_hat_NxD, z_NxZ = sae.apply({"params": params}, x_NxD)
    >>> loss, parts, stats = sae_loss(sae, params, x_NxD, dead_tokens=10**6)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer import kernels
from transformer.errors import ConfigError

ACTIVATIONS = ("topk", "batchtopk", "jumprelu", "relu")


@dataclasses.dataclass(frozen=True)
class SAEConfig:
  family: ClassVar[str] = "sae"  # config.model.family (transformer.models.families())
  d_in: int = 0  # the point's width (0: taken from the activations)
  d_sae: int = 0  # latents (0: expansion x d_in)
  d_out: int = 0  # a transcoder's output width (0: an SAE, whose output is its input)
  skip: bool = False  # a transcoder's linear skip from input to output (W_skip)
  # The decoder's rows unit vectors (every activation but relu). False: taken as they are (one imported
  # from SAELens, whose decoders are not normalised: transformer.models.sae_formats).
  normalize_decoder: bool = True
  expansion: int = 8
  activation: str = "topk"  # ACTIVATIONS
  k: int = 32  # topk / batchtopk: latents a row
  l1_coefficient: float = 5.0  # relu: the L1 penalty's weight
  l0_coefficient: float = 1.0  # jumprelu: the L0 penalty's weight
  bandwidth: float = 0.05  # jumprelu: the straight-through estimator's kernel width (SAELens's)
  initial_threshold: float = 0.01  # jumprelu: θ at initialisation (SAELens's), where initial_density is 0
  # jumprelu: θ₀ per latent from the data instead: each latent fires on this share of the first rows (the
  # task's init_params; `threshold_from_data`), so that it starts sparse whatever the data's scale and a
  # latent learns from the few rows it fires on (experiments/README.md, "θ₀ from the data"); 0: initial_threshold
  initial_density: float = 1e-3
  aux_k: int = 0  # AuxK: dead latents that reconstruct the error (0: d_in // 2)
  aux_coefficient: float = 1 / 32
  decoder_init_norm: float = 0.1  # the raw decoder rows' norm at initialisation (encoder: their transpose)
  threshold_rate: float = 0.01  # batchtopk: the inference threshold's moving-average rate
  dtype: str = "float32"
  param_dtype: str = "float32"
  kernels: str = "auto"  # "auto" | "reference" | "cpu" | "accelerator": TopK's CPU form (transformer.kernels)

  def replace(self, **changes) -> SAEConfig:
    return dataclasses.replace(self, **changes)

  @property
  def latents(self) -> int:
    return self.d_sae or self.expansion * self.d_in

  @property
  def transcoder(self) -> bool:
    return self.d_out > 0

  @property
  def out_width(self) -> int:
    """The width of what the dictionary writes: d_out for a transcoder, d_in for an SAE."""
    return self.d_out or self.d_in

  @property
  def aux_latents(self) -> int:
    return self.aux_k or max(1, self.d_in // 2)

  def check(self) -> SAEConfig:
    kernels.check(self.kernels)
    if self.activation not in ACTIVATIONS:
      raise ConfigError(f"activation={self.activation!r} is not one of {', '.join(ACTIVATIONS)}")
    for name in ("expansion", "k"):
      if getattr(self, name) <= 0:
        raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
    if self.d_in < 0 or self.d_sae < 0 or self.d_out < 0:
      raise ConfigError(
        f"d_in, d_sae and d_out are widths (0: from the activations, expansion x d_in, an SAE); got "
        f"{self.d_in}, {self.d_sae}, {self.d_out}"
      )
    if self.skip and not self.d_out:
      raise ConfigError("skip is a transcoder's linear path from input to output: give d_out (0 is an SAE)")
    if self.activation in ("topk", "batchtopk") and 0 < self.latents < self.k:  # 0: not known before the activations
      raise ConfigError(f"k={self.k} is more than the {self.latents} latents; use at most {self.latents}")
    for name in (
      "l1_coefficient",
      "l0_coefficient",
      "bandwidth",
      "initial_threshold",
      "initial_density",
      "aux_coefficient",
      "threshold_rate",
    ):
      if getattr(self, name) < 0:
        raise ConfigError(f"{name} must be at least 0, got {getattr(self, name)}")
    return self


def _summed_to(g, shape: tuple[int, ...]) -> jax.Array:
  """A gradient of a broadcast value summed back to its shape (θ per latent: Z; a cross-layer
  transcoder's per layer, broadcast over rows: L x 1 x Z)."""
  g = g.sum(tuple(range(g.ndim - len(shape))))
  return g.sum(tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True).reshape(shape)


def _rectangle(u):
  """The straight-through estimator's kernel: 1 on (-1/2, 1/2)."""
  return ((u > -0.5) & (u < 0.5)).astype(u.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def jump_relu(pre, threshold, bandwidth: float):
  """pre where pre > threshold, else 0."""
  return pre * (pre > threshold)


def _jump_relu_fwd(pre, threshold, bandwidth):
  return jump_relu(pre, threshold, bandwidth), (pre, threshold)


def _jump_relu_bwd(bandwidth, saved, g):
  # Rajamanoharan et al. 2024: through pre as a gate; to θ by the kernel's pseudo-derivative.
  pre, threshold = saved
  d_pre = g * (pre > threshold)
  d_threshold = -(threshold / bandwidth) * _rectangle((pre - threshold) / bandwidth) * g
  return d_pre, _summed_to(d_threshold, threshold.shape)


jump_relu.defvjp(_jump_relu_fwd, _jump_relu_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def step(pre, threshold, bandwidth: float):
  """1 where pre > threshold: a latent fires (its sum is the L0)."""
  return (pre > threshold).astype(pre.dtype)


def _step_fwd(pre, threshold, bandwidth):
  return step(pre, threshold, bandwidth), (pre, threshold)


def _step_bwd(bandwidth, saved, g):
  pre, threshold = saved
  d_threshold = -(1.0 / bandwidth) * _rectangle((pre - threshold) / bandwidth) * g
  return jnp.zeros_like(pre), _summed_to(d_threshold, threshold.shape)


step.defvjp(_step_fwd, _step_bwd)


def top_k_mask(values_NxZ, k: int):
  """True at each row's k largest values (exactly k: ties broken by index)."""
  _, index_Nxk = jax.lax.top_k(values_NxZ, k)
  return jnp.zeros(values_NxZ.shape, bool).at[jnp.arange(values_NxZ.shape[0])[:, None], index_Nxk].set(True)


def activate(config, pre_NxZ, threshold_Z=None, train: bool = False) -> jax.Array:
  """The latents of pre-activations (N x Z) by `config.activation` (an SAE's, a transcoder's, a cross-layer
  one's a layer at a time): `threshold_Z` is JumpReLU's θ or BatchTopK's inference threshold; `train`,
  BatchTopK's selection of the batch's k·N largest instead."""
  if config.activation == "relu":
    return jax.nn.relu(pre_NxZ)
  if config.activation == "topk":
    return jax.nn.relu(pre_NxZ) * top_k_mask(pre_NxZ, config.k)
  if config.activation == "jumprelu":
    return jump_relu(pre_NxZ, threshold_Z, config.bandwidth)
  relu_NxZ = jax.nn.relu(pre_NxZ)
  if train:
    kept = top_k_mask(relu_NxZ.reshape(1, -1), config.k * pre_NxZ.shape[0]).reshape(pre_NxZ.shape)
    return relu_NxZ * kept
  return relu_NxZ * (relu_NxZ >= threshold_Z)


def encode(config, params, x_NxD) -> jax.Array:
  """The latents (N x Z, float32) of inputs in the model's units from the encoder's params alone (`W_enc`,
  `b_enc`, `input_scale`; an SAE's `b_dec`; the activation's `threshold`), in whatever dtype they are stored:
  `SAE.__call__`'s latents, for a dictionary read from its files a layer at a time, with no decoder."""
  f32 = lambda name: jnp.asarray(params[name]).astype(jnp.float32)
  x_NxD = x_NxD.astype(jnp.float32) * f32("input_scale")
  if not config.transcoder:
    x_NxD = x_NxD - f32("b_dec")
  pre_NxZ = x_NxD @ f32("W_enc") + f32("b_enc")
  threshold_Z = None
  if config.activation in ("jumprelu", "batchtopk"):
    threshold_Z = f32("threshold") if config.activation == "batchtopk" else jnp.maximum(f32("threshold"), 0.0)
  return activate(config, pre_NxZ, threshold_Z)


class SAE(nn.Module):
  """The sparse autoencoder of `SAEConfig`. `__call__(x_NxD, train)` -> (reconstruction, latents);
  `train=True` is BatchTopK's batch selection (else its inference threshold)."""

  config: SAEConfig

  def setup(self):
    cfg = self.config
    D, Z, O = cfg.d_in, cfg.latents, cfg.out_width
    dtype = jnp.dtype(cfg.param_dtype)

    # Decoder rows: random directions of norm decoder_init_norm (the raw parameter's; `decoder` makes
    # them unit vectors, and a small raw norm lets Adam turn them at its rate); the encoder starts as
    # the decoder's transpose (Gao et al.; SAELens's heuristic norm 0.1, Anthropic's April 2024 update).
    def decoder_init(key, shape, dtype=dtype):
      w = jax.random.normal(key, shape, dtype)
      return cfg.decoder_init_norm * w / jnp.linalg.norm(w, axis=1, keepdims=True)

    self.W_dec = self.param("W_dec", nn.with_logical_partitioning(decoder_init, ("mlp", "embed")), (Z, O), dtype)
    w_dec = self.W_dec
    # A transcoder's encoder (its input another space than its output) starts as random rows of the same
    # norm, not the decoder's transpose.
    encoder_init = (lambda key, shape, dtype=dtype: w_dec.T) if not cfg.transcoder else _rows_of_norm(cfg, axis=0)
    self.W_enc = self.param("W_enc", nn.with_logical_partitioning(encoder_init, ("embed", "mlp")), (D, Z), dtype)
    self.b_enc = self.param("b_enc", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("mlp",)), (Z,), dtype)
    self.b_dec = self.param(
      "b_dec", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)), (O,), dtype
    )
    zeros = nn.initializers.zeros_init()
    if cfg.skip:  # the skip path starts at zero: the latents carry everything at first
      self.W_skip = self.param("W_skip", nn.with_logical_partitioning(zeros, ("embed", None)), (D, O), dtype)
    if cfg.activation == "jumprelu":  # θ, learned: itself, not log θ (Adam moves log θ too slowly, SAELens #494)
      threshold_init = nn.initializers.constant(cfg.initial_threshold)
      self.threshold = self.param("threshold", nn.with_logical_partitioning(threshold_init, ("mlp",)), (Z,), dtype)
    if cfg.activation == "batchtopk":  # the inference threshold: set by each step (sae_loss), not learned
      self.threshold = self.param("threshold", nn.with_logical_partitioning(zeros, ("mlp",)), (Z,), dtype)
    # Tokens since each latent last fired: set by each step (sae_loss), not learned.
    self.since_fired = self.param("since_fired", nn.with_logical_partitioning(zeros, ("mlp",)), (Z,), jnp.float32)
    # The factor inputs are multiplied by (norm_scale), outputs divided by: set once, not learned. A
    # transcoder's output has its own (`output_scale`, its target's norm_scale).
    ones = nn.initializers.ones_init()
    self.input_scale = self.param("input_scale", nn.with_logical_partitioning(ones, ()), (), jnp.float32)
    if cfg.transcoder:
      self.output_scale = self.param("output_scale", nn.with_logical_partitioning(ones, ()), (), jnp.float32)

  def out_scale(self) -> jax.Array:
    """The factor of the output space: a transcoder's own, an SAE's input's."""
    return self.output_scale if self.config.transcoder else self.input_scale

  def decoder(self) -> jax.Array:
    """W_dec, Z x D: unit rows (every activation but relu, whose L1 penalty weighs their norms; and an
    imported decoder, `normalize_decoder=False`)."""
    if self.config.activation == "relu" or not self.config.normalize_decoder:
      return self.W_dec
    return self.W_dec / jnp.linalg.norm(self.W_dec, axis=1, keepdims=True)

  def jump_threshold(self) -> jax.Array:
    """JumpReLU's θ, at least 0 (SAELens clamps it in place; here the clamp passes the gradient on)."""
    return self.threshold + jax.lax.stop_gradient(jnp.maximum(self.threshold, 0.0) - self.threshold)

  def pre_activations(self, x_NxD) -> jax.Array:
    """Of inputs already multiplied by `input_scale` (the space the SAE learns in); an SAE subtracts
    b_dec first (the pre-encoder bias), a transcoder does not (its b_dec is in the output's space)."""
    return (x_NxD if self.config.transcoder else x_NxD - self.b_dec) @ self.W_enc + self.b_enc

  def encoder_bias_in(self) -> jax.Array:
    """What `pre_activations` subtracts from the input: b_dec for an SAE, zeros for a transcoder."""
    return jnp.zeros(self.config.d_in, self.b_enc.dtype) if self.config.transcoder else self.b_dec

  def skip_path(self, x_NxD) -> jax.Array | float:
    """A skip transcoder's x W_skip (scaled spaces); 0 without one."""
    return x_NxD @ self.W_skip if self.config.skip else 0.0

  def activate(self, pre_NxZ, train: bool = False) -> jax.Array:
    activation = self.config.activation
    threshold_Z = self.jump_threshold() if activation == "jumprelu" else None
    if activation == "batchtopk":
      threshold_Z = jax.lax.stop_gradient(self.threshold)
    return activate(self.config, pre_NxZ, threshold_Z, train)

  def decode(self, z_NxZ) -> jax.Array:
    return z_NxZ @ self.decoder() + self.b_dec

  def decode_top_k(self, values_Nxk, index_Nxk) -> jax.Array:
    """`decode` of latents given as each row's k values and their indices (TopK's): k decoder rows a
    row instead of all Z of them (Gao et al.'s sparse decoding)."""
    return jnp.einsum("nk,nkd->nd", values_Nxk, self.decoder()[index_Nxk]) + self.b_dec

  def __call__(self, x_NxD, train: bool = False):
    """(the reconstruction, the latents) of inputs in the model's units: scaled in, and back out. A
    transcoder's "reconstruction" is its output: the point it writes, from the one it reads."""
    x_scaled_NxD = x_NxD * self.input_scale
    z_NxZ = self.activate(self.pre_activations(x_scaled_NxD), train)
    return (self.decode(z_NxZ) + self.skip_path(x_scaled_NxD)) / self.out_scale(), z_NxZ


def sae_loss(sae: SAE, params, x_NxD, train: bool = True, dead_tokens: float | None = None, y_NxO=None):
  """(the training loss, its parts, the statistics' new values) on a batch, in the scaled space
  (inputs times `input_scale`): the squared error summed over d_in and averaged over rows, plus the
  activation's sparsity term (relu: L1 weighted by the decoder rows' norms; jumprelu: L0 through the
  step's estimator) or AuxK (topk, batchtopk: latents that have not fired for `dead_tokens`
  reconstruct the error; none when no latent is dead, or without `dead_tokens`). The statistics:
  `since_fired` after this batch and, for batchtopk in training, the inference `threshold` moved
  towards the smallest activation the batch kept. A transcoder (d_out) reconstructs its target `y_NxO`
  (the point it writes, scaled by `output_scale`) from x, its skip path included."""
  cfg = sae.config
  N = x_NxD.shape[0]
  if cfg.transcoder != (y_NxO is not None):
    raise ValueError("a transcoder's loss needs its target y_NxO, an SAE's none (it reconstructs x)")

  def inside(module: SAE):
    x_NxD_scaled = x_NxD * jax.lax.stop_gradient(module.input_scale)
    target_NxO = x_NxD_scaled if y_NxO is None else y_NxO * jax.lax.stop_gradient(module.output_scale)
    skip_NxO = module.skip_path(x_NxD_scaled)
    pre_NxZ = None  # every pre-activation, where the activation needs them
    if cfg.activation == "topk":
      top_k_encode = kernels.form("sae_top_k", kernels.resolve(cfg.kernels))
      if top_k_encode is None:  # the reference: autodiff of the top k of every pre-activation
        pre_NxZ = module.pre_activations(x_NxD_scaled)
        values_Nxk, index_Nxk = jax.lax.top_k(pre_NxZ, cfg.k)
      else:
        values_Nxk, index_Nxk = top_k_encode(x_NxD_scaled, module.encoder_bias_in(), module.W_enc, module.b_enc, cfg.k)
      values_Nxk = jax.nn.relu(values_Nxk)
      x_hat_NxD = module.decode_top_k(values_Nxk, index_Nxk) + skip_NxO
      fired_Z = jnp.zeros(cfg.latents, jnp.int32).at[index_Nxk].max((values_Nxk > 0).astype(jnp.int32)) > 0
    else:
      pre_NxZ = module.pre_activations(x_NxD_scaled)
      z_NxZ = module.activate(pre_NxZ, train)
      x_hat_NxD = module.decode(z_NxZ) + skip_NxO
      fired_Z = jnp.any(z_NxZ > 0, axis=0)
    mse = jnp.mean(jnp.sum(jnp.square(x_hat_NxD - target_NxO), -1))
    parts = {"mse": mse}
    if cfg.activation == "relu":
      parts["l1"] = cfg.l1_coefficient * jnp.mean(z_NxZ @ jnp.linalg.norm(module.W_dec, axis=1))
    elif cfg.activation == "jumprelu":
      fired_NxZ = step(pre_NxZ, module.jump_threshold(), cfg.bandwidth)
      parts["l0"] = cfg.l0_coefficient * jnp.mean(jnp.sum(fired_NxZ, -1))
    elif dead_tokens is not None:
      dead_Z = module.since_fired >= dead_tokens
      error_NxD = target_NxO - jax.lax.stop_gradient(x_hat_NxD)
      parts["aux"] = cfg.aux_coefficient * _aux_k(module, pre_NxZ, x_NxD_scaled, error_NxD, dead_Z)
    stats = {"since_fired": jnp.where(fired_Z, 0.0, module.since_fired + N)}
    if cfg.activation == "batchtopk" and train:
      smallest_kept = jnp.min(jnp.where(z_NxZ > 0, z_NxZ, jnp.inf))
      smallest_kept = jnp.where(jnp.isfinite(smallest_kept), smallest_kept, 0.0)
      old_Z = module.threshold
      moved_Z = (1 - cfg.threshold_rate) * old_Z + cfg.threshold_rate * smallest_kept
      stats["threshold"] = jax.lax.stop_gradient(jnp.where(old_Z > 0, moved_Z, smallest_kept))
    return sum(parts.values()), parts, jax.lax.stop_gradient(stats)

  return nn.apply(inside, sae)({"params": params})


def _rows_of_norm(cfg: SAEConfig, axis: int):
  """An initialiser of random directions of norm `decoder_init_norm` along `axis` (a transcoder's encoder)."""

  def init(key, shape, dtype=jnp.float32):
    w = jax.random.normal(key, shape, dtype)
    return cfg.decoder_init_norm * w / jnp.linalg.norm(w, axis=axis, keepdims=True)

  return init


def _aux_k(sae: SAE, pre_NxZ, x_NxD, error_NxD, dead_Z) -> jax.Array:
  """AuxK: the error reconstructed from the aux_k largest pre-activations among dead latents (no
  b_dec: the error has none), its squared error; 0, and not computed, when none is dead. `pre_NxZ`:
  the pre-activations of `x_NxD` (scaled inputs), or None where only the dead latents' branch needs
  them (TopK's CPU form computes only the top k's gradients)."""
  k = min(sae.config.aux_latents, sae.config.latents)
  decoder_ZxD = sae.decoder()

  def aux(x_NxD, error_NxD):
    all_pre_NxZ = sae.pre_activations(x_NxD) if pre_NxZ is None else pre_NxZ
    dead_pre_NxZ = jnp.where(dead_Z, all_pre_NxZ, -jnp.inf)
    z_NxZ = jax.nn.relu(jnp.where(top_k_mask(dead_pre_NxZ, k) & dead_Z, all_pre_NxZ, 0.0))
    return jnp.mean(jnp.sum(jnp.square(z_NxZ @ decoder_ZxD - error_NxD), -1))

  return jax.lax.cond(dead_Z.any(), aux, lambda *_: jnp.zeros((), error_NxD.dtype), x_NxD, error_NxD)


@functools.partial(jax.jit, static_argnums=0)
def calibrate(sae: SAE, params, x_NxD) -> dict:
  """BatchTopK's inference threshold from one batch of training activations, at once: the smallest
  activation the batch selection keeps, so that a row keeps what it would in that batch (Bussmann
  et al.). Training keeps a moving average of the same (`sae_loss`)."""
  if sae.config.activation != "batchtopk":
    return dict(params)
  _, z_NxZ = sae.apply({"params": params}, x_NxD, True)
  smallest_kept = jnp.min(jnp.where(z_NxZ > 0, z_NxZ, jnp.inf))
  return {**params, "threshold": jnp.full_like(params["threshold"], smallest_kept)}


@functools.partial(jax.jit, static_argnums=(0, 3))
def threshold_from_data(sae: SAE, params, x_NxD, density: float) -> dict:
  """JumpReLU's θ₀ per latent from rows of its data (in the model's units): the (1 - density) quantile of
  the latent's pre-activations, at least 0, so that each latent starts firing on `density` of the rows: a
  latent learns from the few rows it fires on, as TopK's do, and takes a feature (experiments/README.md)."""
  pre_NxZ = sae.apply({"params": params}, x_NxD * params["input_scale"], method=SAE.pre_activations)
  return {**params, "threshold": jnp.maximum(jnp.quantile(pre_NxZ, 1.0 - density, axis=0), 0.0)}


def init_decoder_bias(params, x_NxD, how: str = "mean", iterations: int = 50) -> dict:
  """b_dec set to the activations' mean, or to their geometric median (Weiszfeld's iterations: the
  point nearest all rows, which outliers move less; Bricken et al.)."""
  if how not in ("mean", "geometric_median"):
    raise ValueError(f"b_dec from {how!r}: use 'mean' or 'geometric_median'")
  centre_D = _centre(jnp.asarray(x_NxD, jnp.float32), iterations if how == "geometric_median" else 0)
  return {**params, "b_dec": centre_D.astype(params["b_dec"].dtype)}


@functools.partial(jax.jit, static_argnums=1)
def _centre(x_NxD, iterations: int) -> jax.Array:
  """The rows' mean moved by `iterations` of Weiszfeld's (0: the mean), one compiled program."""

  def weiszfeld(_, centre_D):
    weights_N = 1.0 / jnp.maximum(jnp.linalg.norm(x_NxD - centre_D, axis=1), 1e-8)
    return (weights_N[:, None] * x_NxD).sum(0) / weights_N.sum()

  return jax.lax.fori_loop(0, iterations, weiszfeld, x_NxD.mean(0))


def norm_scale(x_NxD) -> float:
  """The factor that brings the activations' mean norm to √d_in (SAELens's
  `normalize_activations="expected_average_only_in"`): an SAE trained on scaled inputs has the same
  hyperparameters at any layer and model; the factor is kept with it, and undone on its outputs."""
  x_NxD = np.asarray(x_NxD, np.float32)
  return float(np.sqrt(x_NxD.shape[1]) / np.mean(np.linalg.norm(x_NxD, axis=1)))


def latent_density(z_NxZ) -> np.ndarray:
  """Each latent's firing frequency over these rows: 0 is dead (SAELens counts a latent dead that has
  not fired in its window of tokens), above 0.1 dense."""
  return np.mean(np.asarray(z_NxZ) > 0, axis=0)


def scores(x_NxD, x_hat_NxD, z_NxZ) -> dict[str, float]:
  """SAELens's names: L0 (latents firing a row), MSE (squared error a row, summed over d_in),
  explained variance and FVU (1 - explained variance: the error's share of the data's variance)."""
  error, variance, l0 = map(float, _score_sums(x_NxD, x_hat_NxD, z_NxZ))
  explained = 1.0 - error / variance
  return {"l0": l0, "mse": error / x_NxD.shape[0], "explained_variance": explained, "fvu": 1.0 - explained}


@jax.jit
def _score_sums(x_NxD, x_hat_NxD, z_NxZ):
  """The squared error, the data's variance (both summed) and L0: one compiled program."""
  error = jnp.sum(jnp.square(x_hat_NxD - x_NxD))
  variance = jnp.sum(jnp.square(x_NxD - x_NxD.mean(0)))
  return error, variance, jnp.mean(jnp.sum(z_NxZ > 0, -1))


def recovery(learned_ZxD, true_FxD, found_at: float = 0.9) -> dict[str, float]:
  """How well learned directions (a decoder's rows) recover known ones: the mean over true features of
  their best cosine similarity with a learned one, the share of true features whose best is at least
  `found_at` (`recovered`), and the mean cosine of a one-to-one matching (Hungarian: the mean
  correlation coefficient, MCC, of dictionary-learning papers)."""
  from scipy.optimize import linear_sum_assignment  # here: importing SciPy's optimizers takes 0.2 s, every process

  unit = lambda m: m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
  cosine_FxZ = unit(np.asarray(true_FxD)) @ unit(np.asarray(learned_ZxD)).T
  rows, cols = linear_sum_assignment(-cosine_FxZ)
  best_F = cosine_FxZ.max(1)
  return {
    "mean_max_cosine": float(best_F.mean()),
    "recovered": float(np.mean(best_F >= found_at)),
    "mcc": float(cosine_FxZ[rows, cols].mean()),
  }
