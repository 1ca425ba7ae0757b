"""The model with its MLPs replaced by transcoders: one a layer (SAEs with `d_out`, transformer.models.sae) or
one cross-layer transcoder (transformer.models.clt), behind one set of functions that the attribution graph
(transformer.interp.graph), the SAE task's evaluation and the studies share, in the model's units (the
dictionaries' scales folded in).

    >>> tc = PerLayerTranscoders((sae_0, sae_1), (p_0, p_1))    # or CrossLayerTranscoders(clt, p)
    >>> losses = replacement_losses(model, params, tokens_BxT, tc)    # clean, every MLP replaced, every MLP zeroed

The **replacement model** runs each layer's transcoder on the stream as it is in that run (each layer's MLP
input, after the earlier layers' replacements) and writes its output in place of the MLP's: the model the
graph explains, and the loss that says how much of the model it is.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.errors import UserError
from transformer.interp.interventions import next_token_nll
from transformer.layers.points import functions_at, split_path
from transformer.models.clt import CrossLayerTranscoder, activation
from transformer.models.sae import SAE

# Where a transcoder the replacement model splices in reads (the MLP branch's stream, ln_2's normalised input
# before its weight, or the MLP's own input after it: circuit-tracer's mlp.hook_in) and writes (what the block
# adds; `mlp_output`, circuit-tracer's mlp.hook_out, is that wherever no norm follows the MLP).
POINTS_IN = ("mlp_in", "resid_mid", "ln_2.normalized", "mlp_input")
POINTS_OUT = ("mlp_out", "mlp_output")


class Transcoders(abc.ABC):
  """A model's MLPs as features, reading `point_in` and writing `point_out` of each block: what the replacement
  model, the graph and the studies ask of any kind of transcoder. Two kinds implement it: `PerLayerTranscoders`
  (one SAE with `d_out` a layer) and `CrossLayerTranscoders` (one `CrossLayerTranscoder` whose layer l latents
  write layers l..L-1). Each method takes the params apart from the modules (they are traced, the modules and
  points static: `static()` is what a compiled program is keyed on) and answers in the model's units (the
  dictionaries' input and output scales folded in)."""

  params: Any
  point_in: str
  point_out: str

  @property
  @abc.abstractmethod
  def num_layers(self) -> int: ...

  @abc.abstractmethod
  def configs(self) -> list:
    """The config of each dictionary: an SAEConfig a layer, or the one CLTConfig of a cross-layer transcoder."""

  @abc.abstractmethod
  def encode(self, params, layer: int, x_NxD) -> jax.Array:
    """Layer `layer`'s latents (N x Z) of its input."""

  @abc.abstractmethod
  def decoders(self, params, layer: int) -> tuple[jax.Array, int]:
    """(Z x M x D: layer `layer`'s latents' output vectors to the M layers they write; the first of those)."""

  @abc.abstractmethod
  def encoders(self, params, layer: int) -> jax.Array:
    """D x Z: the directions whose dot product with layer `layer`'s input gives each latent's pre-activation
    (less its bias)."""

  @abc.abstractmethod
  def output_bias(self, params, layer: int) -> jax.Array: ...

  def skip(self, params, layer: int, x_NxD) -> jax.Array:
    """A skip transcoder's linear path of layer `layer`; 0 without one."""
    return jnp.zeros((), jnp.float32)

  @abc.abstractmethod
  def unboxed(self) -> Transcoders:
    """These transcoders with their params as plain arrays (a workdir's are boxed with their sharding)."""

  def static(self) -> Transcoders:
    """The modules and points without the params: hashable, what a compiled program is specialised to."""
    return dataclasses.replace(self, params=None)

  def with_params(self, params) -> Transcoders:
    return dataclasses.replace(self, params=params)

  def check(self, model) -> Transcoders:
    cfg = model.config
    if self.num_layers != cfg.num_layers:
      raise UserError(
        f"a replacement model needs a transcoder at each of the model's {cfg.num_layers} layers; got "
        f"{self.num_layers}: train one a layer (--config.point={self.point_in} --config.target_point={self.point_out})"
        " or a cross-layer one (--config.cross_layer)"
      )
    D = cfg.block.d_model
    for layer, config in enumerate(self.configs()):
      if not config.transcoder:
        raise UserError(f"the dictionary of layer {layer} is an SAE, not a transcoder (it has no d_out)")
      if (config.d_in, config.d_out) != (D, D):
        raise UserError(
          f"the transcoder of layer {layer} maps {config.d_in} -> {config.d_out} wide rows; this model's "
          f"{self.point_in} and {self.point_out} are {D} wide: it was trained for another model"
        )
    if len({c.latents for c in self.configs()}) > 1:
      raise UserError(
        f"transcoders of different widths ({sorted({c.latents for c in self.configs()})}): give one width"
      )
    if self.point_out not in POINTS_OUT or self.point_in not in POINTS_IN:
      raise UserError(
        f"a replacement model replaces MLPs: transcoders from {', '.join(POINTS_IN[:-1])} or {POINTS_IN[-1]} "
        f"to mlp_out (or mlp_output), not {self.point_in} -> {self.point_out}"
      )
    if self.point_out == "mlp_output" and cfg.block.branch_norms != "pre":
      raise UserError(
        "these transcoders write the MLP's output before the norm after it (mlp_output, circuit-tracer's "
        f"mlp.hook_out), and this model's blocks have norms after their branches (branch_norms="
        f"{cfg.block.branch_norms!r}, as Gemma 2 and 3 and OLMo 2): the replacement model here splices in what the "
        "block adds (mlp_out, hook_mlp_out); give transcoders that write hook_mlp_out"
      )
    return self


@dataclasses.dataclass(frozen=True)
class PerLayerTranscoders(Transcoders):
  """One transcoder a layer (`saes[l]`, SAEs with `d_out`; `params[l]` its params), each writing its own layer."""

  saes: tuple[SAE, ...]
  params: Any = ()
  point_in: str = "mlp_in"
  point_out: str = "mlp_out"

  @property
  def num_layers(self) -> int:
    return len(self.saes)

  def configs(self) -> list:
    return [sae.config for sae in self.saes]

  def encode(self, params, layer: int, x_NxD) -> jax.Array:
    return self.saes[layer].apply({"params": params[layer]}, x_NxD.astype(jnp.float32))[1]

  def decoders(self, params, layer: int) -> tuple[jax.Array, int]:
    p = params[layer]
    return (self.saes[layer].apply({"params": p}, method=SAE.decoder) / p["output_scale"])[:, None], layer

  def encoders(self, params, layer: int) -> jax.Array:
    return params[layer]["W_enc"] * params[layer]["input_scale"]

  def output_bias(self, params, layer: int) -> jax.Array:
    return params[layer]["b_dec"] / params[layer]["output_scale"]

  def skip(self, params, layer: int, x_NxD) -> jax.Array:
    p = params[layer]
    if "W_skip" not in p:
      return super().skip(params, layer, x_NxD)
    return (x_NxD.astype(jnp.float32) * p["input_scale"]) @ p["W_skip"] / p["output_scale"]

  def unboxed(self) -> PerLayerTranscoders:
    return self.with_params(tuple(nn.unbox(p) for p in self.params))


@dataclasses.dataclass(frozen=True)
class CrossLayerTranscoders(Transcoders):
  """One cross-layer transcoder (`clt`, `params` its own) over every layer: layer l's latents read layer l's
  input and write layers l..L-1."""

  clt: CrossLayerTranscoder
  params: Any = ()
  point_in: str = "mlp_in"
  point_out: str = "mlp_out"

  @property
  def num_layers(self) -> int:
    return self.clt.config.layers

  def configs(self) -> list:
    return [self.clt.config]

  def encode(self, params, layer: int, x_NxD) -> jax.Array:
    x_NxD = x_NxD.astype(jnp.float32) * params["input_scale"][layer]
    threshold_Z = params["threshold"][layer] if "threshold" in params else None
    return activation(self.clt.config, x_NxD @ params["W_enc"][layer] + params["b_enc"][layer], threshold_Z)

  def decoders(self, params, layer: int) -> tuple[jax.Array, int]:
    return params[f"W_dec_{layer}"] / params["output_scale"][layer:, None], layer

  def encoders(self, params, layer: int) -> jax.Array:
    return params["W_enc"][layer] * params["input_scale"][layer]

  def output_bias(self, params, layer: int) -> jax.Array:
    return params["b_dec"][layer] / params["output_scale"][layer]

  def unboxed(self) -> CrossLayerTranscoders:
    return self.with_params(nn.unbox(self.params))


def outputs(tc: Transcoders, params, z_LxNxZ, inputs_LxNxD) -> jax.Array:
  """Every layer's output (L x N x D, model units) from every layer's latents (and inputs: skip paths)."""
  L = tc.num_layers
  y = [tc.output_bias(params, m) + tc.skip(params, m, inputs_LxNxD[m]) for m in range(L)]
  y_LxNxD = jnp.stack([jnp.broadcast_to(v, inputs_LxNxD.shape[1:]) for v in y])
  for layer in range(L):
    dec_ZxMxD, first = tc.decoders(params, layer)
    y_LxNxD = y_LxNxD.at[first : first + dec_ZxMxD.shape[1]].add(jnp.einsum("ns,smd->mnd", z_LxNxZ[layer], dec_ZxMxD))
  return y_LxNxD


def replacement_losses(model, params, tokens_BxT, tc: Transcoders) -> dict[str, float]:
  """The next-token loss on these windows of the model (`clean`), of the replacement model (`replaced`:
  every MLP's output the transcoders' of the stream as it is in that run), and with every MLP's output zeroed
  (`zero_mlp`); `score` = (zero_mlp - replaced) / (zero_mlp - clean): 1, the transcoders lose nothing."""
  tc = tc.check(model).unboxed()
  clean, replaced, zero = map(float, _losses(model, tc.static(), nn.unbox(params), tc.params, tokens_BxT))
  score = (zero - replaced) / (zero - clean) if zero != clean else float("nan")
  return {"clean": clean, "replaced": replaced, "zero_mlp": zero, "score": score}


@functools.partial(jax.jit, static_argnums=(0, 1))
def _losses(model, static: Transcoders, params, tc_params, tokens_BxT):
  tc = static.with_params(tc_params)
  mean_loss = lambda logits: next_token_nll(logits, tokens_BxT).mean()
  clean = mean_loss(model.apply({"params": params}, tokens_BxT))
  with functions_at(_replacing(tc, tc_params), (tc.point_in.rsplit(".", 1)[-1], "mlp_out")):
    replaced = mean_loss(model.apply({"params": params}, tokens_BxT))
  with functions_at(lambda path, x: jnp.zeros_like(x), ("mlp_out",)):
    zero = mean_loss(model.apply({"params": params}, tokens_BxT))
  return clean, replaced, zero


def _replacing(tc: Transcoders, tc_params):
  """A `functions_at` function that replaces each MLP's output by the transcoders' on the live stream."""
  z, live = {}, {}

  def replace(path, x):
    name, layer, _ = split_path(path)
    if name == tc.point_in:
      live[layer] = x
      z[layer] = tc.encode(tc_params, layer, x.reshape(-1, x.shape[-1]))
    if name != "mlp_out":
      return x
    y = tc.output_bias(tc_params, layer) + tc.skip(tc_params, layer, live[layer])
    for source in range(layer + 1):
      dec_ZxMxD, first = tc.decoders(tc_params, source)
      if first + dec_ZxMxD.shape[1] > layer:
        y = y + (z[source] @ dec_ZxMxD[:, layer - first]).reshape(x.shape)
    return y.astype(x.dtype)

  return replace
