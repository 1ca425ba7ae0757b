"""Reading and changing a model's activations at its named points (`layers.point`).

Every model family passes its activations through named points, with the names TransformerLens
users know: per block `resid_pre`, `q`, `k`, `v` (after rotary positions and qk_norm), `scores`
(masked, before the softmax), `pattern` (the attention probabilities), `z` (each head's output,
before the output projection), `attn_out`, `resid_mid`, `mlp_hidden`, `mlp_out`, `resid_post` (a
decoder block's cross-attention adds `cross_attn.q`, ..., `cross_attn_out`, `resid_mid_cross`); a
GPT's `embed`, `pos_embed`, `final_norm` and `logits`. A run that asks for nothing compiles to the
same program as a model without them.

    >>> logits, cache = run_with_cache(model, params, tokens_BxT, names=("pattern", "resid_post"))
    >>> cache["pattern"].shape          # L x B x H x T x T: a block's points have a leading layer axis
    >>> patched = run_with_patches(model, params, corrupt_BxT,
    ...                            patches={("resid_pre", 0): Patch(value=cache["resid_pre"][0])})

A model with several stacks names its points by stack: `encoder.resid_pre`, `decoder.pattern`,
`decoder.cross_attn.pattern`. Reading or patching a point takes attention's reference path (its
scores exist only there), whatever config.model.kernels and block.attention say.

"Cache" here is TransformerLens's word: the activations a run recorded (the flax collection
"activations"). Decoding's KV cache is another thing: the flax collection "cache"
(transformer.layers.kv_cache), which no function here reads.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import flax.linen as nn
import flax.traverse_util
import jax
import jax.numpy as jnp

from transformer import layers
from transformer.models import gpt

_LAYER = re.compile(r"layer_(\d+)$")
# What a patching sweep patches, by what it sweeps over: the point and the axis of the swept piece.
_SWEPT = {"positions": ("resid_pre", 1), "heads": ("z", 2)}
_SUBMODULES = ("attn", "mlp")  # a point of theirs is named without them: `q`, not `attn.q`


@dataclasses.dataclass(frozen=True)
class Patch:
  """What a patch does at one point (of one layer): `value` where `where` is True (broadcast to the
  activation: e.g. True everywhere, one position, one head), then `add` everywhere (steering)."""

  value: Any = 0.0
  where: Any = True
  add: Any = 0.0


def _split(path: tuple[str, ...]) -> tuple[str, int | None, str]:
  """A point's path in the activations tree -> (its name, its layer (None: scanned, or not in a
  block), the key its block is under: "layer_<i>" unrolled, "layers" scanned, "" outside blocks)."""
  for i, part in enumerate(path):
    match = _LAYER.match(part)
    if match or part == "layers":
      stack, rest = path[:i], path[i + 1 :]
      name = rest[-1] if len(rest) == 1 or rest[0] in _SUBMODULES else ".".join(rest)
      prefix = "" if stack == ("h",) else ".".join(stack) + "."
      return prefix + name, int(match.group(1)) if match else None, part
  return ".".join(path), None, ""


def flatten(activations: dict) -> dict[str, jax.Array]:
  """The "activations" collection of a run as {name: array}, a block's point with a leading layer
  axis (unrolled layers stacked in order, scanned ones as they come)."""
  by_layer: dict[str, dict[int, jax.Array]] = {}
  out = {}
  for path, x in flax.traverse_util.flatten_dict(activations).items():
    name, layer, _ = _split(path)
    if layer is None:
      out[name] = x
    else:
      by_layer.setdefault(name, {})[layer] = x
  for name, layers_ in by_layer.items():
    out[name] = jnp.stack([layers_[i] for i in sorted(layers_)])
  return out


@functools.partial(jax.jit, static_argnames=("model", "names"))
def _cached_run(model, params, args, kwargs, names):
  output, state = model.apply({"params": params}, *args, mutable=["activations"], **kwargs)
  cache = flatten(state["activations"])
  if names is not None:
    missing = sorted(set(names) - set(cache))
    if missing:
      raise KeyError(f"no named point {missing[0]!r} in this model; it has {', '.join(sorted(cache))}")
    cache = {name: cache[name] for name in names}  # the rest is never computed (jit drops it)
  return output, cache


def run_with_cache(model, params, *args, names: tuple[str, ...] | None = None, **kwargs):
  """(the model's output, {name: activation}) of `model.apply({"params": params}, *args, **kwargs)`,
  jit-compiled; `names` keeps only those points (memory stays that of the run and those arrays)."""
  return _cached_run(model, nn.unbox(params), args, kwargs, None if names is None else tuple(names))


def patches_collection(model, params, patches: dict, *args, **kwargs) -> dict:
  """The "patches" collection that applies `patches` ({(name, layer): Patch}; layer None for a point
  outside the blocks) to a run of `model` on these inputs. Scanned blocks take one entry per point
  with a leading layer axis, in which only the patched layers' `where` is True."""
  nn_params = nn.unbox(params)
  shapes = jax.eval_shape(lambda p: model.apply({"params": p}, *args, mutable=["activations"], **kwargs)[1], nn_params)[
    "activations"
  ]
  flat_shapes = flax.traverse_util.flatten_dict(shapes)
  by_point = {_split(path)[:2]: path for path in flat_shapes}
  scanned = {(_split(path)[0]): path for path in flat_shapes if _split(path)[2] == "layers"}
  out = {}
  for (name, layer), patch in patches.items():
    if name in scanned:
      path = scanned[name]
      L, shape = flat_shapes[path].shape[0], flat_shapes[path].shape[1:]
      entry = out.setdefault(path, _empty_scanned(L, shape))
      for field in ("value", "where", "add"):
        entry[field] = entry[field].at[layer].set(jnp.broadcast_to(getattr(patch, field), shape))
      continue
    if (name, layer) not in by_point:
      raise KeyError(f"no named point {name!r} at layer {layer} in this model")
    shape = flat_shapes[by_point[(name, layer)]].shape
    out[by_point[(name, layer)]] = {
      field: jnp.broadcast_to(jnp.asarray(getattr(patch, field)), shape) for field in ("value", "where", "add")
    }
  return flax.traverse_util.unflatten_dict(out)


def _empty_scanned(L: int, shape) -> dict:
  return {"value": jnp.zeros((L, *shape)), "where": jnp.zeros((L, *shape), bool), "add": jnp.zeros((L, *shape))}


@functools.partial(jax.jit, static_argnames=("model",))
def _patched_run(model, params, collection, args, kwargs):
  # Read as well (nothing kept): every patched run takes the reference path, as the runs it is
  # compared with (run_with_cache) do.
  return model.apply({"params": params, "patches": collection}, *args, mutable=["activations"], **kwargs)[0]


def run_with_patches(model, params, *args, patches: dict, **kwargs):
  """The model's output with `patches` ({(name, layer): Patch}) applied at its named points,
  jit-compiled, on attention's reference path (as `run_with_cache`'s runs)."""
  collection = patches_collection(model, params, patches, *args, **kwargs)
  return _patched_run(model, nn.unbox(params), collection, args, kwargs)


def direct_logit_attribution(model, params, tokens_BxT, target_BxT) -> dict[str, jax.Array]:
  """Each component's direct contribution to the logit of `target_BxT` (a token id per position) of a
  pre-LN GPT, {component: B x T}: the token and position embeddings, every head (`L0.H1`: its `z`
  through its slice of the output projection), each layer's attention output bias and MLP, and the
  final norm's bias. Each passes through the final norm with the run's own scale (its mean and
  deviation held at their values, which makes the norm linear in the residual stream), then the head;
  the contributions sum to the logit before any soft-capping."""
  cfg = model.config
  if not cfg.block.pre_layer_norm:
    raise ValueError("direct logit attribution reads a pre-LN residual stream; this model is post-LN")
  params = nn.unbox(params)
  blocks = layers.unstack_layers(params["h"], cfg.num_layers) if cfg.scan_layers else params["h"]
  _, cache = run_with_cache(model, params, tokens_BxT)
  stream_BxTxD = cache["resid_post"][-1].astype(jnp.float32)
  parts = {"embed": cache["embed"]}
  if "pos_embed" in cache:
    parts["pos_embed"] = cache["pos_embed"]
  for i in range(cfg.num_layers):
    out = blocks[f"layer_{i}"]["attn"]["out"]
    per_head_BxTxHxD = jnp.einsum("bthk,hkd->bthd", cache["z"][i], out["kernel"])
    for h in range(cfg.block.num_heads):
      parts[f"L{i}.H{h}"] = per_head_BxTxHxD[:, :, h]
    if "bias" in out:
      parts[f"L{i}.attn_bias"] = jnp.broadcast_to(out["bias"], stream_BxTxD.shape)
    if not cfg.block.attention_only:
      parts[f"L{i}.mlp"] = cache["mlp_out"][i]
  ln_f = params["ln_f"]
  eps = cfg.block.layer_norm_epsilon
  if cfg.block.norm == "rms_norm":
    centre = lambda x: x
    scale_BxTx1 = jnp.sqrt(jnp.mean(jnp.square(stream_BxTxD), -1, keepdims=True) + eps)
  else:
    centre = lambda x: x - jnp.mean(x, -1, keepdims=True)
    scale_BxTx1 = jnp.sqrt(jnp.var(stream_BxTxD, -1, keepdims=True) + eps)
  head_VxD = gpt.unembedding(cfg, params)
  unembed_BxTxD = head_VxD[target_BxT]
  logit = lambda x_BxTxD: jnp.sum(x_BxTxD * unembed_BxTxD, -1)
  out = {name: logit(centre(x.astype(jnp.float32)) / scale_BxTx1 * ln_f["scale"]) for name, x in parts.items()}
  if "bias" in ln_f:
    out["final_norm_bias"] = logit(jnp.broadcast_to(ln_f["bias"], stream_BxTxD.shape))
  return out


def repeated_random_tokens(vocab_size: int, length: int, batch: int, seed: int = 0, ids=None) -> jax.Array:
  """`batch` rows of `length` random tokens, each row its tokens twice (B x 2 * length): where only
  copying from the context predicts the second half (Olsson et al. 2022). `ids`: drawn among these
  only (e.g. the tokens that occur in the training text: a byte-level BPE has pieces that no text
  uses, whose embeddings never trained, and a head's pattern on them says little)."""
  key = jax.random.key(seed)
  if ids is None:
    first_BxN = jax.random.randint(key, (batch, length), 0, vocab_size)
  else:
    first_BxN = jnp.asarray(ids)[jax.random.randint(key, (batch, length), 0, len(ids))]
  return jnp.concatenate([first_BxN, first_BxN], axis=1)


def head_scores(model, params, tokens_BxT) -> dict[str, jax.Array]:
  """Each head's (L x H) mean attention on repeated tokens (`repeated_random_tokens`: a first copy of
  N tokens, then the same again) to: the token before (`previous_token`, every position after the
  first), the earlier occurrence of the same token (`duplicate_token`, the second copy), and the token
  after that earlier occurrence (`induction`: prefix matching, Olsson et al. 2022). 1: all of the
  head's attention there."""
  T = tokens_BxT.shape[1]
  N = T // 2
  _, cache = run_with_cache(model, params, tokens_BxT, names=("pattern",))
  pattern_LxBxHxTxT = cache["pattern"]
  after_first, second = jnp.arange(1, T), jnp.arange(N, T)
  mean_over = lambda to_LxBxHxT: to_LxBxHxT.mean(axis=(1, 3))
  return {
    "previous_token": mean_over(pattern_LxBxHxTxT[..., after_first, after_first - 1]),
    "duplicate_token": mean_over(pattern_LxBxHxTxT[..., second, second - N]),
    "induction": mean_over(pattern_LxBxHxTxT[..., second, second - N + 1]),
  }


def in_context_score(model, params, tokens_BxT) -> jax.Array:
  """The loss at the last tenth of the context minus the loss at its first tenth (nats a token; the
  in-context learning score of Olsson et al. 2022, there tokens 500 and 50, scaled to any context):
  negative where later tokens are predicted better for what came before them."""
  nll_T = next_token_losses(model, params, tokens_BxT)
  tenth = max(1, nll_T.shape[0] // 10)
  return nll_T[-tenth:].mean() - nll_T[:tenth].mean()


def patching_sweep(model, params, clean_BxT, corrupt_BxT, metric, *, over: str = "positions"):
  """Activation patching (Meng et al. 2022; Wang et al. 2023): `metric(logits_BxTxV) -> scalar` of the
  corrupted run with one piece of one layer taken from the clean run, for every piece, in one
  compiled call (vmapped over the patches, not a loop of forward passes). `over="positions"`: the
  residual stream (`resid_pre`) at each layer × position (L x T); `over="heads"`: each head's output
  (`z`, every position) at each layer × head (L x H)."""
  name, axis = _SWEPT[over]
  _, clean = run_with_cache(model, params, clean_BxT, names=(name,))
  clean_LxBx = clean[name]
  L, pieces = clean_LxBx.shape[0], clean_LxBx.shape[1 + axis]

  def patched(layer, piece):
    mask_shape = [1] * (clean_LxBx.ndim - 1)
    mask_shape[axis] = pieces
    chosen = (jnp.arange(pieces) == piece).reshape(mask_shape)
    patches = {(name, l): Patch(value=clean_LxBx[l], where=chosen & (l == layer)) for l in range(L)}
    collection = patches_collection(model, params, patches, corrupt_BxT)
    return metric(_patched_run(model, nn.unbox(params), collection, (corrupt_BxT,), {}))

  layer_LxP, piece_LxP = jnp.meshgrid(jnp.arange(L), jnp.arange(pieces), indexing="ij")
  sweep = jax.vmap(jax.vmap(patched))
  return jax.jit(sweep)(layer_LxP, piece_LxP)


def attribution_patching(model, params, clean_BxT, corrupt_BxT, metric, *, over: str = "positions"):
  """`patching_sweep`'s effects (metric of the patched run minus the corrupted run's) to first order,
  from one forward and one backward pass (Nanda 2023, "attribution patching"): (clean - corrupt
  activation) · d metric / d activation at the corrupted run, summed over each piece. L x T or L x H."""
  name, axis = _SWEPT[over]
  _, clean = run_with_cache(model, params, clean_BxT, names=(name,))
  _, corrupt = run_with_cache(model, params, corrupt_BxT, names=(name,))
  L = clean[name].shape[0]

  def metric_with(add_LxBx):
    patches = {(name, l): Patch(where=False, add=add_LxBx[l]) for l in range(L)}
    collection = patches_collection(model, params, patches, corrupt_BxT)
    return metric(_patched_run(model, nn.unbox(params), collection, (corrupt_BxT,), {}))

  grad_LxBx = jax.jit(jax.grad(metric_with))(jnp.zeros_like(corrupt[name]))
  effect_LxBx = (clean[name] - corrupt[name]) * grad_LxBx
  return effect_LxBx.sum(axis=tuple(i for i in range(1, effect_LxBx.ndim) if i != 1 + axis))


def next_token_losses(model, params, tokens_BxT, patches: dict | None = None) -> jax.Array:
  """The next-token cross-entropy at each position (T - 1: position t predicts token t + 1), averaged
  over the batch, with `patches` ({(name, layer): Patch}) applied."""
  if patches:
    logits_BxTxV = run_with_patches(model, params, tokens_BxT, patches=patches)
  else:
    logits_BxTxV, _ = run_with_cache(model, params, tokens_BxT, names=())
  logp_BxTxV = jax.nn.log_softmax(logits_BxTxV[:, :-1].astype(jnp.float32))
  return -jnp.take_along_axis(logp_BxTxV, tokens_BxT[:, 1:, None], -1)[..., 0].mean(0)


def ablating(heads: list[tuple[int, int]], num_heads: int, mean_z=None) -> dict:
  """The patches that ablate `heads` [(layer, head), ...]: their outputs (`z`) set to zero, or with
  `mean_z` (`run_with_cache(...)["z"]` of a reference batch, L x B x T x H x K) to each head's mean
  output over that batch and its positions (mean ablation: the head still writes its typical vector,
  only what it read from this input is gone)."""
  by_layer: dict[int, list[int]] = {}
  for layer, head in heads:
    by_layer.setdefault(layer, []).append(head)
  value = lambda layer: 0.0 if mean_z is None else jnp.mean(mean_z[layer], axis=(0, 1))
  return {
    ("z", layer): Patch(value=value(layer), where=jnp.isin(jnp.arange(num_heads), jnp.asarray(hs))[:, None])
    for layer, hs in by_layer.items()
  }
