"""circuit-tracer's own viewer (its frontend, served by its own `local_server`) opened on a graph.json of ours in
headless Chromium, for tests/test_pages.py (peer-gated): prints one JSON line, {"drawn": the nodes its link
graph draws, "expected": those its pruning slider keeps at the graph's node_threshold, "errors": the console's
uncaught errors, "schema": whether circuit-tracer's own `graph_models.Model` takes the file}.

Its index.html loads d3, its jetpack, npy, dagre and pako from CDNs, which a closed machine cannot reach; here they
come from the npm registry's packages instead (d3 7, d3-collection and d3-jetpack 2.3 for the jetpack, dagre
0.8.5, pako 2.1.0: the versions it names), installed into the served copy, with two lines of glue: d3-jetpack's
CommonJS build loaded onto the page's d3, and its `drawAxis(c)` as the `c.drawAxis(svg)` method the viewer's own
jetpack build has. The hot-reload client and npy (read for .npy data, which a graph does not use) are left out.

  <venv with circuit-tracer>/bin/python tests/ct_viewer.py graph.json WORKDIR
"""

import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from circuit_tracer.frontend.graph_models import Model
from circuit_tracer.frontend.local_server import DEFAULT_FRONTEND_DIR, serve
from circuit_tracer.frontend.utils import add_graph_metadata

NPM = ("d3@7", "d3-collection@1", "d3-jetpack@2.3.0", "dagre@0.8.5", "pako@2.1.0")
CDN = "https://transformer-circuits.pub/2025/attribution-graphs/static_js/lib/"
SCRIPTS = {  # the CDN's scripts -> the npm packages' files (in their order)
  f"{CDN}hotserver-client-ws.js": [],
  f"{CDN}d3.js": ["d3/dist/d3.min.js", "d3-collection/dist/d3-collection.min.js"],
  f"{CDN}jetpack_2024-07-20.js": ["cjs-before.js", "d3-jetpack/build/d3-jetpack.cjs", "cjs-after.js"],
  f"{CDN}npy_v0.js": [],
  "https://unpkg.com/dagre@0.8.5/dist/dagre.min.js": ["dagre/dist/dagre.min.js"],
  "https://unpkg.com/pako@2.1.0/dist/pako.min.js": ["pako/dist/pako.min.js"],
}
BEFORE = "window.module = {exports: {}}; window.exports = window.module.exports; window.require = () => window.d3;\n"
AFTER = """for (const [k, v] of Object.entries(window.module.exports)) if (!(k in window.d3)) window.d3[k] = v;
delete window.module; delete window.exports; delete window.require;
const conventions = window.d3.conventions;
window.d3.conventions = function (options) {
  const c = conventions(options);
  c.drawAxis = svg => window.d3.drawAxis(Object.assign({}, c, {svg: svg || c.svg}));
  return c;
};
"""
CHROMIUM = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking")
CHROMIUM += ("--disable-component-update", "--disable-sync", "--window-size=1600,1200", "--virtual-time-budget=15000")


def frontend(work: Path) -> Path:
  """A copy of circuit-tracer's frontend whose scripts are the npm registry's packages."""
  front = work / "frontend"
  shutil.copytree(str(DEFAULT_FRONTEND_DIR), front)
  subprocess.run(["npm", "install", "--silent", "--prefix", str(work), *NPM], check=True, timeout=600)
  vendor = front / "vendor"
  vendor.mkdir()
  (vendor / "cjs-before.js").write_text(BEFORE)
  (vendor / "cjs-after.js").write_text(AFTER)
  page = (front / "index.html").read_text()
  for url, files in SCRIPTS.items():
    tags = []
    for name in files:
      local = Path(name).name.replace(".cjs", ".js")  # (served as JavaScript)
      if "/" in name:  # a package's file; the glue is written above
        shutil.copy(work / "node_modules" / name, vendor / local)
      tags.append(f"<script src='./vendor/{local}'></script>")
    page = page.replace(f"<script src='{url}'></script>", "\n".join(tags))
  assert "https://" not in page, "a script of the viewer still comes from a CDN"
  (front / "index.html").write_text(page)
  return front


def main(graph_file: Path, work: Path) -> dict:
  graph = json.loads(graph_file.read_text())
  Model(**graph)  # circuit-tracer's own schema of a graph file
  data = work / "data"
  data.mkdir(parents=True)
  slug = graph["metadata"]["slug"]
  (data / f"{slug}.json").write_text(json.dumps(graph))
  add_graph_metadata(graph["metadata"], str(data))
  front = frontend(work)
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  server = serve(str(data), frontend_dir=str(front), port=port)
  try:
    with tempfile.TemporaryDirectory() as profile:
      url = f"http://localhost:{port}/index.html?slug={slug}"
      run = lambda *extra: subprocess.run(
        ["chromium", *CHROMIUM, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *extra, url],
        capture_output=True,
        text=True,
        timeout=120,
      )
      dom = run("--dump-dom")
      run(f"--screenshot={work / 'viewer.png'}")
  finally:
    server.stop()
  threshold = graph["metadata"]["node_threshold"]
  kept = [n for n in graph["nodes"] if n["feature_type"] in ("embedding", "logit") or n["influence"] <= threshold]
  return {
    "drawn": len(re.findall(r'<text class="node', dom.stdout)),
    "expected": len(kept),
    "errors": [line for line in dom.stderr.splitlines() if "Uncaught" in line],
    "schema": True,
  }


if __name__ == "__main__":
  print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))))
