"""The pages we write, opened in a real browser (headless Chromium, Debian's `chromium`): graph.html and
features.html run without a console message, draw every node their data holds inside the picture (positions
read from the DOM after the scripts ran) and a firing newline's shading where it can be seen. Each check keeps
a screenshot in build/pages/ (the test's artifact). Without Chromium the checks are skipped, saying so; .ci/run
installs it where it is missing."""

import io
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from transformer import dictionaries
from transformer.interp import features, graph_page, graph_view, probe_page, probes
from transformer.interp import graph as G
from transformer.models.formats.gpt2 import import_hf_gpt2
from transformer.models.gpt import GPT

from conftest import REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = REPO / "build" / "pages"
WINDOW = (1400, 1000)
# What a headless Chromium needs on a machine whose network is closed (its background connections refused).
FLAGS = (
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  f"--window-size={WINDOW[0]},{WINDOW[1]}",
  "--virtual-time-budget=5000",  # the page's scripts run to the end before the DOM is read
  "--enable-logging=stderr",
  "--v=0",
)

pytestmark = [
  pytest.mark.slow,  # a browser process a page
  pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH: install Debian's (apt-get install chromium)"),
]


def _open(page: Path, name: str) -> tuple[str, list[str]]:
  """(the DOM of `page` after its scripts ran, the console's messages); its screenshot into ARTIFACTS/name.png."""
  ARTIFACTS.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as profile:
    run = lambda *extra: subprocess.run(
      [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()],
      capture_output=True,
      text=True,
      timeout=120,
    )
    dom = run("--dump-dom")
    shot = run(f"--screenshot={ARTIFACTS / f'{name}.png'}")
  assert dom.returncode == 0 and shot.returncode == 0, (dom.stderr + shot.stderr)[-3000:]
  console = [line for line in (dom.stderr + shot.stderr).splitlines() if ":CONSOLE" in line or "Uncaught" in line]
  return dom.stdout, console


def _attributes(tag: str) -> dict[str, str]:
  return dict(re.findall(r'([\w-]+)="([^"]*)"', tag))


def test_the_graph_page_draws_every_node_inside_the_picture(tmp_path):
  """graph.html of a graph through circuit-tracer's transcoders: every node (tokens, features, errors, the logits
  every edge converges on) drawn, each inside the picture; no console message."""
  graph, data = _relu_graph()
  page = graph_page.write_page(data, graph.num_layers, tmp_path / "graph.html")
  dom, console = _open(page, "graph")
  assert not console, console
  svg = _attributes(re.search(r"<svg[^>]*>", dom).group(0))
  nodes = [_attributes(t) for t in re.findall(r'<(?:circle|rect)[^>]*class="node"[^>]*>', dom)]
  assert len(nodes) == len(data["nodes"]) and {n["feature_type"] for n in data["nodes"]} >= {"logit", "embedding"}
  height = float(svg["height"])
  for n in nodes:
    x, y = (float(n["cx"]), float(n["cy"])) if "cx" in n else (float(n["x"]) + 4, float(n["y"]) + 4)
    assert 0 < x < WINDOW[0] and 0 < y < height, n
  logits = [n for n in data["nodes"] if n["feature_type"] == "logit"]
  drawn_y = sorted({float(n["cy"]) for n in nodes if "cy" in n})
  assert drawn_y[0] < height / 4 and len(logits) > 0  # the logits' row at the top, inside it


def _relu_graph():
  """graph.json (circuit-tracer's viewer's form) of a graph through circuit-tracer's ReLU transcoders."""
  cfg, params = import_hf_gpt2(REPO / "tests" / "fixtures" / "gpt2_tiny_a")
  fixture = REPO / "tests" / "fixtures" / "graph" / "relu"
  _, transcoders = dictionaries.load_transcoders([str(fixture)])
  graph = G.attribute(GPT(cfg), params, np.load(fixture / "tokens.npy"), transcoders)
  kept = graph_view.prune(graph)
  scan, files = dictionaries.names([str(fixture)])
  return graph, graph_view.to_json(graph, kept, str, slug="relu", scan=scan, transcoder_list=files)


@pytest.mark.skipif(
  not os.environ.get("TRANSFORMER_CT_PYTHON") or shutil.which("npm") is None,
  reason="set TRANSFORMER_CT_PYTHON to a python with circuit-tracer (and have npm, for its viewer's scripts)",
)
def test_circuit_tracers_own_viewer_draws_our_graph(tmp_path):
  """Our graph.json, taken by circuit-tracer's own schema, served by its own local_server and drawn by its own
  viewer (its scripts from the npm registry's packages, not its CDNs: tests/ct_viewer.py): every node its pruning
  keeps drawn, no uncaught error."""
  _, data = _relu_graph()
  (tmp_path / "graph.json").write_text(json.dumps(data))
  script = REPO / "tests" / "ct_viewer.py"
  done = subprocess.run(
    [os.environ["TRANSFORMER_CT_PYTHON"], script, tmp_path / "graph.json", tmp_path / "viewer"],
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  found = json.loads(done.stdout.splitlines()[-1])
  assert found["schema"] and not found["errors"], found
  assert found["drawn"] == found["expected"] > len(data["metadata"]["prompt_tokens"]), found
  ARTIFACTS.mkdir(parents=True, exist_ok=True)
  shutil.copy(tmp_path / "viewer" / "viewer.png", ARTIFACTS / "circuit_tracer_viewer.png")


def test_the_feature_page_shades_a_firing_newline_where_it_shows(tmp_path):
  """features.html of a latent whose top context fires on a newline: the newline drawn as a mark (↵) that its
  shading colours, on one line with the context around it; no console message."""
  context = [("ROM", 0.0), ("EO", 0.2), (":", 0.4), ("\n", 1.0), ("But", 0.1)]
  latent = features.Latent(
    index=3,
    density=0.01,
    top_contexts=[context],
    top_activations=[1.0],
    centres=[3],
    promoted=[("a", 1.0)],
    suppressed=[("b", -1.0)],
    histogram_png=_png(),
  )
  page = features.write_pages(features.FeatureReport([latent], []), tmp_path / "features")
  dom, console = _open(page, "features")
  assert not console, console
  spans = re.findall(r'<span title="([\d.]+)" style="background:rgba\(192,57,43,([\d.]+)\);[^"]*">([^<]*)</span>', dom)
  assert ("1.000", "1.00", "\u21b5") in spans  # the newline: fully shaded, and a mark to shade
  assert not any("\n" in text for _, _, text in spans)  # the context on one line
  assert json.loads((tmp_path / "features" / "features.json").read_text())["latents"][0]["index"] == 3


def _png() -> bytes:
  plt = probes.pyplot()
  fig, ax = plt.subplots(figsize=(1, 1))
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png")
  plt.close(fig)
  return buffer.getvalue()


def test_a_probe_runs_page_shows_every_picture_and_names_one_that_is_gone(tmp_path):
  """index.html of a probe run's --out (pictures, numbers, another page, a text's subfolder): every picture loaded
  by the browser, no console message; a picture deleted after the page was written is named where it stood."""
  out = tmp_path / "probe"
  (out / "2").mkdir(parents=True)
  for path in (out / "attention.png", out / "2" / "logit_lens.png"):
    path.write_bytes(_png())
  (out / "inside.json").write_text(json.dumps({"tokens": ["R", "O"]}))
  (out / "features.html").write_text("<!DOCTYPE html><title>features</title>")
  page = probe_page.write(out, "python -m launch.probe --text=RO")
  dom, console = _open(page, "probe")
  assert not console, console
  images = [_attributes(tag) for tag in re.findall(r"<img [^>]*>", dom)]
  assert sorted(img["src"] for img in images) == ["2/logit_lens.png", "attention.png"]
  assert all(int(img["data-natural-width"]) > 0 for img in images), images
  assert 'href="inside.json"' in dom and 'href="features.html"' in dom and "python -m launch.probe --text=RO" in dom
  (out / "attention.png").unlink()
  dom, _ = _open(page, "probe_missing")
  assert '<p class="missing">missing: attention.png</p>' in dom and dom.count("<img ") == 1
