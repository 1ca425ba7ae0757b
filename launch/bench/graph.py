"""`launch.bench --what=graph`: a prompt's attribution graph with ours and with circuit-tracer, on the same weights.

A GPT of the --preset's shape (GPT-2 124M's by default) with random weights, and one random ReLU transcoder a
layer of --graph_expansion x d_model latents reading mlp_in and writing mlp_out, each latent's encoder bias set so
that about --graph_l0 latents fire at a position (on 64 random prompts: a sparse code, as trained transcoders
have). The weights are written once, the model as Hugging Face's GPT-2 files and the transcoders as circuit-tracer's
set, and both read them: ours (transformer.interp.graph.attribute) and circuit-tracer 0.5's `attribute` on its
TransformerLens replacement model (launch/bench/peers/graph_peer.py, in a venv of its own), each with batches of
--graph_batch backward passes, on a prompt of --seq_len random ids. Reported: the first call (ours compiles in it)
and the median of the next --repeats - 1, ours on the prompt less its first 3 tokens after them (a new length in
the same bucket), the features found, and how far the two adjacencies differ.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from experiments import shapes
from launch.bench import load as bench_load
from launch.bench import models as bench_models
from launch.bench import peer_env
from transformer import benchmark, dictionaries, metrics, opening
from transformer.errors import UserError
from transformer.interp import graph, replacement
from transformer.interp.interventions import run_with_cache
from transformer.models import gpt, hf_files, tracer_formats
from transformer.models.formats.gpt2 import export_hf_gpt2
from transformer.models.sae import SAE, SAEConfig

CT_REQUIREMENTS = ("torch==2.13.0", "circuit-tracer==0.5.0")


def _transcoders(model, params, vocab_size: int, seq_len: int, expansion: int, l0: int) -> replacement.Transcoders:
  """Random ReLU transcoders on the model's mlp_in -> mlp_out, each latent's bias at the quantile of its
  pre-activations on 64 random prompts that leaves it firing on about l0 / latents of the positions."""
  prompts_BxT = np.random.default_rng(2).integers(0, vocab_size, (64, seq_len)).astype(np.int32)
  _, cache = run_with_cache(model, params, prompts_BxT, names=("mlp_in",))
  inputs_LxNxD = np.asarray(cache["mlp_in"])[:, :, 1:].reshape(model.config.num_layers, -1, model.config.block.d_model)
  D = inputs_LxNxD.shape[-1]
  S = expansion * D
  rng = np.random.default_rng(0)
  saes, tc_params = [], []
  for x_NxD in inputs_LxNxD:
    size = float(np.linalg.norm(x_NxD, axis=1).mean())
    w_enc = (rng.normal(size=(D, S)) / size).astype(np.float32)
    pre_NxS = x_NxD @ w_enc
    config = SAEConfig(d_in=D, d_out=D, d_sae=S, activation="relu", normalize_decoder=False)
    saes.append(SAE(config))
    tc_params.append(
      {
        "W_enc": w_enc,
        "b_enc": -np.quantile(pre_NxS, 1 - l0 / S, axis=0).astype(np.float32),
        "W_dec": (rng.normal(size=(S, D)) * size / np.sqrt(S)).astype(np.float32),
        "b_dec": np.zeros(D, np.float32),
        "since_fired": np.zeros(S, np.float32),
        "input_scale": np.ones((), np.float32),
        "output_scale": np.ones((), np.float32),
      }
    )
  return replacement.PerLayerTranscoders(tuple(saes), tuple(jax.device_put(p) for p in tc_params))


def _ours(model, params, tokens_T, transcoders, o) -> tuple[dict, graph.Graph]:
  """The first call, the median of the next, and then a prompt 3 tokens shorter (its length bucket's programs,
  compiled for the first, serve it where its counts of features fall in their buckets too)."""
  times, result = [], None
  for _ in range(o.repeats):
    start = time.perf_counter()
    result = graph.attribute(model, params, tokens_T, transcoders, batch_size=o.graph_batch)
    times.append(time.perf_counter() - start)
  start = time.perf_counter()
  graph.attribute(model, params, tokens_T[3:], transcoders, batch_size=o.graph_batch)
  nearby = time.perf_counter() - start
  return {"first_seconds": times[0], "seconds": statistics.median(times[1:] or times), "nearby": nearby}, result


def graph_table(o) -> str:
  cfg = bench_models.model_config(o)
  model = gpt.GPT(cfg)
  params = bench_models.params_of(cfg)
  tokens_T = np.random.default_rng(1).integers(0, cfg.vocab_size, o.seq_len).astype(np.int32)
  transcoders = _transcoders(model, params, cfg.vocab_size, o.seq_len, o.graph_expansion, o.graph_l0)
  ours, mine = _ours(model, params, tokens_T, transcoders, o)
  with tempfile.TemporaryDirectory() as tmp:
    export_hf_gpt2(cfg, params, Path(tmp) / "model")
    layers = [(sae.config, p) for sae, p in zip(transcoders.saes, transcoders.params)]
    tracer_formats.export_circuit_tracer(layers, Path(tmp) / "transcoders", model_name="gpt2-shape")
    np.save(Path(tmp) / "tokens.npy", tokens_T)
    python = peer_env.peer_python(o.peer_python, CT_REQUIREMENTS, "circuit-tracer-peer-venv")
    spec = {
      "model": str(Path(tmp) / "model"),
      "transcoders": str(Path(tmp) / "transcoders"),
      "tokens": str(Path(tmp) / "tokens.npy"),
      "batch_size": o.graph_batch,
      "repeats": o.repeats,
      "out": str(Path(tmp) / "theirs.npz"),
    }
    theirs = peer_env.run_peers(python, spec, "graph_peer.py")
    with np.load(Path(tmp) / "theirs.npz") as their_graph:
      same_features = np.array_equal(their_graph["active_features"], mine.active_features)
      R = their_graph["adjacency"]
      difference = (
        np.abs(R - mine.adjacency_NxN).max() / np.abs(R).max() if R.shape == mine.adjacency_NxN.shape else np.inf
      )
  rows = [
    [name, f"{r['first_seconds']:.1f}", f"{r['seconds']:.1f}", nearby, f"{mine.num_features:,}"]
    for name, r, nearby in (("ours", ours, f"{ours['nearby']:.1f}"), ("circuit-tracer", theirs, "-"))
  ]
  shorter = f"then {o.seq_len - 3} tokens (s)"
  table = benchmark.table(["", "first call (s)", "median after (s)", shorter, "active features"], rows)
  header = (
    f"Attribution graph: {o.preset} shape ({cfg.num_layers} layers, d_model {cfg.block.d_model}), random weights; "
    f"{o.graph_expansion}x transcoders (ReLU, L0 ~{o.graph_l0}), a {o.seq_len}-token prompt, batches of {o.graph_batch}"
  )
  return (
    f"{header}\n{table}\nours / circuit-tracer: {theirs['seconds'] / ours['seconds']:.2f}x (median), "
    f"{theirs['first_seconds'] / ours['first_seconds']:.2f}x (first call); the same active features: {same_features}, "
    f"adjacencies apart by {difference:.1e} of the largest entry\n"
    f"peer: {theirs['versions']}, {theirs['threads']} threads; "
    f"ours: jax {jax.__version__} on {metrics.device_summary()}"
  )


# --what=graph_published: circuit-tracer's capped attribution at a published transcoder width, in fresh processes.


def write_published_set(cfg, out_dir: Path, latents: int, l0: int) -> Path:
  """Random per-layer transcoders of `latents` a layer in circuit-tracer's cache layout, stored in bfloat16, a
  layer at a time (the set is larger than the memory this writes it in), reading mlp.hook_in (the MLP's own input)
  and writing mlp.hook_out: encoder rows of norm ~1 on inputs of norm sqrt(d_model) (a normalised stream), each
  bias the normal quantile that leaves about `l0` latents of a position firing. Kept if already written."""
  stamp = out_dir / "bench_set.txt"
  what = f"{cfg.num_layers} x {latents} x {cfg.block.d_model}, l0 {l0}"
  if stamp.exists() and stamp.read_text() == what:
    return out_dir
  out_dir.mkdir(parents=True, exist_ok=True)
  D, Z = cfg.block.d_model, latents
  bias = -statistics.NormalDist().inv_cdf(1 - l0 / Z)
  rng = np.random.default_rng(0)
  bf16 = lambda x: x.astype(jnp.bfloat16)
  for layer in range(cfg.num_layers):
    tensors = {
      "W_enc": bf16(rng.standard_normal((Z, D), np.float32) / np.float32(np.sqrt(D))),
      "W_dec": bf16(rng.standard_normal((Z, D), np.float32) / np.float32(np.sqrt(l0 * D))),
      "b_enc": bf16(np.full(Z, bias, np.float32)),
      "b_dec": bf16(np.zeros(D, np.float32)),
    }
    hf_files.save_safetensors(tensors, out_dir / f"layer_{layer}.safetensors")
    del tensors
  tracer_formats.write_config(out_dir, "transcoder_set", "mlp_input", "mlp_output", model_name="random")
  stamp.write_text(what)
  return out_dir


def published_table(o) -> str:
  """A graph of a published shape (--hf_shape, e.g. qwen3-0.6b) through --graph_latents-wide transcoders on every
  layer, capped at --graph_cap features, each side in a fresh process that reads the files lazily: its peak
  resident memory (the whole process: model, transcoders, graph) and its seconds."""
  directory = Path(o.graph_dir or tempfile.mkdtemp(prefix="bench-graph-"))
  cfg = shapes.shape(o.hf_shape, dtype="bfloat16", param_dtype="bfloat16")
  model_dir = bench_load.write_checkpoint(o.hf_shape, directory / "model")
  set_dir = write_published_set(cfg, directory / "transcoders", o.graph_latents, o.graph_l0)
  tokens_T = np.random.default_rng(1).integers(0, cfg.vocab_size, o.seq_len).astype(np.int32)
  np.save(directory / "tokens.npy", tokens_T)
  spec = {
    "model": str(model_dir),
    "transcoders": str(set_dir),
    "tokens": str(directory / "tokens.npy"),
    "batch_size": o.graph_batch,
    "max_feature_nodes": o.graph_cap,
    "repeats": 2,
    "lazy": True,
    "out": str(directory / "theirs.npz"),
  }
  proc = subprocess.run(
    [sys.executable, "-m", "launch.bench.graph", json.dumps(spec)], capture_output=True, text=True, check=False
  )
  if proc.returncode:
    raise RuntimeError(f"ours failed:\n{proc.stderr[-3000:]}")
  ours = json.loads(proc.stdout.strip().splitlines()[-1])
  python = peer_env.peer_python(o.peer_python, CT_REQUIREMENTS, "circuit-tracer-peer-venv")
  try:
    theirs = peer_env.run_peers(python, spec, "graph_peer.py")
  except UserError as e:  # (killed for memory, say)
    nan = float("nan")
    theirs = {"load_seconds": nan, "first_seconds": nan, "seconds": nan, "peak_bytes": nan, "active": -1}
    theirs |= {"versions": f"failed: {str(e)[-300:]}", "threads": "?"}
  file_bytes = sum(f.stat().st_size for f in set_dir.glob("*.safetensors"))
  gib = lambda n: f"{n / 2**30:.2f} GiB"
  rows = [
    [name, f"{r['load_seconds']:.0f}", f"{r['first_seconds']:.0f}", f"{r['seconds']:.0f}", gib(r["peak_bytes"])]
    + [f"{r['active']:,}"]
    for name, r in (("ours", ours), ("circuit-tracer", theirs))
  ]
  columns = ["", "open (s)", "graph (s)", "again (s)", "peak host memory", "active features"]
  table = benchmark.table(columns, rows)
  planned = f"the planner's peak for ours (graph.plan, at the measured L0): {gib(ours['planned_bytes'])}"
  wall = lambda r: r["load_seconds"] + r["first_seconds"]
  header = (
    f"Capped attribution graph at a published size: {o.hf_shape} shape, random weights in bfloat16; "
    f"{cfg.num_layers} transcoders of {o.graph_latents:,} latents (bfloat16, {gib(file_bytes)} of files, L0 "
    f"~{o.graph_l0}), a {o.seq_len}-token prompt, max_feature_nodes={o.graph_cap}, batches of {o.graph_batch}; "
    "each side in a fresh process, its files read lazily (the graph again: the same prompt, ours compiled)"
  )
  return (
    f"{header}\n{table}\n{planned}\nours / circuit-tracer: {wall(theirs) / wall(ours):.2f}x (open + graph), "
    f"{theirs['seconds'] / ours['seconds']:.2f}x (the graph again)\n"
    f"peer: {theirs['versions']}, {theirs['threads']} threads; ours: jax {jax.__version__} on "
    f"{metrics.device_summary()}"
  )


def _measure(spec: dict) -> dict:
  """In this process (a fresh one): the graph of `spec` (published_table's) twice, the first compiling; the
  seconds of opening the model and transcoders and of each graph, and the peak resident bytes of the process."""
  start = time.perf_counter()
  opened = opening.open_path(spec["model"])
  transcoders = dictionaries.load_transcoders([spec["transcoders"]])[1]
  tokens_T = np.load(spec["tokens"])
  times = [time.perf_counter() - start]
  for _ in range(2):
    start = time.perf_counter()
    g = graph.attribute(
      *(opened.module, opened.params, tokens_T, transcoders),
      batch_size=spec["batch_size"],
      max_feature_nodes=spec["max_feature_nodes"],
    )
    times.append(time.perf_counter() - start)
  load, first, again = times
  peak = bench_load.peak_rss()
  L, T = opened.module.config.num_layers, len(tokens_T)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), opened.params)
  active = g.num_features if g.num_active < 0 else g.num_active
  l0 = max(1, round(active / (L * (T - 1))))
  cap, batch = spec["max_feature_nodes"], spec["batch_size"]
  planned = graph.plan(opened.module, abstract, transcoders, T, l0, batch_size=batch, max_feature_nodes=cap)
  return {"load_seconds": load, "first_seconds": first, "seconds": again, "peak_bytes": peak} | {
    "active": g.num_active,
    "planned_bytes": planned["peak"],
  }


if __name__ == "__main__":
  print(json.dumps(_measure(json.loads(sys.argv[1]))))
