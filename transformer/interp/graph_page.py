"""One self-contained HTML page of a pruned attribution graph (no server: styles, script and data inline).

Nodes sit by position (columns: the prompt's tokens) and layer (rows: the embeddings at the bottom, then
each layer's features and errors, the logits on top); an edge is drawn blue when it raises its target's
input and red when it lowers it, as wide as its weight. Clicking a node lists its strongest inputs and
outputs, and for a feature its top contexts when the page is given them (`contexts`: node id -> lines).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>%(title)s</title>
<style>
body { font: 13px sans-serif; margin: 0; display: flex; }
#graph { flex: 3; } #side { flex: 1; padding: 8px; border-left: 1px solid #ccc; height: 100vh; overflow: auto; }
.node { cursor: pointer; } .node:hover { stroke: #000; }
pre { white-space: pre-wrap; background: #f6f6f6; padding: 4px; }
</style></head><body>
<svg id="graph" height="%(height)d"></svg>
<div id="side"><h3>%(title)s</h3><p>%(prompt)s</p><p>%(summary)s</p><div id="info">Click a node.</div></div>
<script>
const G = %(data)s;
const svg = document.getElementById("graph"), info = document.getElementById("info");
const W = svg.clientWidth || 900, H = %(height)d, T = G.metadata.prompt_tokens.length, L = G.layers + 2;
const x = n => 40 + (n.ctx_idx + 0.5) * (W - 60) / T + (n.slot || 0) * 7;
// rows 0 .. L - 1: the embeddings, each layer's features and errors, the logits (whose layer is
// circuit-tracer's, one past the last: their row is the top one, not a step above it)
const row = n => n.layer === "E" ? 0 : n.feature_type === "logit" ? L - 1 : +n.layer + 1;
const y = n => H - 40 - row(n) * (H - 80) / (L - 1);
const byId = {}; const slots = {};
for (const n of G.nodes) {
  const k = n.layer + "/" + n.ctx_idx;
  n.slot = slots[k] = (slots[k] ?? -1) + 1;
  byId[n.node_id] = n;
}
const NS = "http://www.w3.org/2000/svg", max = Math.max(...G.links.map(l => Math.abs(l.weight)), 1e-9);
function el(name, attrs, parent) {
  const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  (parent || svg).appendChild(e);
  return e;
}
for (const l of G.links) {
  const s = byId[l.source], t = byId[l.target];
  if (!s || !t) continue;
  el("line", {x1: x(s), y1: y(s), x2: x(t), y2: y(t), stroke: l.weight > 0 ? "#3069c8" : "#d0413a",
    "stroke-width": 0.3 + 3 * Math.abs(l.weight) / max, "stroke-opacity": 0.5});
}
G.metadata.prompt_tokens.forEach((tok, i) => {
  const t = el("text", {x: 40 + (i + 0.5) * (W - 60) / T, y: H - 10, "text-anchor": "middle"});
  t.textContent = tok;
});
const colour = {"embedding": "#888", "logit": "#2a2", "mlp reconstruction error": "#c80"};
for (const n of G.nodes) {
  const shape = n.feature_type === "mlp reconstruction error" ? "rect" : "circle";
  const c = el(shape, {class: "node", fill: colour[n.feature_type] || "#55c",
    cx: x(n), cy: y(n), r: 5, x: x(n) - 4, y: y(n) - 4, width: 8, height: 8});
  el("title", {}, c).textContent = n.clerp || n.node_id;
  c.onclick = () => show(n);
}
const strongest = links => links.sort((a, b) => Math.abs(b.weight) - Math.abs(a.weight)).slice(0, 12);
function show(n) {
  const ins = strongest(G.links.filter(l => l.target === n.node_id));
  const outs = strongest(G.links.filter(l => l.source === n.node_id));
  const row = (id, w) => `<tr><td>${(byId[id] && byId[id].clerp) || id}</td><td>${w.toFixed(4)}</td></tr>`;
  const ctx = (G.contexts[n.node_id] || []).map(s => `<pre>${s}</pre>`).join("");
  const act = n.activation != null ? `, activation ${n.activation.toFixed(3)}` : "";
  info.innerHTML = `<h4>${n.clerp || n.node_id}</h4><p>${n.feature_type}, layer ${n.layer}, ` +
    `position ${n.ctx_idx}${act}, cumulative influence ${(n.influence ?? 0).toFixed(3)}</p>` +
    `<b>inputs</b><table>${ins.map(l => row(l.source, l.weight)).join("")}</table>` +
    `<b>outputs</b><table>${outs.map(l => row(l.target, l.weight)).join("")}</table>` +
    (ctx ? `<b>top contexts</b>${ctx}` : "");
}
</script></body></html>
"""


def write_page(
  graph_json: dict, num_layers: int, path: str | Path, contexts: dict | None = None, summary: str = ""
) -> Path:
  """The page of `graph_json` (graph_view.to_json's) at `path`."""
  data = {**graph_json, "layers": num_layers, "contexts": contexts or {}}
  meta = graph_json["metadata"]
  page = _PAGE % {
    "title": html.escape(f"attribution graph: {meta['slug']}"),
    "prompt": html.escape(meta["prompt"]),
    "summary": html.escape(summary),
    "height": 120 + 90 * (num_layers + 2),
    "data": json.dumps(data).replace("</", "<\\/"),
  }
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(page)
  return path
