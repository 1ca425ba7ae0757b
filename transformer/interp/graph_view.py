"""Reading an attribution graph (transformer.interp.graph): pruning to the nodes and edges that carry the
logits' influence, the graph's scores, and the files circuit-tracer's viewer and a browser read.

Influence, as circuit-tracer computes it: each row of |adjacency| normalised to sum 1 (a target's inputs
as shares), the logits weighted by their probabilities, and a node's influence the sum over every path to
the logits of the products of the shares along it (A + A² + ...: the graph is acyclic, so it ends).
Pruning keeps the nodes that carry `node_threshold` of the total influence (tokens and logits always),
then the edges that carry `edge_threshold` of it, then drops features left without an edge out or in.

    >>> kept = prune(graph, node_threshold=0.8, edge_threshold=0.98)
    >>> write_json(graph, kept, "graph.json", tokenizer)      # circuit-tracer's viewer's format
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from transformer.errors import UserError
from transformer.interp import graph_page, replacement
from transformer.interp.graph import Graph, attribute
from transformer.interp.interventions import run_with_cache


@dataclasses.dataclass
class Pruned:
  node_mask: np.ndarray  # N: kept nodes
  edge_mask: np.ndarray  # N x N: kept edges (rows targets)
  cumulative_scores: np.ndarray  # N: the share of all influence of the nodes at least as influential


def normalized(adjacency_NxN: np.ndarray) -> np.ndarray:
  """|adjacency| with each row summing to 1 (a target's inputs as shares; a row of zeros stays zero)."""
  a = np.abs(adjacency_NxN).astype(np.float64)
  return a / np.maximum(a.sum(1, keepdims=True), 1e-10)


def influence(shares_NxN: np.ndarray, logit_weights_N: np.ndarray, max_iter: int = 1000) -> np.ndarray:
  """Each node's total influence on the weighted logits: w A + w A² + ... until no path is left."""
  current = logit_weights_N @ shares_NxN
  total = current.copy()
  for _ in range(max_iter):
    if not current.any():
      return total
    current = current @ shares_NxN
    total += current
  raise RuntimeError(f"influence did not converge in {max_iter} steps: the graph has a cycle")


def logit_weights(graph: Graph) -> np.ndarray:
  w = np.zeros(len(graph.adjacency_NxN))
  w[len(w) - len(graph.logit_tokens) :] = graph.logit_probabilities
  return w


def _threshold(scores: np.ndarray, share: float) -> float:
  """The score above which the highest scores make up `share` of their sum."""
  ordered = np.sort(scores.ravel())[::-1]
  cumulative = np.cumsum(ordered) / max(ordered.sum(), 1e-30)
  return ordered[min(int(np.searchsorted(cumulative, share)), len(ordered) - 1)]


def prune(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
  """The nodes and edges that carry most of the logits' influence (circuit-tracer's `prune_graph`)."""
  for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
    if not 0.0 <= value <= 1.0:
      raise ValueError(f"{name} is a share of the influence, between 0 and 1; got {value}")
  A = graph.adjacency_NxN
  w = logit_weights(graph)
  n_keep_always = len(graph.logit_tokens) + graph.num_positions  # tokens and logits
  node_influence = influence(normalized(A), w)
  node_mask = node_influence >= _threshold(node_influence, node_threshold)
  node_mask[len(A) - n_keep_always :] = True
  pruned = np.where(node_mask[:, None] & node_mask[None, :], A, 0.0)
  shares = normalized(pruned)
  edge_scores = shares * (influence(shares, w) + w)[:, None]
  edge_mask = edge_scores >= _threshold(edge_scores, edge_threshold)
  features, inner = graph.num_features, len(A) - n_keep_always

  def connected():  # features and errors need an edge out, features an edge in
    node_mask[:inner] &= edge_mask[:, :inner].any(0)
    node_mask[:features] &= edge_mask[:features].any(1)

  before = node_mask.copy()
  connected()
  while (node_mask != before).any():  # each pass may leave others without edges (circuit-tracer's order)
    before = node_mask.copy()
    edge_mask &= node_mask[:, None] & node_mask[None, :]
    connected()
  order = np.argsort(-node_influence, kind="stable")
  cumulative = np.zeros_like(node_influence)
  cumulative[order] = np.cumsum(node_influence[order]) / max(node_influence.sum(), 1e-30)
  return Pruned(node_mask, edge_mask, cumulative)


def scores(graph: Graph) -> dict[str, float]:
  """circuit-tracer's two scores of how much of the computation the features explain: `replacement`, the
  share of the tokens' and errors' influence on the logits that the tokens have (1: no path through an
  error), and `completeness`, the share of each node's inputs not from errors, weighted by its influence."""
  A = normalized(graph.adjacency_NxN)
  w = logit_weights(graph)
  node_influence = influence(A, w)
  errors = slice(graph.num_features, graph.token_index(0))
  tokens = slice(graph.token_index(0), graph.logit_index(0))
  token, error = node_influence[tokens].sum(), node_influence[errors].sum()
  weight = node_influence + w
  return {
    "replacement": float(token / (token + error)),
    "completeness": float(((1 - A[:, errors].sum(1)) * weight).sum() / weight.sum()),
  }


def node_ids(graph: Graph) -> list[str]:
  """circuit-tracer's node ids: `{layer}_{latent}_{position}`, errors `0_{layer}_{position}`, tokens
  `E_{token}_{position}`, logits `{layers + 1}_{token}_{last position}`."""
  T, L = graph.num_positions, graph.num_layers
  ids = [f"{layer}_{latent}_{pos}" for layer, pos, latent in graph.active_features]
  ids += [f"0_{layer}_{pos}" for layer in range(L) for pos in range(T)]
  ids += [f"E_{int(token)}_{pos}" for pos, token in enumerate(graph.tokens)]
  ids += [f"{L + 1}_{int(token)}_{T - 1}" for token in graph.logit_tokens]
  return ids


def to_json(
  graph: Graph,
  kept: Pruned,
  decode,
  slug: str = "graph",
  node_threshold: float = 0.8,
  scan: str = "",
  transcoder_list: tuple[str, ...] = (),
) -> dict:
  """The pruned graph in the form circuit-tracer writes for its viewer (metadata, qParams, nodes, links):
  `decode(id) -> str` names tokens; `scan` names the transcoders (default: the slug) and `transcoder_list` the
  files or runs of their layers (dictionaries.names gives both)."""
  ids = node_ids(graph)
  T, L, n = graph.num_positions, graph.num_layers, graph.num_features
  show = lambda text: text.replace("\n", "⏎").replace("\t", "→").replace("\r", "↵")
  nodes = []
  for i in map(int, np.flatnonzero(kept.node_mask)):
    node = {"node_id": ids[i], "jsNodeId": ids[i], "influence": float(kept.cumulative_scores[i])}
    if i < n:
      layer, pos, latent = map(int, graph.active_features[i])
      node.update(feature=latent, layer=str(layer), ctx_idx=pos, feature_type="cross layer transcoder")
      node["activation"] = float(graph.activations[i])
    elif i < graph.token_index(0):
      layer, pos = divmod(i - n, T)
      node.update(feature=-1, layer=str(layer), ctx_idx=pos, feature_type="mlp reconstruction error")
    elif i < graph.logit_index(0):
      pos = i - graph.token_index(0)
      node.update(feature=pos, layer="E", ctx_idx=pos, feature_type="embedding", clerp=show(decode(graph.tokens[pos])))
    else:
      k = i - graph.logit_index(0)
      p = float(graph.logit_probabilities[k])
      token = show(graph.logit_labels[k] if graph.logit_labels else decode(graph.logit_tokens[k]))
      node.update(feature=int(graph.logit_tokens[k]), layer=str(L + 1), ctx_idx=T - 1, feature_type="logit")
      node.update(token_prob=p, is_target_logit=k == 0, clerp=f'Output "{token}" (p={p:.3f})')
    nodes.append(node)
  targets, sources = np.nonzero(kept.edge_mask)
  links = [
    {"source": ids[s], "target": ids[t], "weight": float(graph.adjacency_NxN[t, s])} for t, s in zip(targets, sources)
  ]
  metadata = {
    "slug": slug,
    "scan": scan or slug,
    "transcoder_list": list(transcoder_list),
    "prompt_tokens": [show(decode(t)) for t in graph.tokens],
    "prompt": "".join(decode(t) for t in graph.tokens),
    "node_threshold": node_threshold,
  }
  q_params = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
  return {"metadata": metadata, "qParams": q_params, "nodes": nodes, "links": links}


def write_json(graph: Graph, kept: Pruned, path: str | Path, decode, slug: str = "graph") -> Path:
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(to_json(graph, kept, decode, slug), indent=1))
  return path


def study(
  model,
  params,
  tokenizer,
  text: str,
  transcoders,
  out: str | Path | None = None,
  held_out_BxT=None,
  names: tuple[str, tuple[str, ...]] = ("", ()),
  **attribute_kwargs,
) -> dict:
  """The attribution graph of `text` through `transcoders`, pruned (the first position left out, as
    circuit-tracer leaves out its BOS): its numbers, and in `out` graph.json (circuit-tracer's viewer's),
    graph.html (transformer.interp.graph_page; with `held_out_BxT`, windows of held-out text, each kept
    feature's top contexts in them) and graph.npz (the whole adjacency and its nodes); `names`: the transcoders'
  scan and the sources of their layers, as the viewer's metadata (dictionaries.names). With held-out text,
    `replacement_losses` too: the model's loss on it clean, with every MLP replaced and with every MLP zeroed."""
  tokens = tokenizer.encode(text)
  if len(tokens) < 2:
    raise UserError(f"the text {text!r} is {len(tokens)} token(s): a graph needs a first token and one to explain")
  graph = attribute(model, params, np.asarray(tokens), transcoders, zero_first=True, **attribute_kwargs)
  kept = prune(graph)
  decode = lambda token: tokenizer.decode([int(token)])
  record = {
    "tokens": [decode(t) for t in graph.tokens],
    "active_features": graph.num_features if graph.num_active < 0 else graph.num_active,
    "feature_nodes": graph.num_features,
    "kept_nodes": int(kept.node_mask.sum()),
    "kept_edges": int(kept.edge_mask.sum()),
    "logits": [
      (graph.logit_labels[k] if graph.logit_labels else decode(t), float(p))
      for k, (t, p) in enumerate(zip(graph.logit_tokens, graph.logit_probabilities))
    ],
    **scores(graph),
  }
  if held_out_BxT is not None:  # how much of the model the transcoders are: every MLP replaced at once
    record["replacement_losses"] = replacement.replacement_losses(model, params, np.asarray(held_out_BxT), transcoders)
  if out is not None:
    out = Path(out)
    data = to_json(graph, kept, decode, slug=out.name or "graph", scan=names[0], transcoder_list=names[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "graph.json").write_text(json.dumps(data, indent=1))
    summary = (
      f"{record['kept_nodes']} of {len(kept.node_mask)} nodes kept; replacement score {record['replacement']:.3f}"
    )
    graph_page.write_page(data, graph.num_layers, out / "graph.html", summary=summary)
    np.savez_compressed(
      out / "graph.npz",
      tokens=graph.tokens,
      active_features=graph.active_features,
      activations=graph.activations,
      logit_tokens=graph.logit_tokens,
      logit_probabilities=graph.logit_probabilities,
      adjacency=graph.adjacency_NxN,
      node_mask=kept.node_mask,
    )
  return record


def top_contexts(model, params, tokenizer, transcoders, tokens_BxT, features: list, count: int = 3) -> dict:
  """{(layer, latent): [context, ...]}: the `count` windows' positions of held-out text (`tokens_BxT`) where each
  feature is most active, as text with that token in brackets (12 tokens before it, 3 after): what a graph's
  page shows beside a feature node (the SAE feature pages' contexts)."""
  tc = transcoders.check(model).unboxed()
  tokens_BxT = np.asarray(tokens_BxT)
  inputs_LxBxTxD = np.asarray(run_with_cache(model, params, tokens_BxT, names=(tc.point_in,))[1][tc.point_in])
  out = {}
  B, T = tokens_BxT.shape
  for layer in sorted({layer for layer, _ in features}):
    z_NxZ = tc.latents(layer, inputs_LxBxTxD[layer].reshape(B * T, -1))
    for latent in sorted({latent for l, latent in features if l == layer}):
      best = np.argsort(-z_NxZ[:, latent], kind="stable")[:count]
      out[(layer, latent)] = [_context(tokenizer, tokens_BxT[n // T], n % T) for n in best if z_NxZ[n, latent] > 0]
  return out


def _context(tokenizer, row_T, position: int, before: int = 12, after: int = 3) -> str:
  text = lambda ids: tokenizer.decode([int(i) for i in ids])
  start, end = max(0, position - before), min(len(row_T), position + after + 1)
  return f"{text(row_T[start:position])}[{text(row_T[position : position + 1])}]{text(row_T[position + 1 : end])}"
