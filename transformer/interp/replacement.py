"""The model with its MLPs replaced by transcoders: one a layer (SAEs with `d_out`, transformer.models.sae) or
one cross-layer transcoder (transformer.models.clt), behind one set of functions that the attribution graph
(transformer.interp.graph), the SAE task's evaluation and the studies share, in the model's units (the
dictionaries' scales folded in).

    >>> tc = Transcoders(saes=(sae_0, sae_1), params=(p_0, p_1))       # or Transcoders(clt=clt, params=p)
    >>> losses = replacement_losses(model, params, tokens_BxT, tc)    # clean, every MLP replaced, every MLP zeroed

The **replacement model** runs each layer's transcoder on the stream as it is in that run (each layer's MLP
input, after the earlier layers' replacements) and writes its output in place of the MLP's: the model the
graph explains, and the loss that says how much of the model it is.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.errors import UserError
from transformer.interp.interventions import next_token_nll
from transformer.layers.points import functions_at, split_path
from transformer.models.clt import CrossLayerTranscoder
from transformer.models.sae import SAE, top_k_mask

POINTS_IN = ("mlp_in", "resid_mid", "ln_2.normalized")


@dataclasses.dataclass(frozen=True)
class Transcoders:
  """A model's MLPs as features: one transcoder a layer (`saes`, `params` one a layer) or one cross-layer
  transcoder (`clt`, `params` its own), reading `point_in` and writing `point_out` of each block."""

  saes: tuple[SAE, ...] = ()
  params: Any = ()
  point_in: str = "mlp_in"
  point_out: str = "mlp_out"
  clt: CrossLayerTranscoder | None = None

  @property
  def num_layers(self) -> int:
    return self.clt.config.layers if self.clt is not None else len(self.saes)

  def configs(self) -> list:
    return [self.clt.config] if self.clt is not None else [sae.config for sae in self.saes]

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
    if self.point_out != "mlp_out" or self.point_in not in POINTS_IN:
      raise UserError(
        f"a replacement model replaces MLPs: transcoders from {', '.join(POINTS_IN[:-1])} or {POINTS_IN[-1]} "
        f"to mlp_out, not {self.point_in} -> {self.point_out}"
      )
    return self

  def unboxed(self) -> Transcoders:
    params = nn.unbox(self.params) if self.clt is not None else tuple(nn.unbox(p) for p in self.params)
    return dataclasses.replace(self, params=params)


# Each function below takes the Transcoders and their params apart (the modules static, the params traced).


def encode(tc: Transcoders, params, layer: int, x_NxD) -> jax.Array:
  """Layer `layer`'s latents (N x S) of its input in the model's units."""
  x_NxD = x_NxD.astype(jnp.float32)
  if tc.clt is None:
    return tc.saes[layer].apply({"params": params[layer]}, x_NxD)[1]
  p = params
  pre_NxS = (x_NxD * p["input_scale"][layer]) @ p["W_enc"][layer] + p["b_enc"][layer]
  return _clt_activate(tc.clt, p, layer, pre_NxS)


def _clt_activate(clt: CrossLayerTranscoder, p, layer: int, pre_NxS) -> jax.Array:
  """`CrossLayerTranscoder.activate` for one layer's pre-activations (what a live replacement reads)."""
  cfg = clt.config
  if cfg.activation == "topk":
    return jax.nn.relu(pre_NxS) * top_k_mask(pre_NxS, cfg.k)
  if cfg.activation == "jumprelu":
    return pre_NxS * (pre_NxS > jnp.maximum(p["threshold"][layer], 0.0))
  return jax.nn.relu(pre_NxS)


def decoders(tc: Transcoders, params, layer: int) -> tuple[jax.Array, int]:
  """(S x M x D: layer `layer`'s latents' output vectors to the M layers they write, in the model's units;
  the first of those layers): a transcoder's to its own layer, a cross-layer one's to it and every later."""
  if tc.clt is None:
    sae, p = tc.saes[layer], params[layer]
    return (sae.apply({"params": p}, method=SAE.decoder) / p["output_scale"])[:, None], layer
  p = params
  return p[f"W_dec_{layer}"] / p["output_scale"][layer:, None], layer


def encoders(tc: Transcoders, params, layer: int) -> jax.Array:
  """D x S: the directions whose dot product with layer `layer`'s input (model units) gives each latent's
  pre-activation (less its bias)."""
  if tc.clt is None:
    return params[layer]["W_enc"] * params[layer]["input_scale"]
  return params["W_enc"][layer] * params["input_scale"][layer]


def output_bias(tc: Transcoders, params, layer: int) -> jax.Array:
  if tc.clt is None:
    return params[layer]["b_dec"] / params[layer]["output_scale"]
  return params["b_dec"][layer] / params["output_scale"][layer]


def skip(tc: Transcoders, params, layer: int, x_NxD) -> jax.Array:
  """A skip transcoder's linear path of layer `layer` (model units); 0 without one."""
  if tc.clt is not None or "W_skip" not in params[layer]:
    return jnp.zeros((), jnp.float32)
  p = params[layer]
  return (x_NxD.astype(jnp.float32) * p["input_scale"]) @ p["W_skip"] / p["output_scale"]


def outputs(tc: Transcoders, params, z_LxNxS, inputs_LxNxD) -> jax.Array:
  """Every layer's output (L x N x D, model units) from every layer's latents (and inputs: skip paths)."""
  L = tc.num_layers
  y = [output_bias(tc, params, m) + skip(tc, params, m, inputs_LxNxD[m]) for m in range(L)]
  y_LxNxD = jnp.stack([jnp.broadcast_to(v, inputs_LxNxD.shape[1:]) for v in y])
  for layer in range(L):
    dec_SxMxD, first = decoders(tc, params, layer)
    y_LxNxD = y_LxNxD.at[first : first + dec_SxMxD.shape[1]].add(jnp.einsum("ns,smd->mnd", z_LxNxS[layer], dec_SxMxD))
  return y_LxNxD


def replacement_losses(model, params, tokens_BxT, tc: Transcoders) -> dict[str, float]:
  """The next-token loss on these windows of the model (`clean`), of the replacement model (`replaced`:
  every MLP's output the transcoders' of the stream as it is in that run), and with every MLP's output zeroed
  (`zero_mlp`); `score` = (zero_mlp - replaced) / (zero_mlp - clean): 1, the transcoders lose nothing."""
  tc = tc.check(model).unboxed()
  clean, replaced, zero = map(
    float, _losses(model, tc.saes, tc.clt, tc.point_in, nn.unbox(params), tc.params, tokens_BxT)
  )
  score = (zero - replaced) / (zero - clean) if zero != clean else float("nan")
  return {"clean": clean, "replaced": replaced, "zero_mlp": zero, "score": score}


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _losses(model, saes, clt, point_in: str, params, tc_params, tokens_BxT):
  tc = Transcoders(saes, tc_params, point_in, clt=clt)
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
      z[layer] = encode(tc, tc_params, layer, x.reshape(-1, x.shape[-1]))
    if name != "mlp_out":
      return x
    y = output_bias(tc, tc_params, layer) + skip(tc, tc_params, layer, live[layer])
    for source in range(layer + 1):
      dec_SxMxD, first = decoders(tc, tc_params, source)
      if first + dec_SxMxD.shape[1] > layer:
        y = y + (z[source] @ dec_SxMxD[:, layer - first]).reshape(x.shape)
    return y.astype(x.dtype)

  return replace
