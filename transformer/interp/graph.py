"""Attribution graphs: a prompt's computation as direct effects between transcoder features
(Ameisen, Lindsey et al. 2025, "Circuit Tracing"; the algorithm of circuit-tracer).

Each MLP is read by a transcoder (transformer.models.sae, `d_out`: a sparse dictionary from the
MLP's input point to its output), or all of them by one cross-layer transcoder (transformer.models.clt:
a feature writes its own layer's MLP output and every later one's; its edges are summed over them;
the functions both share: transformer.interp.replacement). For one prompt, the **local replacement
model** is the model with
  - every attention pattern and every norm's divisor (`*.scale`) fixed at the prompt's values,
  - every MLP's output fixed at its value, which splits into the active features' decoder vectors,
    the transcoder's biases (and skip path, which stays live) and an **error** (what it misses),
so that it gives the model's logits exactly and is linear in the residual stream. Its nodes: the
active features at each (layer, position), the error at each, the token embeddings, and the top
output logits (up to `desired_logit_prob` of probability, at most `max_n_logits`). An edge is a
source's direct effect on a target's input through the linear model: a feature's pre-activation
(its encoder row on the transcoder's input point) or a logit (the unembedding's column minus the
vocabulary's mean, on the final norm's output). The rows are batched backward passes of the
replacement model (one a target, vmapped), the columns the sources' output vectors:

    edge(s -> t) = a_s · (W_dec[s] / output_scale) · ∂ input_t / ∂ mlp_out[l_s, p_s]

    >>> graph = attribute(model, params, tokens_T, transcoders)
    >>> graph.adjacency_NxN[target, source]            # rows targets, columns sources (circuit-tracer's)
    >>> kept = graph_view.prune(graph)                 # transformer.interp.graph_view: pruning, JSON, HTML

The freezing goes through the named points (transformer.layers.points.functions_at): the model that
draws the graph is the model itself, any family it opens. The transcoders are read a layer at a time and only
where features fire (`Transcoders.latents`, `decoder_rows`, `encoder_rows`), so that a published set left in its
files (replacement.StreamedTranscoders) is never held whole.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.errors import UserError
from transformer.interp.graph_selection import capped_rows
from transformer.interp.graph_targets import logit_targets, salient_logits
from transformer.interp.replacement import PerLayerTranscoders, Transcoders
from transformer.jit_args import bucket, padded_prompt, prompt_bucket
from transformer.layers.points import functions_at, split_path
from transformer.models import gpt, sae


@dataclasses.dataclass
class Graph:
  """An attribution graph (circuit-tracer's `Graph`, in numpy). Nodes, in this order: the active
  features (`active_features`: layer, position, latent; `activations`), the errors (layer-major, one
  a position), the tokens, the logits (`logit_tokens`, `logit_probabilities`). `adjacency_NxN[t, s]`:
  the direct effect of node s on node t's input; the rows of errors and tokens are zero."""

  tokens: np.ndarray  # T
  active_features: np.ndarray  # n x 3: layer, position, latent
  activations: np.ndarray  # n
  logit_tokens: np.ndarray  # K
  logit_probabilities: np.ndarray  # K
  adjacency_NxN: np.ndarray
  num_layers: int
  # The prompt's active features before a cap chose `active_features` among them (attribute's max_feature_nodes;
  # -1: no cap, they are all nodes)
  num_active: int = -1
  # Each logit node's direction on the final norm's output (a token's unembedding column less the vocabulary's
  # mean; a custom target's own) and, for custom targets, their labels (their logit_tokens: vocab_size + k)
  logit_vectors_KxD: np.ndarray | None = None
  logit_labels: tuple[str, ...] = ()

  @property
  def num_features(self) -> int:
    return len(self.active_features)

  @property
  def num_positions(self) -> int:
    return len(self.tokens)

  def error_index(self, layer: int, position: int) -> int:
    return self.num_features + layer * self.num_positions + position

  def token_index(self, position: int) -> int:
    return self.num_features + self.num_layers * self.num_positions + position

  def logit_index(self, k: int) -> int:
    return self.token_index(self.num_positions) + k


@dataclasses.dataclass(frozen=True)
class _Setup:
  """What the prompt's clean run fixes, and the errors of its transcoders (all device arrays)."""

  frozen: dict  # path -> the value of every pattern, norm divisor and MLP output
  inputs_LxTxD: jax.Array  # the transcoders' input point, each layer
  errors_LxTxD: jax.Array  # each MLP's output less what its transcoders write (position 0 zeroed when it is a BOS)
  embed_TxD: jax.Array
  logits_V: jax.Array  # the last position's logits


jax.tree_util.register_dataclass(
  _Setup, data_fields=["frozen", "inputs_LxTxD", "errors_LxTxD", "embed_TxD", "logits_V"], meta_fields=[]
)


def attribute(
  model,
  params,
  tokens_T,
  transcoders: Transcoders,
  max_n_logits: int = 10,
  desired_logit_prob: float = 0.95,
  batch_size: int = 256,
  zero_first: bool = True,
  max_feature_nodes: int | None = None,
  update_interval: int = 4,
  targets=None,
  padded_length: int | None = None,
) -> Graph:
  """The attribution graph of one prompt (`tokens_T`, its ids) through `transcoders` (one a layer):
  every active feature's row (its direct effects from every node) and the top logits', by batched
  backward passes of the local replacement model (this module's docstring). `zero_first`: the first
  position's features and error left out (circuit-tracer's: the first position is an attention sink, a
  BOS, whose activations are outliers; its MLP output stays in the replacement model as a constant).
  `max_feature_nodes`: at most this many features become nodes, chosen as circuit-tracer 0.5 chooses them
  (`graph_selection.capped_rows`): the rest stay in the replacement model, as no node. `targets`: what the logit
  nodes are (None: the top logits; token ids; custom directions: `logit_targets`, `logit_difference`).
  `padded_length`: the length the prompt runs at (None: `prompt_bucket`'s), filler after it, so that prompts of
  nearby lengths share their programs: the model is causal, the filler changes nothing before it and is no node."""
  tc = transcoders.check(model).unboxed()
  tokens_T = np.asarray(tokens_T, np.int32).reshape(-1)
  tokens_P = jax.device_put(padded_prompt(tokens_T, model.config.max_len, padded_length))
  params = nn.unbox(params)
  setup, active_nx3, activations_n, entries = _setup(model, tc, params, tokens_P, zero_first, len(tokens_T))
  unembed_DxV = np.asarray(gpt.unembedding(model.config, params), np.float32).T
  if targets is None:  # the top logits
    logit_tokens, logit_p = salient_logits(np.asarray(setup.logits_V), max_n_logits, desired_logit_prob)
  logit_tokens, logit_p, vectors_KxD, labels = logit_targets(
    unembed_DxV, np.asarray(setup.logits_V), logit_tokens if targets is None else targets
  )
  sources = _sources(setup, entries, active_nx3)
  rows_targets = _targets(tc, active_nx3, vectors_KxD, model.config.num_layers, len(tokens_T))
  rows_of = lambda ids: _rows(
    *(model, tc.fixed_part(), params, tokens_P, setup, sources),
    *({k: v[ids] for k, v in rows_targets.items()}, batch_size, len(tokens_T)),
  )
  n, K = len(active_nx3), len(logit_tokens)
  if max_feature_nodes is not None and max_feature_nodes < 1:
    raise UserError(f"max_feature_nodes={max_feature_nodes}: give at least 1 (None: every active feature)")
  if max_feature_nodes is None or max_feature_nodes >= n:
    selected, rows = np.arange(n), rows_of(np.arange(n + K))
  else:
    selected, rows = capped_rows(rows_of, n, logit_p, max_feature_nodes, batch_size * update_interval)
  m = len(selected)
  columns = np.concatenate([selected, np.arange(n, rows.shape[1])])  # the nodes': features chosen, then the rest
  N = m + (model.config.num_layers + 1) * len(tokens_T) + K
  adjacency_NxN = np.zeros((N, N), np.float32)
  adjacency_NxN[:m, : N - K] = rows[:m, columns]
  adjacency_NxN[N - K :, : N - K] = rows[m:, columns]
  num_active = -1 if m == n else n
  features = (active_nx3[selected], activations_n[selected])
  logits = (logit_tokens, logit_p, adjacency_NxN, model.config.num_layers, num_active, vectors_KxD, labels)
  return Graph(tokens_T, *features, *logits)


def _frozen_kind(name: str) -> bool:
  """The points the local replacement model fixes at the prompt's values."""
  return name == "pattern" or name.rsplit(".", 1)[-1] == "scale"


def _acted_on(point_in: str) -> frozenset:
  """The points' names the replacement model's functions act on, its transcoders reading `point_in`
  (`functions_at`'s `names`: the others, e.g. each head's result, are not made)."""
  return frozenset({"pattern", "scale", "mlp_out", "embed", point_in.rsplit(".", 1)[-1]})


def _setup(model, tc: Transcoders, params, tokens_P, zero_first: bool, T: int):
  """(the clean run's `_Setup`; the active features, n x 3: layer, position, latent, in circuit-tracer's order;
  their activations; what they write, `_entries`): each layer's transcoder encoded on its input a layer at a
  time, and the errors of what the active features write. The prompt is `tokens_P`'s first T, the rest filler
  (`padded_prompt`): no feature and no error there."""
  frozen, inputs_LxTxD, outputs_LxTxD, embed_TxD, logits_V = _clean_run(model, tc.point_in, params, tokens_P, T - 1)
  inputs = np.asarray(inputs_LxTxD)
  active, values = [], []
  for layer in range(tc.num_layers):
    z_TxZ = np.array(tc.latents(layer, inputs[layer]))
    z_TxZ[T:] = 0.0
    if zero_first:
      z_TxZ[0] = 0.0
    position_k, latent_k = np.nonzero(z_TxZ > 0)
    active.append(np.stack([np.full_like(position_k, layer), position_k, latent_k], 1))
    values.append(z_TxZ[position_k, latent_k])
  active_nx3, activations_n = np.concatenate(active), np.concatenate(values)
  entries = _entries(tc, active_nx3, activations_n)
  # Each MLP's output less its transcoders' (their biases and skip paths, then each active feature's vectors)
  fixed = tc.fixed_part()
  errors_LxTxD = np.asarray(outputs_LxTxD) - np.asarray(_fixed_outputs(fixed.static(), fixed.params, inputs_LxTxD))
  for layer, written in enumerate(entries):
    for features_k, vectors_kxD in written:
      np.add.at(errors_LxTxD[layer], active_nx3[features_k, 1], -vectors_kxD)
  errors_LxTxD[:, T:] = 0.0
  if zero_first:
    errors_LxTxD[:, 0] = 0.0
  setup = _Setup(frozen, inputs_LxTxD, jax.device_put(errors_LxTxD), embed_TxD, logits_V)
  return setup, active_nx3, activations_n, entries


@functools.partial(jax.jit, static_argnums=(0, 1))
def _clean_run(model, point_in: str, params, tokens_T, last):
  """The model's run on the prompt: (what the replacement model fixes, each transcoder's input and each MLP's
  output (L x T x D, float32), the token embeddings, the logits at position `last`, the prompt's last)."""
  frozen, inputs, outputs = {}, {}, {}

  def record(path, x):
    name, layer, _ = split_path(path)
    if _frozen_kind(name) or name in ("mlp_out", "embed"):
      frozen[path] = x
    if name == "mlp_out":
      outputs[layer] = x[0]
    if name == point_in:
      inputs[layer] = x[0]
    return x

  with functions_at(record, _acted_on(point_in)):
    logits_BxTxV = model.apply({"params": params}, tokens_T[None])
  stack = lambda by_layer: jnp.stack([by_layer[layer] for layer in range(len(by_layer))]).astype(jnp.float32)
  embed_TxD = next(x for path, x in frozen.items() if split_path(path)[0] == "embed")[0]
  return frozen, stack(inputs), stack(outputs), embed_TxD, logits_BxTxV[0, last]


@functools.partial(jax.jit, static_argnums=0)
def _fixed_outputs(static: Transcoders, tc_params, inputs_LxTxD) -> jax.Array:
  """What the transcoders write whatever fires: each layer's output bias and skip path (L x T x D)."""
  tc = static.with_params(tc_params)
  T, D = inputs_LxTxD.shape[1:]
  fixed = [tc.output_bias(tc_params, m) + tc.skip(tc_params, m, inputs_LxTxD[m]) for m in range(tc.num_layers)]
  return jnp.stack([jnp.broadcast_to(y, (T, D)) for y in fixed])


def _entries(tc: Transcoders, active_nx3, activations_n) -> list[list[tuple[np.ndarray, np.ndarray]]]:
  """What the active features write, by the layer written: (the features, each one's a·W_dec vector there), an
  entry for each layer a feature's decoder writes (its own for a transcoder a layer; its own and every later
  one for a cross-layer transcoder). Only the active latents' decoder rows are read."""
  entries = [[] for _ in range(tc.num_layers)]
  for layer in range(tc.num_layers):
    mine = np.flatnonzero(active_nx3[:, 0] == layer)
    dec_kxMxD, first = tc.decoder_rows(layer, active_nx3[mine, 2])
    for m in range(dec_kxMxD.shape[1]):
      entries[first + m].append((mine, activations_n[mine, None] * dec_kxMxD[:, m]))
  return entries


def _sources(setup: _Setup, entries: list, active_nx3) -> dict:
  """Every source node's output vectors: each feature's `_entries` as cells, by the layer written (its vector,
  feature, position and slot among that cell's entries); the errors (L x T x D) and the token embeddings (T x D)."""
  L, T, D = setup.errors_LxTxD.shape
  padded = bucket(len(active_nx3) + 1)  # one column at least past the features': where padding entries add
  # Every layer's entries padded to one size: a new prompt's programs are new only when its fullest layer's are.
  E = bucket(max(sum(len(f) for f, _ in layer_entries) for layer_entries in entries))
  written = [_cells(active_nx3, entries[layer], T, D, padded - 1, E) for layer in range(L)]
  return {
    "written": [{k: jax.device_put(v) for k, v in cells.items()} for cells in written],
    "num_features": len(active_nx3),
    "num_padded": padded,
    "errors_LxTxD": setup.errors_LxTxD,
    "embed_TxD": setup.embed_TxD.astype(jnp.float32),
  }


def _cells(active_nx3, entries: list, T: int, D: int, spare: int, E: int) -> dict:
  """One layer's written entries (features, vectors) as cells: each position's entries side by side, padded to
  the fullest position's count, so that the rows' contraction is one batched product, not a gather of
  B x E x D gradients, which XLA:CPU makes by transposing all of them. The slots are padded to a `bucket` size,
  the entries to E, the padding entries adding to the `spare` feature column (dropped)."""
  feature_e = np.concatenate([f for f, _ in entries] or [np.zeros(0, np.int64)])
  vectors_ExD = np.concatenate([v for _, v in entries] or [np.zeros((0, D))]).astype(np.float32)
  position_e = active_nx3[feature_e, 1]
  counts = np.bincount(position_e, minlength=T)
  order = np.argsort(position_e, kind="stable")
  slot_e = np.empty_like(position_e)
  slot_e[order] = np.arange(len(position_e)) - np.concatenate([[0], np.cumsum(counts)])[position_e[order]]
  # (the slots at 4 sizes an octave: the rows' contraction is a product over them)
  cells_TxMxD = np.zeros((T, bucket(max(1, int(counts.max(initial=0))), per_octave=4), D), np.float32)
  cells_TxMxD[position_e, slot_e] = vectors_ExD
  pad = E - len(feature_e)
  as_int = lambda x, fill: np.concatenate([x, np.full(pad, fill)]).astype(np.int32)
  return {
    "cells_TxMxD": cells_TxMxD,
    "feature_e": as_int(feature_e, spare),
    "position_e": as_int(position_e, 0),
    "slot_e": as_int(slot_e, 0),
  }


def _targets(tc: Transcoders, active_nx3, logit_vectors_KxD, L: int, T: int) -> dict:
  """Every target's input direction, where it reads: a feature's encoder column (its input_scale folded in)
  at its transcoder's input point (layer, position); a logit node's direction (`logit_targets`) on the final
  norm's output at the last position (layer L)."""
  vectors = []
  for layer in range(L):
    mine = active_nx3[:, 0] == layer
    vectors.append(tc.encoder_rows(layer, active_nx3[mine, 2]))
  K = len(logit_vectors_KxD)
  return {
    "vectors_NxD": np.concatenate([*vectors, logit_vectors_KxD]).astype(np.float32),
    "layer_N": np.concatenate([active_nx3[:, 0], np.full(K, L)]).astype(np.int32),
    "position_N": np.concatenate([active_nx3[:, 1], np.full(K, T - 1)]).astype(np.int32),
  }


# The targets' layers (0 .. L, L the logits') fall in this many groups, one program each: a target's backward pass
# starts at its group's top, not its own layer (a few layers of zeros more), so that a deep model's graph compiles
# four programs, not one a layer (tracing and compiling them was most of a first call).
_LAYER_GROUPS = 4


def _rows(model, tc: Transcoders, params, tokens_P, setup, sources, targets, batch_size: int, T: int) -> np.ndarray:
  """The adjacency's rows of every target (features', then logits'), `batch_size` backward passes at a time, one
  program for the targets of each group of layers (`_LAYER_GROUPS`: a target at layer l reads nothing later, so
  that its backward pass starts at its group's top), the last batch of each padded so that one program serves
  each group's batches. The prompt: `tokens_P`'s first T (the columns of the filler's positions dropped)."""
  N = len(targets["layer_N"])
  L, P, _ = setup.errors_LxTxD.shape
  n, padded = sources["num_features"], sources["num_padded"]
  out = np.zeros((N, n + (L + 1) * T), np.float32)
  arrays = {k: v for k, v in sources.items() if k not in ("num_features", "num_padded")}
  width = -(-(L + 1) // _LAYER_GROUPS)
  for group in np.unique(targets["layer_N"] // width):
    mine = np.flatnonzero(targets["layer_N"] // width == group)
    lowest, top = int(group) * width, min(L, (int(group) + 1) * width - 1)  # the group's, whichever are present
    B = max(1, min(batch_size, bucket(len(mine))))
    for start in range(0, len(mine), B):
      rows_b = mine[start : start + B]
      chunk = {k: _padded(targets[k][rows_b], B) for k in ("vectors_NxD", "position_N", "layer_N")}
      static = (tc.static(), padded, lowest, top)
      rows = np.asarray(_row_batch(model, static, params, tc.params, tokens_P, setup, arrays, chunk))[: len(rows_b)]
      by_position = rows[:, padded:].reshape(len(rows_b), L + 1, P)[:, :, :T].reshape(len(rows_b), -1)
      out[rows_b] = np.concatenate([rows[:, :n], by_position], axis=1)  # the padding columns dropped
  return out


def _padded(x: np.ndarray, size: int) -> np.ndarray:
  return np.concatenate([x, np.zeros((size - len(x), *x.shape[1:]), x.dtype)]) if len(x) < size else x


def replacement_inputs(model, tc: Transcoders, params, tokens_T, setup: _Setup, delta: dict):
  """The local replacement model on the prompt, with `delta` added to every MLP's output (L x T x D:
  "mlp_out") and to the token embeddings (T x D: "embed"): the transcoders' inputs (L x T x D) and the
  final norm's output (T x D). Linear in delta; at delta 0, the clean run's values."""
  inputs, final_TxD = _replacement_run(
    model, tc, params, tokens_T, setup, {**delta, "mlp_out": dict(enumerate(delta["mlp_out"]))}
  )
  return jnp.stack([inputs[layer] for layer in range(tc.num_layers)]), final_TxD


def _replacement_run(model, tc: Transcoders, params, tokens_T, setup: _Setup, delta: dict):
  """`replacement_inputs`, `delta`'s MLP outputs and the inputs as {layer: T x D} (a layer not in delta: not
  moved): a caller that reads one layer's leaves the others' cotangents zero by construction, so that a backward
  pass from it never enters the layers after it."""
  live_in = {}

  def replace(path, x):
    name, layer, _ = split_path(path)
    if _frozen_kind(name):
      return setup.frozen[path]
    if name == tc.point_in:
      live_in[layer] = x
    if name == "mlp_out":  # fixed, but for a skip path, which stays live (it is linear)
      moved = tc.skip(tc.params, layer, live_in[layer] - setup.inputs_LxTxD[layer])
      return setup.frozen[path] + (delta["mlp_out"].get(layer, 0.0) + moved).astype(x.dtype)
    if name == "embed":
      return x + delta["embed"].astype(x.dtype)
    return x

  with functions_at(replace, _acted_on(tc.point_in)):
    final_BxTxD = model.apply({"params": params}, tokens_T[None], method=type(model).hidden_states)
  return {layer: x[0].astype(jnp.float32) for layer, x in live_in.items()}, final_BxTxD[0].astype(jnp.float32)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _row_batch(model, static, params, tc_params, tokens_T, setup, sources, targets) -> jax.Array:
  """B rows of the adjacency, of targets that read layers `lowest` .. `top` (`static`'s; `targets["layer_N"]`
  each one's; L: the final norm's output): one backward pass of the replacement model a target (vmapped) from the
  top down, its cotangent where it reads, each gradient contracted with every source's output vectors.
  B x (features + errors + tokens)."""
  static_tc, n, lowest, top = static
  tc = static_tc.with_params(tc_params)
  L, T, D = setup.errors_LxTxD.shape
  # Only the MLP outputs before the top layer move what they read: the others are no inputs of the pass.
  zeros = {"mlp_out": {w: jnp.zeros((T, D), jnp.float32) for w in range(top)}, "embed": jnp.zeros((T, D))}

  def read(delta):  # what the targets read: the backward pass starts there
    inputs, final_TxD = _replacement_run(model, tc, params, tokens_T, setup, delta)
    return [final_TxD if layer == L else inputs[layer] for layer in range(lowest, top + 1)]

  _, backward = jax.vjp(read, zeros)

  def cotangents(vector_D, position, target_layer):  # zero but where the target reads
    at_TxD = jnp.zeros((T, D)).at[position].set(vector_D)
    return [jnp.where(target_layer == layer, at_TxD, 0.0) for layer in range(lowest, top + 1)]

  # Gradients position-major (T x B x D): the contraction's batch is the position.
  (grads,) = jax.vmap(lambda *target: backward(cotangents(*target)), out_axes=1)(
    targets["vectors_NxD"], targets["position_N"], targets["layer_N"]
  )
  B = targets["position_N"].shape[0]
  features_Bxn, errors = jnp.zeros((B, n)), []
  for w in range(L):
    if w >= top:
      errors.append(jnp.zeros((B, T)))
      continue
    g_TxBxD, written = grads["mlp_out"][w], sources["written"][w]
    # Each entry's vector dotted with the gradient where it writes, summed over a feature's entries.
    by_slot_TxBxM = jnp.einsum("tbd,tmd->tbm", g_TxBxD, written["cells_TxMxD"])
    entries_BxE = by_slot_TxBxM[written["position_e"], :, written["slot_e"]].T
    features_Bxn = features_Bxn.at[:, written["feature_e"]].add(entries_BxE)
    errors.append(jnp.einsum("tbd,td->bt", g_TxBxD, sources["errors_LxTxD"][w]))
  tokens_BxT = jnp.einsum("tbd,td->bt", grads["embed"], sources["embed_TxD"])
  return jnp.concatenate([features_Bxn, *errors, tokens_BxT], axis=1)


def plan(model, params, transcoders: Transcoders, num_tokens: int, l0: int, batch_size: int = 256, **caps) -> dict:
  """The bytes a graph of `num_tokens` tokens needs, before one is made (nothing is allocated: `params` may be
  abstract, jax.ShapeDtypeStruct), for `l0` features of each layer firing at each position: each program that
  `attribute` runs, compiled against abstract arrays for this machine's backend (XLA's memory analysis: arguments
  + outputs + temporaries; on an accelerator, the device's), and the host arrays that grow with the active
  features (the rows computed, the targets' directions, the unembedding, one layer's latents). "peak": the model's
  params, the largest program's outputs and temporaries and one layer's encoder beside them, and the host's.
  `caps`: attribute's max_feature_nodes and max_n_logits."""
  max_feature_nodes, max_n_logits = caps.get("max_feature_nodes"), caps.get("max_n_logits", 10)
  tc = transcoders.check(model)
  L, D, T = model.config.num_layers, model.config.block.d_model, prompt_bucket(num_tokens, model.config.max_len)
  Z, V = tc.configs()[0].latents, model.config.vocab_size
  n, K = L * (num_tokens - 1) * l0, max_n_logits  # (the first position's left out)
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
  size = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
  parts = lambda m: (m.argument_size_in_bytes, m.output_size_in_bytes, m.temp_size_in_bytes)
  total = lambda compiled: sum(parts(compiled.memory_analysis()))
  tokens_T = i32(T)
  clean = _clean_run.lower(model, tc.point_in, params, tokens_T, i32()).compile()
  frozen, *_, embed_TxD, logits_V = jax.eval_shape(
    lambda p, t: _clean_run(model, tc.point_in, p, t, T - 1), params, tokens_T
  )
  config = tc.configs()[0]
  encoder = {"W_enc": f32(D, Z), "b_enc": f32(Z), "input_scale": f32()} | (
    {"threshold": f32(Z)} if config.activation in ("jumprelu", "batchtopk") else {}
  )
  per_layer = isinstance(tc, PerLayerTranscoders)  # (a cross-layer transcoder's encoders: its params, counted)
  encode = jax.jit(sae.encode, static_argnums=0).lower(config, encoder, f32(T, D)).compile() if per_layer else None
  setup = _Setup(frozen, f32(L, T, D), f32(L, T, D), embed_TxD, logits_V)
  entries = {k: i32(bucket(T * l0)) for k in ("feature_e", "position_e", "slot_e")}
  cells = {"cells_TxMxD": f32(T, bucket(l0, per_octave=4), D), **entries}
  sources = {"written": [cells] * L, "errors_LxTxD": f32(L, T, D), "embed_TxD": f32(T, D)}
  targets = {"vectors_NxD": f32(batch_size, D), "position_N": i32(batch_size), "layer_N": i32(batch_size)}
  fixed = tc.fixed_part()
  width = -(-(L + 1) // _LAYER_GROUPS)
  static = (fixed.static(), bucket(n + 1), (L // width) * width, L)  # the top group's: the deepest passes
  rows = _row_batch.lower(model, static, params, fixed.params, tokens_T, setup, sources, targets).compile()
  computed = min(n, max_feature_nodes or n) + K
  host = 4 * (computed * (n + (L + 1) * num_tokens) + n * D + V * D + T * Z)
  programs = {"clean run": total(clean), "encode a layer": total(encode) if encode else 0, "rows a batch": total(rows)}
  largest = max(sum(parts(c.memory_analysis())[1:]) for c in (clean, rows, encode) if c is not None)
  peak = size(params) + largest + size(encoder) + host
  return {"params": size(params), **programs, "host": host, "peak": peak}


def dense_rows(model, params, tokens_T, transcoders: Transcoders, graph: Graph, zero_first: bool = True) -> np.ndarray:
  """The graph's rows by another road, for checking `attribute` (small models: one Jacobian of the whole
  graph): every source's output vectors scaled by a coefficient c_s (1: the prompt), the targets' inputs
  as functions of all coefficients, differentiated at c = 1 by `jax.jacrev`. (features + logits) x
  (features + errors + tokens), as `graph.adjacency_NxN`'s non-zero rows."""
  tc = transcoders.check(model).unboxed()
  params = nn.unbox(params)
  tokens = jax.device_put(np.asarray(tokens_T, np.int32).reshape(-1))
  setup = _setup(model, tc, params, tokens, zero_first, len(tokens))[0]  # (unpadded: another road)
  sources = _sources(setup, _entries(tc, graph.active_features, graph.activations), graph.active_features)
  vectors_KxD = graph.logit_vectors_KxD
  if vectors_KxD is None:  # (a graph made before it kept them: its tokens' directions)
    unembed_DxV = np.asarray(gpt.unembedding(model.config, params), np.float32).T
    vectors_KxD = logit_targets(unembed_DxV, np.zeros(unembed_DxV.shape[1]), graph.logit_tokens)[2]
  targets = _targets(tc, graph.active_features, vectors_KxD, model.config.num_layers, len(tokens))
  L, T, D = setup.errors_LxTxD.shape
  n = len(graph.active_features)

  def target_values(c):
    c_feat, c_err, c_tok = c[:n] - 1.0, c[n : n + L * T] - 1.0, c[n + L * T :] - 1.0
    moved = []
    for w, written in enumerate(sources["written"]):
      vectors_ExD = written["cells_TxMxD"][written["position_e"], written["slot_e"]]
      coefficient_e = jnp.where(written["feature_e"] < n, c_feat[jnp.minimum(written["feature_e"], n - 1)], 0.0)
      moved_TxD = jnp.zeros((T, D)).at[written["position_e"]].add(coefficient_e[:, None] * vectors_ExD)
      moved.append(moved_TxD + c_err[w * T : (w + 1) * T, None] * sources["errors_LxTxD"][w])
    delta = {"mlp_out": jnp.stack(moved), "embed": c_tok[:, None] * sources["embed_TxD"]}
    inputs_LxTxD, final_TxD = replacement_inputs(model, tc.fixed_part(), params, tokens, setup, delta)
    read_NxD = jnp.concatenate([inputs_LxTxD, final_TxD[None]])[targets["layer_N"], targets["position_N"]]
    return jnp.sum(read_NxD * targets["vectors_NxD"], -1)

  return np.asarray(jax.jit(jax.jacrev(target_values))(jnp.ones(n + L * T + T)))


def intervene(
  model,
  params,
  tokens_T,
  transcoders: Transcoders,
  interventions: list[tuple[int, int, int, float]],
  direct_effects: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """(the last position's logits V, every layer's feature activations L x T x Z) of the model itself with
  features set: each (layer, position, latent, value) sets that feature's activation, and the MLP outputs it
  writes move by its decoders' change (circuit-tracer's `feature_intervention`), with the attention patterns
  fixed at the prompt's. Later transcoders read the changed stream, so later features respond. `direct_effects`:
  the norms' divisors and the MLPs' outputs fixed as well (the local replacement model), where a logit
  moves by exactly what the graph's edges from the set features say."""
  tc = transcoders.check(model).unboxed().in_memory()
  tokens_T = np.asarray(tokens_T, np.int32).reshape(-1)
  T, tokens_P = len(tokens_T), jax.device_put(padded_prompt(tokens_T, model.config.max_len, None))  # as `attribute`
  params = nn.unbox(params)
  frozen, inputs_LxTxD = _clean_run(model, tc.point_in, params, tokens_P, T - 1)[:2]
  # The interventions padded to a bucket of their count with ones of no layer past the prompt (dropped: no change).
  where_Ix4 = np.asarray(interventions, np.float32).reshape(-1, 4)
  spare = np.tile([[-1, len(tokens_P), 0, 0]], (bucket(len(where_Ix4)) - len(where_Ix4), 1))
  where_Ix4 = jax.device_put(np.concatenate([where_Ix4, spare]))
  run = (frozen, inputs_LxTxD, where_Ix4, direct_effects)
  logits_V, z_LxTxZ = _intervened(model, tc.static(), params, tc.params, tokens_P, T - 1, *run)
  return np.asarray(logits_V), np.asarray(z_LxTxZ)[:, :T]


@functools.partial(jax.jit, static_argnums=(0, 1, 9))
def _intervened(
  model, static, params, tc_params, tokens_T, last, frozen, inputs_LxTxD, where_Ix4, direct_effects: bool
):
  tc = static.with_params(tc_params)
  live_in, z, moved = {}, {}, {}  # moved[l]: layer l's latents' change (set - as they came)
  layer_I, position_I, latent_I = (where_Ix4[:, i].astype(int) for i in range(3))

  def change(path, x):
    name, layer, _ = split_path(path)
    if name == "pattern" or (direct_effects and _frozen_kind(name)):
      return frozen[path]
    if name == tc.point_in:
      live_in[layer] = x[0]
      z_TxZ = tc.encode(tc_params, layer, x[0])
      kept_I = z_TxZ[position_I, latent_I]
      z[layer] = z_TxZ.at[position_I, latent_I].set(jnp.where(layer_I == layer, where_Ix4[:, 3], kept_I), mode="drop")
      moved[layer] = z[layer] - z_TxZ
    if name != "mlp_out":  # (a pattern, and with direct effects a norm's divisor, fixed above)
      return x
    change_TxD = sum(_written(tc, tc_params, source, layer, moved[source]) for source in range(layer + 1))
    if direct_effects:  # the MLP fixed, its skip path live, as in the replacement model
      change_TxD = change_TxD + tc.skip(tc_params, layer, live_in[layer] - inputs_LxTxD[layer])
      x = frozen[path]
    return x + change_TxD[None].astype(x.dtype)

  with functions_at(change, _acted_on(tc.point_in)):
    logits_BxTxV = model.apply({"params": params}, tokens_T[None])
  return logits_BxTxV[0, last], jnp.stack([z[layer] for layer in range(tc.num_layers)])


def _written(tc: Transcoders, tc_params, source: int, layer: int, z_TxZ) -> jax.Array:
  """What latents of layer `source` write into layer `layer`'s MLP output (0 where they write nothing)."""
  dec_ZxMxD, first = tc.decoders(tc_params, source)
  if not first <= layer < first + dec_ZxMxD.shape[1]:
    return jnp.zeros((), jnp.float32)
  return z_TxZ @ dec_ZxMxD[:, layer - first]
