"""Reading and changing a model's activations at its named points (`layers.point`).

Every model family passes its activations through named points. Per block (ours, then
TransformerLens's name, `blocks.{l}.` before it):

| ours | TransformerLens | shape (a block's points get a leading layer axis L when read) |
|---|---|---|
| `resid_pre`, `resid_mid`, `resid_post` | `hook_resid_pre`, `hook_resid_mid`, `hook_resid_post` | B x T x D |
| `ln_1.scale`, `ln_1.normalized` (`ln_2.`: the MLP's) | `ln1.hook_scale`, `ln1.hook_normalized` | B x T x 1, x D |
| `q_input`, `k_input`, `v_input` (per head) | `hook_q_input`, `hook_k_input`, `hook_v_input` | B x T x H x D |
| `q`, `k`, `v` (after qk_norm, before rotary) | `attn.hook_q`, `attn.hook_k`, `attn.hook_v` | B x T x H x K (kv: G) |
| `rot_q`, `rot_k` (after rotary; positions == "rope") | `attn.hook_rot_q`, `attn.hook_rot_k` | B x T x H x K (kv: G) |
| `attn_scores` (masked, before the softmax) | `attn.hook_attn_scores` | B x H x T x S |
| `pattern` (the attention probabilities) | `attn.hook_pattern` | B x H x T x S |
| `z` (each head's output, before the output projection) | `attn.hook_z` | B x T x H x K |
| `result` (each head's output projected, bias apart) | `attn.hook_result` | B x T x H x D |
| `attn_out`, `mlp_out` | `hook_attn_out`, `hook_mlp_out` | B x T x D |
| `mlp_in` (the MLP's own copy of the stream) | `hook_mlp_in` | B x T x D |
| `mlp_pre`, `mlp_post`, gated: `mlp_pre_linear` | `mlp.hook_pre`, `mlp.hook_post`, `mlp.hook_pre_linear` | B x T x F |
| `mlp_input`, `mlp_output` (what the MLP reads and writes) | `mlp.hook_in`, `mlp.hook_out` | B x T x D |

and a GPT's `embed` (`hook_embed`), `pos_embed` (`hook_pos_embed`), `ln_f.scale`,
`ln_f.normalized` (`ln_final.hook_scale`, `ln_final.hook_normalized`), `final_norm` (its output)
and `logits`. A decoder block's cross-attention adds `cross_attn.q`, ..., `cross_attn_out`,
`resid_mid_cross`. A run that asks for nothing compiles to the same program as a model without them.

The open families (transformer.models.formats) name their points as TransformerLens's bridge does
(tests/test_families.py checks them against it): with grouped-query attention the keys and values, their
inputs and `rot_k` have the G kv heads, not H; a block with norms after its branches (Gemma 2 and 3, OLMo 2)
has `attn_out` and `mlp_out` after them (what enters the stream); a parallel block (GPT-NeoX, Pythia) has
no `resid_mid`, and its `mlp_in` is a copy of `resid_pre`. `mlp.hook_in` and `mlp.hook_out` are circuit-tracer's
names, not TransformerLens's own: the input and output of the MLP it wraps in a model loaded with fold_ln=False.
There `mlp.hook_in` is ln2's output with its weight (and bias), not `ln2.hook_normalized` (before the weight):
the two are one tensor only where TransformerLens folds the norm's weight into the MLP (fold_ln=True, its
default). `mlp.hook_out` is `hook_mlp_out` wherever no norm follows the MLP (all but Gemma 2 and 3, OLMo 2).

    >>> logits, cache = run_with_cache(model, params, tokens_BxT, names=("pattern", "resid_post"))
    >>> cache["pattern"].shape          # L x B x H x T x T
    >>> steered = run_with_patches(model, params, tokens_BxT, patches={("resid_pre", 1): Patch.steer(v_D)})
    >>> patched = run_with_patches(model, params, corrupt_BxT,
    ...                            patches={("resid_pre", 0): Patch.replace(cache["resid_pre"][0])})

`cache` is an `ActivationCache` (transformer.interp.activation_cache): a mapping of name to array that also
does the residual stream's algebra (`decompose_resid`, `stack_head_results`, `logit_attrs`, ...).
The per-head inputs `q_input`, `k_input`, `v_input` (H copies of the stream) are left out of a cache
that names nothing: ask for them by name, or patch them (then each head's queries, keys and values
read their own copy: what path patching needs, transformer.interp.patching).

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
from typing import Any

import flax.linen as nn
import flax.traverse_util
import jax
import jax.numpy as jnp

from transformer.interp.activation_cache import ActivationCache
from transformer.jit_args import join_static, split_static
from transformer.layers.points import Point, split_path
from transformer.models import gpt


@dataclasses.dataclass(frozen=True)
class Patch:
  """What a patch does at one point (of one layer), where `where` is True (broadcast to the
  activation: True everywhere, one position, one head, ...): the activation replaced by `value`
  (None: kept), then `add` added. Say which with a constructor: `Patch.replace(value, where)`,
  `Patch.steer(vector, where)`, `Patch.ablate(where, mean=None)`."""

  value: Any = None
  where: Any = True
  add: Any = 0.0

  @classmethod
  def replace(cls, value, where=True) -> Patch:
    """The activation set to `value` (e.g. another run's activation there) where `where` is True."""
    return cls(value=value, where=where)

  @classmethod
  def steer(cls, vector, where=True) -> Patch:
    """`vector` added to the activation where `where` is True (activation steering, Turner et al.
    2023): the activation itself is kept."""
    return cls(add=vector, where=where)

  @classmethod
  def ablate(cls, where=True, mean=None) -> Patch:
    """The activation set to zero where `where` is True, or to `mean` (mean ablation: a typical value,
    e.g. the point's mean over a reference batch); resample ablation is `replace` with another
    input's activation."""
    return cls(value=0.0 if mean is None else mean, where=where)

  def collection_entry(self, shape) -> dict:
    """This patch as `layers.point` applies it: {"replace": bool, "value", "add"}, each of `shape`."""
    return _collection_entry(self.where, self.value, self.add, tuple(shape))


@functools.partial(jax.jit, static_argnums=3)
def _collection_entry(where, value, add, shape: tuple[int, ...]) -> dict:
  """`Patch.collection_entry`, one compiled program per shapes (a sweep builds hundreds of entries)."""
  where = jnp.broadcast_to(jnp.asarray(where, bool), shape)
  return {
    "replace": where & (value is not None),
    "value": jnp.zeros(shape) if value is None else jnp.broadcast_to(jnp.asarray(value), shape),
    "add": jnp.where(where, jnp.broadcast_to(jnp.asarray(add), shape), 0.0),
  }


@jax.jit
def _set_layer(entry_LxS: dict, layer, entry_S: dict) -> dict:
  """A scanned point's collection entry with one layer's entry put in (one program, not one a field)."""
  return {field: x.at[layer].set(entry_S[field]) for field, x in entry_LxS.items()}


def flatten(activations: dict) -> dict[str, jax.Array]:
  """The "activations" collection of a run as {name: array}, a block's point with a leading layer
  axis (unrolled layers stacked in order, scanned ones as they come)."""
  by_layer: dict[str, dict[int, jax.Array]] = {}
  out = {}
  for path, x in flax.traverse_util.flatten_dict(activations).items():
    name, layer, _ = split_path(path)
    if layer is None:
      out[name] = x
    else:
      by_layer.setdefault(name, {})[layer] = x
  for name, layers_ in by_layer.items():
    out[name] = jnp.stack([layers_[i] for i in sorted(layers_)])
  return out


_PER_HEAD_INPUTS = ("q_input", "k_input", "v_input")


def _kept(cache: dict, names) -> dict:
  """The points a run asked for (`names`; None: every point but the per-head copies of the stream)."""
  if names is None:
    return {name: x for name, x in cache.items() if name.rsplit(".", 1)[-1] not in _PER_HEAD_INPUTS}
  missing = sorted(set(names) - set(cache))
  if missing:
    raise KeyError(f"no named point {missing[0]!r} in this model; it has {', '.join(sorted(cache))}")
  return {name: cache[name] for name in names}  # the rest is never computed (jit drops it)


@functools.partial(jax.jit, static_argnames=("model", "names", "static"))
def _cached_run(model, params, args, kwargs, names, static, collection=None):
  args, kwargs = join_static(args, kwargs, static)
  variables = {"params": params} if collection is None else {"params": params, "patches": collection}
  output, state = model.apply(variables, *args, mutable=["activations"], **kwargs)
  return output, _kept(flatten(state["activations"]), names)


def _kept_names(names) -> tuple[str, ...] | None:
  """The points a cache keeps for `names` in any spelling (`Point.parse`: ours, one block's, TransformerLens's):
  each point whole (every block's), once, in order; the cache reads a block's out of it."""
  return None if names is None else tuple(dict.fromkeys(Point.parse(n).name for n in names))


def _patch_key(key) -> tuple[str, int | None]:
  """A patch's point as (name, layer): given so, or as a `Point` or a name in any spelling (`L1.resid_pre`,
  `blocks.1.hook_resid_pre`)."""
  if isinstance(key, tuple):
    name, layer = key
    point = Point.parse(name)
    if point.layer is not None and point.layer != layer:
      raise KeyError(f"the patch key {key!r} names layer {point.layer} and layer {layer}: give the point once")
    return point.name, layer
  point = Point.parse(key)
  return point.name, point.layer


def run_with_cache(model, params, *args, names: tuple | None = None, **kwargs):
  """(the model's output, its `ActivationCache`) of `model.apply({"params": params}, *args, **kwargs)`,
  jit-compiled (Python values among the arguments, e.g. `decode=False`, static); `names` keeps only
  those points (memory stays that of the run and those arrays), named in our words or TransformerLens's
  (`Point.parse`; a block's name keeps that point of every block: the cache reads the block's)."""
  (arrays, array_kwargs), static = split_static(args, kwargs)
  params = nn.unbox(params)
  output, cache = _cached_run(model, params, arrays, array_kwargs, _kept_names(names), static)
  return output, ActivationCache(cache, model, params)


@functools.lru_cache(maxsize=256)
def _point_shapes(model, treedef, leaves: tuple, static: tuple) -> dict:
  """{path: ShapeDtypeStruct} of every named point of a run of `model` on arguments of these shapes
  (traced once per model and shapes: a sweep or a patched run asks again and again)."""
  params, arrays, array_kwargs = jax.tree.unflatten(treedef, leaves)

  def activations(p, a, k):
    a, k = join_static(a, k, static)
    return model.apply({"params": p}, *a, mutable=["activations"], **k)[1]["activations"]

  return flax.traverse_util.flatten_dict(jax.eval_shape(activations, params, arrays, array_kwargs))


def _points_of_run(model, params, args, kwargs) -> dict:
  """{a named point's path in the "activations" collection: its shape} in a run of `model` on these inputs."""
  (arrays, array_kwargs), static = split_static(args, kwargs)
  specs = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), (nn.unbox(params), arrays, array_kwargs)
  )
  leaves, treedef = jax.tree.flatten(specs)
  return _point_shapes(model, treedef, tuple(leaves), static)


def point_path(model, params, name: str, *args, **kwargs) -> tuple[str, ...]:
  """The path of the blocks' point `name` (layer 0's, or the scanned blocks') in a run of `model` on these
  inputs: where its patch goes in the "patches" collection."""
  for path in _points_of_run(model, params, args, kwargs):
    point, layer, block = split_path(path)
    if point == name and block and layer in (0, None):
      return path
  raise KeyError(f"no named point {name!r} in the blocks of this model")


def patches_collection(model, params, patches: dict, *args, **kwargs) -> dict:
  """The "patches" collection that applies `patches` ({(name, layer): Patch}; layer None for a point
  outside the blocks; or {point: Patch}, a `Point` or its name in any spelling, `blocks.1.hook_resid_pre`)
  to a run of `model` on these inputs. Scanned blocks take one entry per point
  with a leading layer axis, in which only the patched layers' entries act."""
  flat_shapes = _points_of_run(model, params, args, kwargs)
  by_point = {split_path(path)[:2]: path for path in flat_shapes}
  scanned = {(split_path(path)[0]): path for path in flat_shapes if split_path(path)[2] == "layers"}
  out = {}
  for key, patch in patches.items():
    name, layer = _patch_key(key)
    if name in scanned:
      path = scanned[name]
      L, shape = flat_shapes[path].shape[0], flat_shapes[path].shape[1:]
      entry = out.get(path, Patch(where=False).collection_entry((L, *shape)))
      out[path] = _set_layer(entry, layer, patch.collection_entry(shape))
      continue
    if (name, layer) not in by_point:
      raise KeyError(f"no named point {name!r} at layer {layer} in this model")
    out[by_point[(name, layer)]] = patch.collection_entry(flat_shapes[by_point[(name, layer)]].shape)
  return flax.traverse_util.unflatten_dict(out)


def run_with_patches(model, params, *args, patches: dict, names=None, return_cache: bool = False, **kwargs):
  """The model's output with `patches` ({(name, layer): Patch}) applied at its named points,
  jit-compiled, on attention's reference path (as `run_with_cache`'s runs). `return_cache=True`:
  (output, the patched run's ActivationCache of `names`, None: every point), for methods of two
  stages (path patching: freeze and patch, then read the receivers)."""
  collection = patches_collection(model, params, patches, *args, **kwargs)
  (arrays, array_kwargs), static = split_static(args, kwargs)
  params = nn.unbox(params)
  names = _kept_names(names) if return_cache else ()
  output, cache = _cached_run(model, params, arrays, array_kwargs, names, static, collection)
  return (output, ActivationCache(cache, model, params)) if return_cache else output


def repeated_random_tokens(vocab_size: int, length: int, batch: int, seed: int = 0, ids=None) -> jax.Array:
  """`batch` rows of `length` random tokens, each row its tokens twice (B x 2 * length): where only
  copying from the context predicts the second half (Olsson et al. 2022). `ids`: drawn among these
  only (e.g. the tokens that occur in the training text: a byte-level BPE has pieces that no text
  uses, whose embeddings never trained, and a head's pattern on them says little)."""
  ids = jnp.arange(vocab_size) if ids is None else jnp.asarray(ids)
  return _repeated(jax.random.key(seed), ids, batch, length)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _repeated(key, ids, batch: int, length: int) -> jax.Array:
  first_BxN = ids[jax.random.randint(key, (batch, length), 0, len(ids))]
  return jnp.concatenate([first_BxN, first_BxN], axis=1)


def head_scores(model, params, tokens_BxT) -> dict[str, jax.Array]:
  """Each head's (L x H) mean attention on repeated tokens (`repeated_random_tokens`: a first copy of
  N tokens, then the same again) to: the token before (`previous_token`, every position after the
  first), the earlier occurrence of the same token (`duplicate_token`, the second copy), and the token
  after that earlier occurrence (`induction`: prefix matching, Olsson et al. 2022). 1: all of the
  head's attention there."""
  _, cache = run_with_cache(model, params, tokens_BxT, names=("pattern",))
  return _scores_of(cache["pattern"])


@jax.jit  # one program, not an eager op per index and mean
def _scores_of(pattern_LxBxHxTxT) -> dict[str, jax.Array]:
  T = pattern_LxBxHxTxT.shape[-1]
  N = T // 2
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


def next_token_losses(model, params, tokens_BxT, patches: dict | None = None) -> jax.Array:
  """The next-token cross-entropy at each position (T - 1: position t predicts token t + 1), averaged
  over the batch, with `patches` ({(name, layer): Patch}) applied."""
  if patches:
    logits_BxTxV = run_with_patches(model, params, tokens_BxT, patches=patches)
  else:
    logits_BxTxV, _ = run_with_cache(model, params, tokens_BxT, names=())
  return next_token_nll(logits_BxTxV, tokens_BxT)


@jax.jit
def next_token_nll(logits_BxTxV, tokens_BxT) -> jax.Array:
  """(T - 1): each position's cross-entropy of the next token under `logits_BxTxV`, averaged over the batch
  (the language model's loss, gpt.next_token_nll, of a run's own tokens)."""
  return gpt.next_token_nll(logits_BxTxV[:, :-1], tokens_BxT[:, 1:]).mean(0)


def ablating(heads: list[tuple[int, int]], num_heads: int, how: str = "zero", reference_z=None) -> dict:
  """The patches that ablate `heads` [(layer, head), ...]: their outputs (`z`) set to zero (`how="zero"`),
  to each head's mean output over a reference batch and its positions (`"mean"`, `reference_z` =
  `run_with_cache(...)["z"]` of that batch, L x B x T x H x K: the head still writes its typical vector,
  only what it read from this input is gone), or to its output on another input (`"resample"`,
  `reference_z` of a batch of the same shape: Chan et al. 2022's resampling ablation)."""
  if how not in ("zero", "mean", "resample"):
    raise ValueError(f"how={how!r}: ablate by 'zero', 'mean' or 'resample'")
  if how != "zero" and reference_z is None:
    raise ValueError(
      f"a {how} ablation needs reference_z: run_with_cache(model, params, reference, names=('z',))[1]['z']"
    )
  by_layer: dict[int, list[int]] = {}
  for layer, head in heads:
    by_layer.setdefault(layer, []).append(head)
  means = {"zero": lambda layer: 0.0, "mean": lambda layer: jnp.mean(reference_z[layer], axis=(0, 1))}
  value = means.get(how, lambda layer: reference_z[layer])
  return {
    ("z", layer): Patch.ablate(jnp.isin(jnp.arange(num_heads), jnp.asarray(hs))[:, None], mean=value(layer))
    for layer, hs in by_layer.items()
  }
