"""`launch.bench --what=graph`: a prompt's attribution graph with ours and with circuit-tracer, on the same weights.

A GPT of the --preset's shape (GPT-2 124M's by default) with random weights, and one random ReLU transcoder a
layer of --graph_expansion x d_model latents reading mlp_in and writing mlp_out, each latent's encoder bias set so
that about --graph_l0 latents fire at a position (on 64 random prompts: a sparse code, as trained transcoders
have). The weights are written once, the model as Hugging Face's GPT-2 files and the transcoders as circuit-tracer's
set, and both read them: ours (transformer.interp.graph.attribute) and circuit-tracer 0.5's `attribute` on its
TransformerLens replacement model (launch/bench/peers/graph_peer.py, in a venv of its own), each with batches of
--graph_batch backward passes, on a prompt of --seq_len random ids. Reported: the first call (ours compiles in it)
and the median of the next --repeats - 1, the features found, and how far the two adjacencies differ.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from launch.bench import models as bench_models
from launch.bench import peer_env
from transformer import benchmark, metrics
from transformer.interp import graph, replacement
from transformer.interp.interventions import run_with_cache
from transformer.models import gpt, tracer_formats
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
  times, result = [], None
  for _ in range(o.repeats):
    start = time.perf_counter()
    result = graph.attribute(model, params, tokens_T, transcoders, batch_size=o.graph_batch)
    times.append(time.perf_counter() - start)
  return {"first_seconds": times[0], "seconds": statistics.median(times[1:] or times)}, result


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
    [name, f"{r['first_seconds']:.1f}", f"{r['seconds']:.1f}", f"{mine.num_features:,}"]
    for name, r in (("ours", ours), ("circuit-tracer", theirs))
  ]
  table = benchmark.table(["", "first call (s)", "median after (s)", "active features"], rows)
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
