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
import numpy as np

from transformer.errors import UserError
from transformer.interp.interventions import next_token_nll
from transformer.layers.points import functions_at, split_path
from transformer.models import sae as sae_lib
from transformer.models.clt import CLTConfig, CrossLayerTranscoder, activation
from transformer.models.sae import SAE
from transformer.models.tracer_formats import LayerFile, refuse_unless_fits

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

  # What the attribution graph reads of a layer on the host, a piece at a time, so that a kind whose params stay
  # in their files (StreamedTranscoders) reads no more than these: a layer's encoder to encode, and the rows of
  # the latents that fire.
  @abc.abstractmethod
  def latents(self, layer: int, x_TxD) -> np.ndarray:
    """Layer `layer`'s latents (T x Z, float32) of its input, on the host."""

  def decoder_rows(self, layer: int, latents_k) -> tuple[np.ndarray, int]:
    """(k x M x D: these latents' output vectors, float32; the first layer they write)."""
    dec_ZxMxD, first = self.decoders(self.params, layer)
    return np.asarray(dec_ZxMxD, np.float32)[np.asarray(latents_k, np.int64)], first

  def encoder_rows(self, layer: int, latents_k) -> np.ndarray:
    """k x D, float32: these latents' `encoders` directions."""
    return np.asarray(self.encoders(self.params, layer), np.float32).T[np.asarray(latents_k, np.int64)]

  def in_memory(self) -> Transcoders:
    """These transcoders with every param in memory (what the traced methods above need)."""
    return self

  @abc.abstractmethod
  def fixed_part(self) -> Transcoders:
    """These transcoders with only the params of what they write whatever fires (the output biases, skip paths
    and their scales): what the replacement model's backward passes read, and the same compiled programs
    whether the features are in memory or in their files."""

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

  def latents(self, layer: int, x_TxD) -> np.ndarray:
    return np.asarray(_sae_latents(self.saes[layer].config, self.params[layer], x_TxD))

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

  def fixed_part(self) -> PerLayerTranscoders:
    fixed = tuple(
      {k: v for k, v in p.items() if k in ("b_dec", "W_skip", "input_scale", "output_scale")} for p in self.params
    )
    return PerLayerTranscoders(self.saes, fixed, self.point_in, self.point_out)


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

  def latents(self, layer: int, x_TxD) -> np.ndarray:
    encoder = {k: v for k, v in self.params.items() if k in ("W_enc", "b_enc", "input_scale", "threshold")}
    return np.asarray(_clt_latents(self.clt.config, encoder, layer, x_TxD))

  def decoders(self, params, layer: int) -> tuple[jax.Array, int]:
    return params[f"W_dec_{layer}"] / params["output_scale"][layer:, None], layer

  def encoders(self, params, layer: int) -> jax.Array:
    return params["W_enc"][layer] * params["input_scale"][layer]

  def output_bias(self, params, layer: int) -> jax.Array:
    return params["b_dec"][layer] / params["output_scale"][layer]

  def unboxed(self) -> CrossLayerTranscoders:
    return self.with_params(nn.unbox(self.params))

  def fixed_part(self) -> CrossLayerTranscoders:
    return self.with_params({k: v for k, v in self.params.items() if k in ("b_dec", "output_scale")})


@dataclasses.dataclass(frozen=True)
class StreamedTranscoders(PerLayerTranscoders):
  """One transcoder a layer whose features stay in their files (`files[l]`: tracer_formats.LayerFile), read a
  piece at a time in their stored dtype: each layer's encoder while that layer is encoded, and the encoder and
  decoder rows of the latents that fire. `params[l]` holds what the replacement model needs of the rest (the
  output bias, a skip path, the scales): a published set (Qwen3-0.6B's: 28 layers of 163,840 latents, 18.8 GB
  in bfloat16) that could never be held whole gives its graph in the memory of one layer's encoder."""

  files: tuple[LayerFile, ...] = ()

  @classmethod
  def of(cls, files: list[LayerFile], point_in: str, point_out: str) -> StreamedTranscoders:
    saes = tuple(SAE(f.config) for f in files)
    return cls(saes, tuple(jax.device_put(f.small_params()) for f in files), point_in, point_out, tuple(files))

  def latents(self, layer: int, x_TxD) -> np.ndarray:
    return np.asarray(_sae_latents(self.saes[layer].config, self.files[layer].encoder(), x_TxD))

  def decoder_rows(self, layer: int, latents_k) -> tuple[np.ndarray, int]:
    rows_kxD = self.files[layer].rows("W_dec", latents_k) / np.asarray(self.params[layer]["output_scale"])
    return rows_kxD[:, None], layer

  def encoder_rows(self, layer: int, latents_k) -> np.ndarray:
    return self.files[layer].rows("W_enc", latents_k) * np.asarray(self.params[layer]["input_scale"])

  def encode(self, params, layer: int, x_NxD) -> jax.Array:
    raise self._whole_needed()

  def decoders(self, params, layer: int) -> tuple[jax.Array, int]:
    raise self._whole_needed()

  def encoders(self, params, layer: int) -> jax.Array:
    raise self._whole_needed()

  def _whole_needed(self) -> UserError:
    return UserError("these transcoders are read from their files a piece at a time: .in_memory() reads them whole")

  def in_memory(self) -> PerLayerTranscoders:
    needed = 4 * sum(f.values() for f in self.files)
    refuse_unless_fits(needed, "reading its transcoders whole in float32", self.files[0].path.parent)
    layers = [f.load() for f in self.files]
    params = tuple(jax.device_put(p) for _, p in layers)
    return PerLayerTranscoders(self.saes, params, self.point_in, self.point_out)


@functools.partial(jax.jit, static_argnums=0)
def _sae_latents(config, params, x_TxD) -> jax.Array:
  return sae_lib.encode(config, params, x_TxD)


@functools.partial(jax.jit, static_argnums=0)
def _clt_latents(config: CLTConfig, params, layer, x_TxD) -> jax.Array:
  at = {k: jax.lax.dynamic_index_in_dim(v, layer, keepdims=False) for k, v in params.items()}
  pre_TxZ = (x_TxD.astype(jnp.float32) * at["input_scale"]) @ at["W_enc"] + at["b_enc"]
  return activation(config, pre_TxZ, at.get("threshold"))


def replacement_losses(model, params, tokens_BxT, tc: Transcoders) -> dict[str, float]:
  """The next-token loss on these windows of the model (`clean`), of the replacement model (`replaced`:
  every MLP's output the transcoders' of the stream as it is in that run), and with every MLP's output zeroed
  (`zero_mlp`); `score` = (zero_mlp - replaced) / (zero_mlp - clean): 1, the transcoders lose nothing."""
  tc = tc.check(model).unboxed().in_memory()
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
