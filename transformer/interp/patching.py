"""Which activations, and which paths between components, carry a behaviour: activation patching
sweeps, attribution patching, path patching and edge attribution patching.

Each compares two runs: `clean` (the behaviour happens) and `corrupt` (it does not), scored by a
`metric(logits_BxTxV) -> scalar` (e.g. a logit difference, or a loss). A patch takes a piece of one
run into the other and asks how much of the metric's difference comes back:

    >>> sweep_LxT = patching.patching_sweep(model, params, clean_BxT, corrupt_BxT, metric)
    >>> recovered_LxT = patching.fraction_recovered(sweep_LxT, model, params, clean_BxT, corrupt_BxT, metric)
    >>> effect = patching.path_patching(model, params, clean_BxT, metric, sender=(0, 3),
    ...                                 receivers=[(1, h, "k") for h in range(H)], source_BxT=corrupt_BxT)
    >>> edges = patching.edge_attribution_patching(model, params, clean_BxT, corrupt_BxT, metric)

Sweeps run every patch in one compiled call, in chunks (`chunk_size` patched runs at a time, so a
sweep's memory is that of a chunk, not of the whole sweep). Names of the points: transformer.interp.interventions.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from transformer import jit_args, kernels, layers
from transformer.interp.interventions import Patch, patches_collection, point_path, run_with_cache, run_with_patches
from transformer.models import gpt

# The axes of a point's activation (without its layer axis) that a sweep can go over.
_BY_HEAD_FIRST = ("attn_scores", "pattern")  # B x H x T x S
_PER_HEAD = ("q", "k", "v", "rot_q", "rot_k", "z", "result", "q_input", "k_input", "v_input")  # B x T x H x ...


def _position_axes(point: str) -> tuple[int, ...]:
  """The axes of `point`'s activation (B first) that go over positions: a pattern's queries and keys."""
  return (2, 3) if point.rsplit(".", 1)[-1] in _BY_HEAD_FIRST else (1,)


def _axes(point: str, over: str) -> tuple[int, ...]:
  """The axes of `point`'s activation (B first) that `over` names: "positions", "heads", or
  "positions_and_heads" (swept in that order)."""
  heads_first = point.rsplit(".", 1)[-1] in _BY_HEAD_FIRST
  per_head = heads_first or point.rsplit(".", 1)[-1] in _PER_HEAD
  axis = {"positions": 2 if heads_first else 1, "heads": 1 if heads_first else 2}
  wanted = {"positions": ("positions",), "heads": ("heads",), "positions_and_heads": ("positions", "heads")}
  if over not in wanted:
    raise ValueError(f"over={over!r}: sweep over 'positions', 'heads' or 'positions_and_heads'")
  if "heads" in wanted[over] and not per_head:
    raise ValueError(
      f"{point!r} has no head axis to sweep over; per-head points: {', '.join(_PER_HEAD + _BY_HEAD_FIRST)}"
    )
  return tuple(axis[a] for a in wanted[over])


def _metric_of(model, params, tokens_BxT, metric) -> jax.Array:
  return metric(run_with_cache(model, params, tokens_BxT, names=())[0])


def patching_sweep(
  model,
  params,
  clean_BxT,
  corrupt_BxT,
  metric,
  *,
  point: str | None = None,
  over: str = "positions",
  chunk_size: int = 32,
  source_BxT=None,
  value_LxBx=None,
  padded_length: int | None = None,
):
  """Activation patching (Meng et al. 2022; Wang et al. 2023): `metric` of the corrupted run with one
  piece of one layer's `point` taken from the clean run, for every layer and piece (L x pieces, or
  L x T x H for `over="positions_and_heads"`), in one compiled call (the metric in a small one after it).
  `point` defaults to `resid_pre` over positions and `z` over heads. `chunk_size`: patched runs computed at once
  (lax.map's batch). The piece's new value is the clean run's, or `value_LxBx` (the whole point, every layer: e.g. a
  resample ablation's other input, a mean), or another input's (`source_BxT`).
  The runs go at a length bucket (`padded_length`; None: `jit_args.prompt_bucket`'s), filler after the
  prompt, so that prompts of nearby lengths share the sweep's program: the model is causal, the filler changes
  nothing before it, and `metric` is given the prompt's own positions. (None runs at the prompt's length, the
  metric inside the sweep's program, where the cells' streams at the positions it reads would pass `_STREAMS_BYTES`.)"""
  point = point or ("resid_pre" if over == "positions" else "z")
  _check_block_point(model, point)
  axes = _axes(point, over)
  T = corrupt_BxT.shape[1]
  first = _first_position_read(metric, (*corrupt_BxT.shape, model.config.vocab_size))
  inside = padded_length is None and _streams_bytes(model, corrupt_BxT, over, T - first) > _STREAMS_BYTES
  # (inside: the metric inside the sweep's program, at the prompt's length)
  pad = functools.partial(jit_args.padded_prompt, max_len=model.config.max_len, length=T if inside else padded_length)
  corrupt_BxP = pad(corrupt_BxT)
  if value_LxBx is None:
    _, cache = run_with_cache(model, params, pad(clean_BxT if source_BxT is None else source_BxT), names=(point,))
    value_LxBx = cache[point]
  else:  # zeros at the filler's positions (each position axis: a pattern's keys too)
    filler = corrupt_BxP.shape[1] - T
    widths = [(0, filler if i - 1 in _position_axes(point) else 0) for i in range(value_LxBx.ndim)]
    value_LxBx = jnp.pad(jnp.asarray(value_LxBx), widths)
  return _sweep_from_each_layer(
    model, jax_params(params), corrupt_BxP, (metric, first, T, inside), point, value_LxBx, axes, chunk_size
  )


def jax_params(params):
  """Params as jax arrays (numpy ones, closed over by a traced function, cannot be indexed by tracers)."""
  return jax.tree.map(jnp.asarray, nn.unbox(params))


def patched_logits(model, params, patches: dict, tokens_BxT):
  """The patched run's output, traceable: inside a sweep's lax.map, a gradient with respect to the
  patches' values (attribution patching, distributed alignment search). run_with_patches is the
  same run, jit-compiled on its own."""
  collection = patches_collection(model, params, patches, tokens_BxT)
  return model.apply({"params": params, "patches": collection}, tokens_BxT, mutable=["activations"])[0]


def fraction_recovered(values, model, params, clean_BxT, corrupt_BxT, metric) -> jax.Array:
  """Patched metric values as the fraction of the clean-corrupt difference they bring back:
  (patched - corrupt) / (clean - corrupt); 1: the patch restores the clean behaviour, 0: nothing."""
  clean, corrupt = _metric_of(model, params, clean_BxT, metric), _metric_of(model, params, corrupt_BxT, metric)
  return (values - corrupt) / (clean - corrupt)


def attribution_patching(
  model, params, clean_BxT, corrupt_BxT, metric, *, point: str | None = None, over="positions", padded_length=None
):
  """`patching_sweep`'s effects (metric of the patched run minus the corrupted run's) to first order,
  from one forward and one backward pass (Nanda 2023, "attribution patching"): (clean - corrupt
  activation) · d metric / d activation at the corrupted run, summed over each piece. The runs go at a length
  bucket as the sweep's do (`padded_length`): the metric's gradient with respect to the logits it reads is taken
  on the prompt's own B x T x V logits, in a small program of its own, and carried back at the bucket's length."""
  point = point or ("resid_pre" if over == "positions" else "z")
  _check_block_point(model, point)
  axes = _axes(point, over)
  T = corrupt_BxT.shape[1]
  first = _first_position_read(metric, (*corrupt_BxT.shape, model.config.vocab_size))
  pad = functools.partial(jit_args.padded_prompt, max_len=model.config.max_len, length=padded_length)
  corrupt_BxP = pad(corrupt_BxT)
  _, clean = run_with_cache(model, params, pad(clean_BxT), names=(point,))
  logits_BxPxV, corrupt = run_with_cache(model, params, corrupt_BxP, names=(point,))
  dmetric_BxRxV = _metric_gradient(metric, first, T, logits_BxPxV)
  effect = _attribution_effects(
    model, point, axes, jax_params(params), clean[point], corrupt[point], corrupt_BxP, first, dmetric_BxRxV
  )
  return effect[:, :T] if axes[0] in _position_axes(point) else effect  # not the filler's positions


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _metric_gradient(metric, first: int, T: int, logits_BxPxV) -> jax.Array:
  """The metric's gradient with respect to the prompt's logits at the positions it reads (B x R x V), R = T - first:
  one small program for each metric (a function) and prompt length."""
  return jax.grad(metric)(logits_BxPxV[:, :T])[:, first:]


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _attribution_effects(model, point, axes, params, clean_LxBx, corrupt_LxBx, tokens_BxP, first_read, dmetric_BxRxV):
  """(clean - corrupt) · the gradient of the corrupted run's logits at the R positions from `first_read`, against
  `dmetric_BxRxV` (the metric's gradient there), with respect to `point` in every layer: summed but over `axes`."""
  L, R = corrupt_LxBx.shape[0], dmetric_BxRxV.shape[1]

  def read(add_LxBx):
    patches = {(point, l): Patch.steer(add_LxBx[l]) for l in range(L)}
    logits_BxPxV = patched_logits(model, params, patches, tokens_BxP)
    return jax.lax.dynamic_slice_in_dim(logits_BxPxV, first_read, R, axis=1)

  _, backward = jax.vjp(read, jnp.zeros_like(corrupt_LxBx))
  effect_LxBx = (clean_LxBx - corrupt_LxBx) * backward(dmetric_BxRxV.astype(jnp.float32))[0]
  return effect_LxBx.sum(axis=tuple(i for i in range(1, effect_LxBx.ndim) if i - 1 not in axes))


def _sender_delta(model, params, sender, base, source, sender_value=None):
  """What the sender (head `(layer, head)` or MLP `(layer, "mlp")`) writes into the stream with its
  new value minus what it writes in the base run (B x T x D, and as B x T x 1 x D for the heads' copies
  of the stream): its `result` for a head, `mlp_out`. One compiled program, not one an op."""
  name = "mlp_out" if sender[1] == "mlp" else "result"
  new = source[name] if sender_value is None else sender_value
  return _delta(sender, base[name], new, sender_value is not None)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _delta(sender, base_Lx, new, given: bool):
  layer, which = sender
  pick = (lambda x: x[layer]) if which == "mlp" else (lambda x: x[layer][:, :, which])
  delta_BxTxD = (new if given else pick(new)) - pick(base_Lx)
  return delta_BxTxD, delta_BxTxD[:, :, None]


def _receiver_point(receiver, heads: dict[str, int]) -> tuple[tuple[str, int], np.ndarray | None]:
  """Where a receiver reads the sender's change: the named point and, for a head, which of its heads
  (a NumPy mask, H x 1). `(layer, head, "q"|"k"|"v")`: that head's queries', keys' or values' copy of
  the stream (`heads`: how many each role has; with grouped-query attention "k" and "v" count the kv
  heads, as TransformerLens does); `(layer, "mlp")`: the MLP's input; `"logits"`: the stream the final
  norm reads (the direct path to the output; layer -1: the last)."""
  if receiver == "logits":
    return ("resid_post", -1), None
  if len(receiver) == 2 and receiver[1] == "mlp":
    return ("mlp_in", receiver[0]), None
  layer, head, role = receiver
  if role not in ("q", "k", "v"):
    raise ValueError(f"receiver {receiver!r}: a head's role is 'q', 'k' or 'v'")
  return (f"{role}_input", layer), (np.arange(heads[role]) == head)[:, None]  # this head's copy alone


def backward_receivers(sender, receivers, parallel: bool = False) -> list:
  """The receivers that read the stream before the sender writes it (a path runs forward only): a head
  at or below a head sender's layer, or below an MLP sender's; an MLP below the sender's layer, or in
  its layer when the sender is that layer's MLP (or a head of a parallel block, whose MLP reads the
  stream the heads read). "logits" reads after every layer."""
  layer, which = sender
  wrong = []
  for receiver in receivers:
    if receiver == "logits":
      continue
    if len(receiver) == 2:  # (layer, "mlp")
      same_layer_reads_it = which != "mlp" and not parallel
      if receiver[0] < layer or (receiver[0] == layer and not same_layer_reads_it):
        wrong.append(receiver)
    elif receiver[0] <= layer:
      wrong.append(receiver)
  return wrong


def path_patching(
  model, params, base_BxT, metric, *, sender, receivers, source_BxT=None, sender_value=None
) -> jax.Array:
  """Path patching (Wang et al. 2022; Goldowsky-Dill et al. 2023): `metric` of the base run where only
  `receivers` see the sender's change, everything else as in the base run. The sender: a head
  `(layer, head)` or an MLP `(layer, "mlp")`, its new value its activation on `source_BxT` or
  `sender_value` (B x T x D, what it writes: zeros, a mean). Receivers: `(layer, head, "q"|"k"|"v")`,
  `(layer, "mlp")`, `"logits"` (see `_receiver_point`); each reads the base stream plus the change
  in what the sender writes (the direct path; with every reader downstream of the sender a receiver,
  this is patching the sender itself). Three runs: base, source, and the patched one."""
  if source_BxT is None and sender_value is None:
    raise ValueError("path_patching needs the sender's new value: source_BxT (another input) or sender_value")
  backward = backward_receivers(sender, receivers, model.config.block.parallel)
  if backward:
    raise ValueError(f"receivers {backward} read the stream before the sender {sender} writes it: a path runs forward")
  names = ("result", "mlp_out") if not model.config.block.attention_only else ("result",)
  _, base = run_with_cache(model, params, base_BxT, names=names)
  source = base if source_BxT is None else run_with_cache(model, params, source_BxT, names=names)[1]
  delta_BxTxD, per_head_BxTx1xD = _sender_delta(model, params, sender, base, source, sender_value)
  block = model.config.block
  heads = {"q": block.num_heads, "k": block.kv_heads, "v": block.kv_heads}
  wheres: dict = {}  # point -> the heads that read the change there (None: the point's one stream)
  for receiver in receivers:
    (name, layer), where = _receiver_point(receiver, heads)
    key = (name, model.config.num_layers - 1 if layer == -1 else layer)
    wheres[key] = where if key not in wheres or where is None else wheres[key] | where  # several heads of a layer
  if not wheres:
    return _metric_of(model, params, base_BxT, metric)
  patches = {
    key: Patch.steer(delta_BxTxD) if where is None else Patch.steer(per_head_BxTx1xD, where=where)
    for key, where in wheres.items()
  }
  return metric(run_with_patches(model, params, base_BxT, patches=patches))


def edge_attribution_patching(model, params, clean_BxT, corrupt_BxT, metric) -> dict[str, jax.Array]:
  """Edge attribution patching (Syed et al. 2023): every head → head edge's effect on `metric` of
  corrupting it alone, to first order, from one forward and one backward pass on the clean run:
  (corrupt - clean result of the sending head) · d metric / d (the receiving head's query, key or
  value input). {"q", "k", "v": L x H x L x H (sender layer and head, receiver layer and head; zero
  where the receiver is not above the sender), "logits": L x H (each head's direct path to the
  output)}. Rank edges by magnitude; a first-order estimate misses what saturated softmaxes do."""
  cfg = model.config
  L, H = cfg.num_layers, cfg.block.num_heads
  params = jax_params(params)
  _, corrupt = run_with_cache(model, params, corrupt_BxT, names=("result",))
  _, clean = run_with_cache(model, params, clean_BxT, names=("result", "resid_pre"))
  B, T, D = clean["resid_pre"].shape[1:]
  roles = ("q_input", "k_input", "v_input")

  def metric_with(adds):
    patches = {(role, l): Patch.steer(adds[role][l]) for role in roles for l in range(L)}
    patches[("resid_post", L - 1)] = Patch.steer(adds["logits"])
    return metric(patched_logits(model, params, patches, clean_BxT))

  G = cfg.block.kv_heads
  zeros = {role: jnp.zeros((L, B, T, H if role == "q_input" else G, D)) for role in roles}
  zeros["logits"] = jnp.zeros((B, T, D))
  grads = jax.jit(jax.grad(metric_with))(zeros)
  delta_LxBxTxHxD = corrupt["result"] - clean["result"]
  causal_LxL = jnp.arange(L)[:, None] < jnp.arange(L)[None, :]  # sender layer below the receiver's
  edges = {}
  for role in roles:
    score_LxHxLxH = jnp.einsum("lbthd,mbtgd->lhmg", delta_LxBxTxHxD, grads[role])
    edges[role[0]] = jnp.where(causal_LxL[:, None, :, None], score_LxHxLxH, 0.0)
  edges["logits"] = jnp.einsum("lbthd,btd->lh", delta_LxBxTxHxD, grads["logits"])
  return edges


# At most this many bytes of the cells' streams (at the positions the metric reads) come out of a sweep's
# program run at a length bucket; past them it runs at the prompt's length with the metric inside.
_STREAMS_BYTES = 256 * 2**20


def _streams_bytes(model, tokens_BxT, over: str, read: int) -> int:
  cfg = model.config
  B, T = tokens_BxT.shape
  cells = {"positions": T, "heads": cfg.block.num_heads, "positions_and_heads": T * cfg.block.num_heads}[over]
  return 4 * cfg.num_layers * cells * B * read * cfg.block.d_model


def _sweep_from_each_layer(model, params, corrupt_BxP, read_by, point, value_LxBx, axes, chunk_size) -> jax.Array:
  """`patching_sweep`'s metrics (L x the pieces), each patched run started at the patched layer: every
  patch at layer l leaves the corrupted run below l as it was, so the blocks from l run on the corrupted stream
  entering l, and the head from the first position the metric reads. `corrupt_BxP`: the prompt's T tokens,
  filler after them up to the length the sweep runs at; `read_by`: (metric, the first position it reads, T, whether
  the metric runs inside the sweep's program)."""
  metric, first, T, inside = read_by
  _, below = run_with_cache(model, params, corrupt_BxP, names=("resid_pre",))
  inside_block = point_path(model, params, point, corrupt_BxP)[2:]  # the patch's entry in a block ("attn", "z")
  head = (metric, first) if inside else None
  runs = _patched_runs(
    model, inside_block, axes, chunk_size, (T - first, head), params, value_LxBx, below["resid_pre"], first
  )
  if inside:
    return runs
  sizes = tuple(value_LxBx.shape[1:][a] for a in axes)
  cut = (sizes, T if axes[0] in _position_axes(point) else None)  # no cells at the filler's positions
  return _metric_of_streams(model, metric, first, chunk_size, cut, params, runs)


def _head_metric(model, metric, first: int, params, read_BxRxD) -> jax.Array:
  """`metric` of the logits of the stream at the positions it reads (R = T - first), zeros before them."""
  read_BxRxV = model.apply({"params": params}, read_BxRxD, method=type(model).output_logits)
  B, _, V = read_BxRxV.shape
  return metric(jnp.concatenate([jnp.zeros((B, first, V), read_BxRxV.dtype), read_BxRxV], axis=1))


# A program of its own, compiled for the prompt's T: the sweep's (at a length bucket) holds no T.
@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _metric_of_streams(model, metric, first: int, chunk_size: int, cut: tuple, params, read_LxCxBxRxD) -> jax.Array:
  """The metric of every cell's stream: L x the pieces. `cut`: (the pieces' sizes, how many of the first axis's to
  keep: the prompt's positions, not the filler's; None: all)."""
  sizes, keep = cut
  read = functools.partial(_head_metric, model, metric, first, params)
  L, C = read_LxCxBxRxD.shape[:2]
  metric_LxC = jax.lax.map(read, read_LxCxBxRxD.reshape(L * C, *read_LxCxBxRxD.shape[2:]), batch_size=chunk_size)
  return metric_LxC.reshape(L, *sizes)[:, :keep]


# The arrays are arguments, not constants of the program (XLA would fold a model's weights into it); where the
# metric reads (`first_read`) is traced, so that at a length bucket the program is the same for any prompt
# length of its bucket (and any metric of the same reach, which runs after it: `_metric_of_streams`). With the
# metric inside (`read`'s head), the program is the metric's, a function: one compiled for each new function.
@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _patched_runs(
  model, inside: tuple, axes: tuple, chunk_size: int, read: tuple, params, value_LxBx, stream_LxBx, first_read
):
  """For every layer and swept piece, the corrupted run with the piece of `value_LxBx` patched in at that layer
  (`inside`: the patch's entry in a block), from that layer up, one block at a time in a loop of dynamic length
  (one block compiled, not a program per layer): the stream at the R positions the metric reads from
  `first_read` (L x C x B x R x D, C the cells: the pieces swept), or, given `read`'s head (metric, first), the
  metric (L x the pieces)."""
  cfg = model.config
  L = cfg.num_layers
  R, head = read
  shape = value_LxBx.shape[1:]
  sizes = tuple(shape[a] for a in axes)
  stack = gpt.blocks(cfg, kernels.resolve(cfg.kernels), parent=None)
  block, kinds_L = stack.block(), stack.layer_kinds()  # each layer local or global (a sliding window)
  P = stream_LxBx.shape[2]
  positions = (np.arange(P)[None], np.arange(P)[None])
  stacked = params["h"]["layers"] if cfg.scan_layers else layers.stack_layers(params["h"], L)["layers"]

  def chosen(pieces):  # True at the swept piece, broadcast to the point's shape
    where = jnp.ones((), bool)
    for axis, size, piece in zip(axes, sizes, pieces):
      mask_shape = [1] * len(shape)
      mask_shape[axis] = size
      where = where & (jnp.arange(size) == piece).reshape(mask_shape)
    return where

  def from_layer(layer, x_BxTxD, patch: Patch):
    entry = patch.collection_entry(shape)

    def one_block(i, x_BxTxD):
      params_i = jax.tree.map(lambda p: p[i], stacked)
      entry_i = {**entry, "replace": entry["replace"] & (i == layer)}
      variables = {"params": params_i, "patches": flax.traverse_util.unflatten_dict({inside: entry_i})}
      local = kinds_L[i] if 0 < len(set(cfg.global_layers)) < L else None
      return block().apply(variables, x_BxTxD, None, positions=positions, local=local, mutable=["activations"])[0]

    read_BxRxD = jax.lax.dynamic_slice_in_dim(jax.lax.fori_loop(layer, L, one_block, x_BxTxD), first_read, R, axis=1)
    return read_BxRxD if head is None else _head_metric(model, *head, params, read_BxRxD)

  def layer_sweep(layer):
    def patched(cell):
      patch = Patch.replace(value_LxBx[layer], where=chosen(jnp.unravel_index(cell, sizes)))
      return from_layer(layer, stream_LxBx[layer], patch)

    return jax.lax.map(patched, jnp.arange(math.prod(sizes)), batch_size=chunk_size)

  runs_LxCx = jax.lax.map(layer_sweep, jnp.arange(L))
  return runs_LxCx if head is None else runs_LxCx.reshape(L, *sizes)


@functools.lru_cache(maxsize=32)  # a tool's calls with one metric (a probe's sweeps and estimates) find it once
def _first_position_read(metric, shape: tuple) -> int:
  """The first position whose logits `metric` depends on (0 when it reads none: e.g. an argmax, whose
  gradient is zero everywhere): where its gradient at random logits is not zero."""
  gradient = jax.jit(lambda: jax.grad(lambda x: jnp.sum(metric(x)))(jax.random.normal(jax.random.key(0), shape)))
  grad_BxTxV = gradient()  # one program (op by op, each op of the metric would compile on its own)
  read_T = np.flatnonzero(np.any(np.asarray(grad_BxTxV) != 0, axis=(0, 2)))
  return int(read_T[0]) if len(read_T) else 0


def _check_block_point(model, point: str) -> None:
  """Sweeps and attribution patching go over a GPT's layers: a block's point, which every layer has."""
  outside_blocks = point in ("embed", "pos_embed", "final_norm", "logits") or point.startswith("ln_f.")
  if not isinstance(model, gpt.GPT) or outside_blocks:
    raise ValueError(
      f"a sweep patches a point of a GPT's blocks, layer by layer ({point!r} of a {type(model).__name__} is not "
      f"one): patch it with interventions.run_with_patches"
    )
