"""A run's activations with the residual stream's algebra (TransformerLens's `ActivationCache`).

A pre-LN GPT's residual stream is a sum: the embeddings, then what each attention layer and each
MLP adds. With a norm's scale held at the value the run recorded (`ln_f.scale`: TransformerLens's
`hook_scale`), the norm is linear, so the logit of a token splits into what each piece of the
stream contributes (direct logit attribution):

    >>> logits, cache = interventions.run_with_cache(model, params, tokens_BxT)
    >>> parts_NxBxTxD, labels = cache.decompose_resid(return_labels=True)
    >>> attrs_NxBxT = cache.logit_attrs(parts_NxBxTxD, tokens=answer_B[:, None], incorrect_tokens=wrong_B[:, None])
    >>> heads_NxBxTxD = cache.stack_head_results(layer=2)   # every head of layers 0 and 1
    >>> lens_LxBxTxV = cache.logit_lens()                   # what the stream predicts after each layer
    >>> parts = cache.direct_logit_attribution(target_BxT)  # {"embed": B x T, "L0.H1": ..., "L1.mlp": ...}

Method names, arguments, labels and stack orders are TransformerLens's (`accumulated_resid`,
`decompose_resid`, `stack_head_results`, `apply_ln` for its `apply_ln_to_stack`, `logit_attrs`), and
tests/test_activation_cache.py holds them equal to TransformerLens on the same weights. One addition:
our weights are never folded, so `logit_attrs` reads a token's direction through the final norm's
learned scale (`fold_norm=True`, what TransformerLens's `fold_ln` would have put into W_U); with
`fold_norm=False` it is the head's row alone, as TransformerLens on unfolded weights.
"""

from __future__ import annotations

import collections.abc
import functools

import jax
import jax.numpy as jnp
import numpy as np

from transformer import layers
from transformer.jit_args import join_static, split_static
from transformer.layers.points import Point
from transformer.models import gpt


def _compiled(method):
  """The algebra method as one compiled program per cache layout and arguments: run eagerly, each of
  its slices, stacks and products would compile on its own for every new shape. The cache's
  activations and params and the array arguments are traced; the Python ones (layer, flags, a token
  id) are part of the program. Labels depend only on those, so they are kept from its tracing."""
  labels_of = {}

  @functools.partial(jax.jit, static_argnums=(0, 1, 2))
  def program(model, layout, static, activations, params, array_args, array_kwargs):
    args, kwargs = join_static(array_args, array_kwargs, static)
    out = method(ActivationCache(activations, model, params), *args, **kwargs)
    if kwargs.get("return_labels"):
      out, labels_of[(model, layout, static)] = out
    return out

  @functools.wraps(method)
  def run(self, *args, **kwargs):
    (array_args, array_kwargs), static = split_static(args, kwargs)
    layout = tuple(sorted((name, np.shape(value)) for name, value in self._activations.items()))
    out = program(self.model, layout, static, self._activations, self.params, array_args, array_kwargs)
    return (out, labels_of[(self.model, layout, static)]) if kwargs.get("return_labels") else out

  return run


# Where a point's heads are, after its layer is taken: the scores and pattern B x H x T x S, the rest B x T x H x ...
_HEAD_AXIS = {"attn_scores": 1, "pattern": 1} | dict.fromkeys(
  ("q_input", "k_input", "v_input", "q", "k", "v", "rot_q", "rot_k", "z", "result"), 2
)


class ActivationCache(collections.abc.Mapping):
  """{point name: activation} of one run (a block's points with a leading layer axis), with the model
  and params that made it, for the residual stream's algebra. Stacks are N x B x T x D."""

  def __init__(self, activations: dict, model, params):
    self._activations = dict(activations)
    self.model = model
    self.params = params

  def __getitem__(self, name) -> jax.Array:
    """A point by our name (`resid_post`: every block's, L x ...), one block's or head's (`L3.resid_post`,
    `L3H5.z`, a `Point`), or TransformerLens's name (`blocks.3.hook_resid_post`, `hook_embed`)."""
    if isinstance(name, str) and name in self._activations:
      return self._activations[name]
    point = Point.parse(name)
    if point.name not in self._activations:
      raise KeyError(
        f"this cache has no {str(point)!r}: it holds {', '.join(sorted(self._activations)) or 'nothing'}; "
        f"run run_with_cache without names (or with {point.name!r} among them)"
      )
    x = self._activations[point.name]
    if point.layer is not None:
      x = x[point.layer]
    if point.head is not None:
      axis = _HEAD_AXIS.get(point.name.rsplit(".", 1)[-1])
      if axis is None:
        raise KeyError(f"{point.name!r} has no heads' axis: name it without a head ({point.name!r} or L<layer>.)")
      x = jnp.take(x, point.head, axis=axis + (point.layer is None))
    return x

  def __iter__(self):
    return iter(self._activations)

  def __len__(self) -> int:
    return len(self._activations)

  def __repr__(self) -> str:
    return f"ActivationCache({', '.join(f'{k}: {tuple(v.shape)}' for k, v in sorted(self._activations.items()))})"

  @property
  def _config(self):
    config = self.model.config
    if not isinstance(config, gpt.GPTConfig) or not config.block.pre_layer_norm:
      raise ValueError("the residual stream's algebra is a pre-LN GPT's (a sum of what each layer adds)")
    return config

  def _layer(self, layer: int | None) -> int:
    L = self._config.num_layers
    return L if layer is None or layer == -1 else layer

  @_compiled
  def apply_ln(self, stack_NxBxTxD, layer: int | None = None, mlp_input: bool = False) -> jax.Array:
    """Each piece of a residual stack divided by the scale that the norm reading the stream at `layer`
    recorded (None or L: the final norm, `ln_f.scale`; else `ln_1`, or `ln_2` for `mlp_input`), centred
    first for LayerNorm: the norm made linear, its learned scale and bias left out (TransformerLens's
    `apply_ln_to_stack`)."""
    cfg, layer = self._config, self._layer(layer)
    if cfg.block.norm == "none":  # no norm reads the stream: nothing to divide by
      return stack_NxBxTxD
    if layer == cfg.num_layers:
      scale_BxTx1 = self["ln_f.scale"]
    else:
      scale_BxTx1 = self["ln_2.scale" if mlp_input else "ln_1.scale"][layer]
    if cfg.block.norm != "rms_norm":
      stack_NxBxTxD = stack_NxBxTxD - stack_NxBxTxD.mean(-1, keepdims=True)
    return stack_NxBxTxD / scale_BxTx1

  def _final_norm(self, stack_NxBxTxD) -> jax.Array:
    """The final norm itself (its own statistics, learned scale and bias) applied to each piece."""
    ln_f = layers.norm(self._config.block)
    return ln_f.apply({"params": self.params.get("ln_f", {})}, stack_NxBxTxD)

  @_compiled
  def accumulated_resid(
    self,
    layer: int | None = None,
    incl_mid: bool = False,
    apply_ln: bool = False,
    mlp_input: bool = False,
    return_labels: bool = False,
  ):
    """The residual stream as it stands before each layer up to `layer` (`0_pre`, `1_pre`, ...; with
    `incl_mid` also after each attention, `0_mid`; None or L: every layer and `final_post`, the stream
    the final norm reads): the logit lens's inputs. `apply_ln` at the final layer runs each through the
    final norm itself (each is a whole stream); elsewhere divides by the recorded scale."""
    L, layer = self._config.num_layers, self._layer(layer)
    pieces, labels = [], []
    for l in range(layer + 1):
      if l == L:
        pieces.append(self["resid_post"][L - 1])
        labels.append("final_post")
        continue
      pieces.append(self["resid_pre"][l])
      labels.append(f"{l}_pre")
      if (incl_mid and l < layer) or (mlp_input and l == layer):
        pieces.append(self["resid_mid"][l])
        labels.append(f"{l}_mid")
    stack_NxBxTxD = jnp.stack(pieces)
    if apply_ln:
      if layer == L:
        stack_NxBxTxD = self._final_norm(stack_NxBxTxD)
      else:
        stack_NxBxTxD = self.apply_ln(stack_NxBxTxD, layer, mlp_input)
    return (stack_NxBxTxD, labels) if return_labels else stack_NxBxTxD

  @_compiled
  def decompose_resid(
    self,
    layer: int | None = None,
    mlp_input: bool = False,
    mode: str = "all",
    apply_ln: bool = False,
    incl_embeds: bool = True,
    return_labels: bool = False,
  ):
    """The stream read at `layer` (None: the final norm's input) split into what wrote it: `embed`,
    `pos_embed`, then each earlier layer's `{l}_attn_out` and `{l}_mlp_out` (`mode`: "all", "attn" or
    "mlp"; `mlp_input`: this layer's attention too). They sum to `resid_pre` there (or the last
    `resid_post`)."""
    if mode not in ("all", "attn", "mlp"):
      raise ValueError(f"mode={mode!r}: use 'all', 'attn' or 'mlp'")
    cfg, layer = self._config, self._layer(layer)
    with_attn, with_mlp = mode != "mlp", mode != "attn" and not cfg.block.attention_only
    pieces, labels = [], []
    if incl_embeds:
      for name in ("embed", "pos_embed"):
        if name in self:
          pieces.append(jnp.broadcast_to(self[name], self["resid_pre"].shape[1:]))
          labels.append(name)
    for l in range(layer):
      if with_attn:
        pieces.append(self["attn_out"][l])
        labels.append(f"{l}_attn_out")
      if with_mlp:
        pieces.append(self["mlp_out"][l])
        labels.append(f"{l}_mlp_out")
    if mlp_input and with_attn:
      pieces.append(self["attn_out"][layer])
      labels.append(f"{layer}_attn_out")
    stack_NxBxTxD = jnp.stack(pieces)
    if apply_ln:
      stack_NxBxTxD = self.apply_ln(stack_NxBxTxD, layer, mlp_input)
    return (stack_NxBxTxD, labels) if return_labels else stack_NxBxTxD

  @_compiled
  def head_results(self) -> jax.Array:
    """Each head's result (L x B x T x H x D: its output through its slice of the output projection,
    bias apart): the recorded `result`, or made from `z` when the cache kept only that."""
    if "result" in self:
      return self["result"]
    blocks = self.params["h"]
    if self._config.scan_layers:
      kernel_LxHxKxD = blocks["layers"]["attn"]["out"]["kernel"]
    else:
      kernel_LxHxKxD = jnp.stack(
        [blocks[f"layer_{i}"]["attn"]["out"]["kernel"] for i in range(self._config.num_layers)]
      )
    return jnp.einsum("lbthk,lhkd->lbthd", self["z"], kernel_LxHxKxD)

  @_compiled
  def stack_head_results(self, layer: int | None = None, apply_ln: bool = False, return_labels: bool = False):
    """Every head's result in the layers before `layer` (None: all), as a stack (`L0H0`, `L0H1`, ...;
    layer by layer), e.g. for `logit_attrs` per head."""
    layer = self._layer(layer)
    result_LxBxTxHxD = self.head_results()[:layer]
    L, B, T, H, D = result_LxBxTxHxD.shape
    stack_NxBxTxD = result_LxBxTxHxD.transpose(0, 3, 1, 2, 4).reshape(L * H, B, T, D)
    labels = [f"L{l}H{h}" for l in range(L) for h in range(H)]
    if apply_ln:
      stack_NxBxTxD = self.apply_ln(stack_NxBxTxD, layer)
    return (stack_NxBxTxD, labels) if return_labels else stack_NxBxTxD

  @_compiled
  def residual_directions(self, tokens, fold_norm: bool = True) -> jax.Array:
    """The direction in the (normalised) stream that each token's logit reads (... x D): the head's
    row, times the final norm's learned scale when `fold_norm` (the logit a normalised piece adds)."""
    cfg = self._config
    head_VxD = gpt.unembedding(cfg, self.params)
    if fold_norm and "ln_f" in self.params:
      head_VxD = head_VxD * self.params["ln_f"]["scale"]
    return head_VxD[jnp.asarray(tokens)]

  @_compiled
  def logit_attrs(
    self,
    stack_NxBxTxD,
    tokens=None,
    incorrect_tokens=None,
    *,
    direction=None,
    layer: int | None = None,
    apply_ln: bool = True,
    fold_norm: bool = True,
  ):
    """Each piece's contribution (N x B x T) along a direction of the stream: a token's logit
    (`tokens`: an id, or ids broadcast to B x T), the difference of two (`incorrect_tokens`), or any
    `direction` (D, or B x T x D: e.g. a probe's weight). The pieces first pass through `apply_ln` at
    `layer` (None: the final norm, as for a logit; `apply_ln=False`: as they are), as
    TransformerLens's `logit_attrs` does. They do not sum to the logit: the final norm's bias is no piece
    of the stream, as in TransformerLens; `direct_logit_attribution` (below, and `launch.probe --attribute`)
    adds it as a component of its own, and its components sum to the logit."""
    if direction is None:
      if tokens is None:
        raise ValueError("logit_attrs needs tokens (and optionally incorrect_tokens) or a direction")
      direction = self.residual_directions(tokens, fold_norm)
      if incorrect_tokens is not None:
        direction = direction - self.residual_directions(incorrect_tokens, fold_norm)
    elif tokens is not None or incorrect_tokens is not None:
      raise ValueError("logit_attrs takes tokens or a direction, not both")
    if apply_ln:
      stack_NxBxTxD = self.apply_ln(stack_NxBxTxD, layer)
    return jnp.sum(stack_NxBxTxD * direction, axis=-1)

  @_compiled
  def logit_lens(self, incl_mid: bool = False) -> jax.Array:
    """The logits (N x B x T x V) the stream would give if the model stopped before each layer (and at
    its end, the model's own logits): each `accumulated_resid` through the final norm and the head
    (nostalgebraist 2020), for every sequence and position at once."""
    stack_NxBxTxD = self.accumulated_resid(incl_mid=incl_mid)
    return jax.vmap(lambda x: self.model.apply({"params": self.params}, x, method=gpt.GPT.output_logits))(stack_NxBxTxD)

  @_compiled
  def direct_logit_attribution(self, target_BxT) -> dict[str, jax.Array]:
    """Each component's direct contribution to the logit of `target_BxT` (a token id per position),
    {component: B x T}: the token and position embeddings, every head (`L0.H1`), each layer's
    attention output bias and MLP, and the final norm's bias. Each passes through the final norm with
    the run's own scale (which makes the norm linear in the residual stream), then the head; the
    contributions sum to the logit before any soft-capping."""
    cfg, params = self._config, self.params
    blocks = layers.unstack_layers(params["h"], cfg.num_layers) if cfg.scan_layers else params["h"]
    B, T = target_BxT.shape
    parts, names = [], []
    for name in ("embed", "pos_embed"):
      if name in self:
        parts.append(jnp.broadcast_to(self[name], (B, T, cfg.block.d_model)))
        names.append(name)
    heads_NxBxTxD = self.stack_head_results()
    H = cfg.block.num_heads
    for i in range(cfg.num_layers):
      parts.extend(heads_NxBxTxD[i * H : (i + 1) * H])
      names.extend(f"L{i}.H{h}" for h in range(H))
      out = blocks[f"layer_{i}"]["attn"]["out"]
      if "bias" in out:
        parts.append(jnp.broadcast_to(out["bias"], (B, T, cfg.block.d_model)))
        names.append(f"L{i}.attn_bias")
      if not cfg.block.attention_only:
        parts.append(self["mlp_out"][i])
        names.append(f"L{i}.mlp")
    attrs_NxBxT = self.logit_attrs(jnp.stack(parts).astype(jnp.float32), target_BxT)
    out = dict(zip(names, attrs_NxBxT))
    if "bias" in params.get("ln_f", {}):
      bias_1x1x1xD = params["ln_f"]["bias"][None, None, None]
      out["final_norm_bias"] = self.logit_attrs(bias_1x1x1xD, target_BxT, apply_ln=False, fold_norm=False)[0]
    return out
