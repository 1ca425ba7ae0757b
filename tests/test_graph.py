"""Attribution graphs (transformer.interp.graph, graph_view): equal to circuit-tracer 0.5's on its own
transcoder files (golden graphs of tests/make_graph_fixtures.py), to a dense Jacobian of the replacement
model and to finite differences of it; the replacement model gives the model's logits; pruning keeps what
carries the logits' influence; interventions on features move the logits as the graph says; circuit-tracer's
files in and out; every bad input one error."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import sae as sae_experiment
from experiments import shakespeare
from transformer import dictionaries, hostmem, inference, jit_args
from transformer.errors import CheckpointError, ConfigError, UserError
from transformer.interp import graph as G
from transformer.interp import graph_targets, graph_view, interventions, replacement
from transformer.models import formats, gpt, sae_formats, tracer_formats
from transformer.models.clt import CLTConfig, CrossLayerTranscoder
from transformer.models.formats.gpt2 import import_hf_gpt2
from transformer.models.gpt import GPT, GPTConfig
from transformer.models.sae import SAE, SAEConfig
from transformer.train import train_and_evaluate

from conftest import REPO, compiled_apply, compiled_init, replaced, run_module

FIXTURES = REPO / "tests" / "fixtures" / "graph"
TINY = GPTConfig().replace(vocab_size=40, max_len=16, num_layers=2, num_heads=2, d_model=16)
TOKENS = np.array([0, 5, 9, 3, 5, 9, 3, 7, 1, 5])


@pytest.fixture(scope="module")
def gpt2_tiny():
  cfg, params = import_hf_gpt2(REPO / "tests" / "fixtures" / "gpt2_tiny_a")
  return GPT(cfg), params


def _circuit_tracer_set(name: str) -> replacement.Transcoders:
  layers, point_in, point_out = tracer_formats.import_circuit_tracer(FIXTURES / name)
  return replacement.PerLayerTranscoders(
    tuple(SAE(c) for c, _ in layers), tuple(jax.device_put(p) for _, p in layers), point_in, point_out
  )


@pytest.fixture(scope="module")
def tiny():
  """A tiny GPT and random transcoders of every kind the graph reads: TopK on layer 0, a JumpReLU skip
  transcoder on layer 1, their scales not 1 (folded in wherever a vector enters the graph), their encoders
  scaled to the stream's size (features that fire with activations near 1)."""
  model = GPT(TINY)
  params = compiled_init(model, np.zeros((1, 8), np.int32))
  kinds = [SAEConfig(d_in=16, d_out=16, d_sae=48, activation="topk", k=4)]
  kinds.append(SAEConfig(d_in=16, d_out=16, d_sae=48, activation="jumprelu", skip=True))
  rng = np.random.default_rng(0)
  saes, tc_params = [], []
  for layer, config in enumerate(kinds):
    sae = SAE(config)
    p = {k: np.asarray(v) for k, v in compiled_init(sae, np.zeros((2, 16), np.float32), seed=layer + 1).items()}
    p.update(W_enc=rng.normal(size=(16, 48)).astype(np.float32) * 10, b_enc=np.full(48, -0.2, np.float32))
    p.update(input_scale=np.float32(1.3), output_scale=np.float32(0.7))
    if config.skip:
      p.update(W_skip=0.2 * rng.normal(size=(16, 16)).astype(np.float32), threshold=np.full(48, 0.3, np.float32))
    saes.append(sae)
    tc_params.append(jax.device_put(p))
  return model, params, replacement.PerLayerTranscoders(tuple(saes), tuple(tc_params))


@pytest.fixture(scope="module")
def tiny_clt(tiny):
  """The tiny GPT and a random cross-layer transcoder (TopK, k 4) over its two layers, scales not 1."""
  model, params, _ = tiny
  clt = CrossLayerTranscoder(CLTConfig(layers=2, d_in=16, d_out=16, d_sae=48, activation="topk", k=4))
  p = {k: np.asarray(v) for k, v in compiled_init(clt, np.zeros((2, 3, 16), np.float32)).items()}
  rng = np.random.default_rng(1)
  p.update(W_enc=rng.normal(size=(2, 16, 48)).astype(np.float32) * 10, b_enc=np.full((2, 48), -0.2, np.float32))
  p.update(input_scale=np.array([1.3, 0.8], np.float32), output_scale=np.array([0.7, 1.2], np.float32))
  p.update({f"W_dec_{l}": p[f"W_dec_{l}"] * 10 for l in range(2)})
  return model, params, replacement.CrossLayerTranscoders(clt, jax.device_put(p))


@pytest.fixture(scope="module")
def llama_tiny():
  """The Llama-family fixture of SmolLM's shape (grouped-query attention, rotary, RMSNorm, SwiGLU), tiny."""
  cfg, params = formats.import_lm(REPO / "tests" / "fixtures" / "families" / "smollm")
  return GPT(cfg), params


# circuit-tracer's files: its first releases' layout (relu, skip_jumprelu, llama_skip_jumprelu, clt_jumprelu, from
# hook_resid_mid), its 0.5 cache layout (written by its TranscoderSet.to_safetensors) and a published repository's
# (hf:// URIs, the files beside config.yaml), Gemma Scope's npz files; from mlp.hook_in, on GPT-2 and the Llama
GOLDEN_SETS = ["relu", "skip_jumprelu", "clt_jumprelu", "llama_skip_jumprelu"]
GOLDEN_SETS += ["cache_mlp_hook_in", "llama_cache_mlp_hook_in", "published", "gemma_scope"]


@pytest.mark.parametrize("name", GOLDEN_SETS)
def test_the_graph_equals_circuit_tracers_on_its_own_transcoder_files(name, request):
  """Per-layer transcoders (ReLU; JumpReLU with skip paths) and a cross-layer transcoder (JumpReLU) in circuit-tracer's
  files, in each of its layouts, reading each of its hooks, on the tiny GPT-2 and on a tiny Llama: the same active
  features and activations, the same logits, the adjacency to 1e-4 of its largest entry, the same pruned nodes and
  edges, the same replacement and completeness scores."""
  model, params = request.getfixturevalue("llama_tiny" if name.startswith("llama") else "gpt2_tiny")
  ref = np.load(FIXTURES / name / "graph.npz")
  _, transcoders = dictionaries.load_transcoders([str(FIXTURES / name)])
  assert isinstance(transcoders, replacement.CrossLayerTranscoders) == name.startswith("clt")
  graph = G.attribute(model, params, np.load(FIXTURES / name / "tokens.npy"), transcoders)
  np.testing.assert_array_equal(graph.active_features, ref["active_features"])
  np.testing.assert_allclose(graph.activations, ref["activation_values"], atol=1e-5)
  np.testing.assert_array_equal(graph.logit_tokens, ref["logit_tokens"])
  np.testing.assert_allclose(graph.logit_probabilities, ref["logit_probabilities"], atol=1e-6)
  A, R = graph.adjacency_NxN, ref["adjacency_matrix"]
  assert A.shape == R.shape and np.abs(A - R).max() <= 1e-4 * np.abs(R).max()
  kept = graph_view.prune(graph)
  np.testing.assert_array_equal(kept.node_mask, ref["node_mask"])
  np.testing.assert_array_equal(kept.edge_mask, ref["edge_mask"])
  np.testing.assert_allclose(kept.cumulative_scores, ref["cumulative_scores"], atol=1e-5)
  s = graph_view.scores(graph)
  np.testing.assert_allclose([s["replacement"], s["completeness"]], ref["scores"], atol=1e-5)
  viewer = json.loads(json.dumps(graph_view.to_json(graph, kept, str)))  # circuit-tracer's viewer's form
  assert len(viewer["nodes"]) == kept.node_mask.sum() and len(viewer["links"]) == kept.edge_mask.sum()
  assert {n["feature_type"] for n in viewer["nodes"]} >= {"cross layer transcoder", "embedding", "logit"}


@pytest.mark.parametrize("name", ["skip_jumprelu", "llama_skip_jumprelu"])
def test_a_capped_graph_is_circuit_tracers_capped_graph(name, request):
  """max_feature_nodes (64 and 200 of 400-odd active features; batch_size 16, a re-ranking every 64 rows):
  the features circuit-tracer 0.5 chooses by their partial influence on the logits, its adjacency over them (to
  1e-4 of its largest entry), its pruning of it; a cap above the active features gives the uncapped graph."""
  model, params = request.getfixturevalue("llama_tiny" if name.startswith("llama") else "gpt2_tiny")
  _, transcoders = dictionaries.load_transcoders([str(FIXTURES / name)])
  tokens = np.load(FIXTURES / name / "tokens.npy")
  for cap in (64, 200):
    ref = np.load(FIXTURES / name / f"graph_capped_{cap}.npz")
    graph = G.attribute(model, params, tokens, transcoders, batch_size=16, max_feature_nodes=cap)
    assert graph.num_features == cap and graph.num_active == len(ref["active_features"])
    np.testing.assert_array_equal(graph.active_features, ref["active_features"][ref["selected_features"]])
    A, R = graph.adjacency_NxN, ref["adjacency_matrix"]
    assert A.shape == R.shape and np.abs(A - R).max() <= 1e-4 * np.abs(R).max()
    kept = graph_view.prune(graph)
    np.testing.assert_array_equal(kept.node_mask, ref["node_mask"])
    np.testing.assert_array_equal(kept.edge_mask, ref["edge_mask"])
  whole = np.load(FIXTURES / name / "graph.npz")
  graph = G.attribute(model, params, tokens, transcoders, max_feature_nodes=10_000)
  assert (
    graph.num_active == -1
    and np.abs(graph.adjacency_NxN - whole["adjacency_matrix"]).max() <= 1e-4 * np.abs(whole["adjacency_matrix"]).max()
  )


@pytest.mark.parametrize("name", ["skip_jumprelu", "gemma_scope"])
def test_transcoders_read_a_piece_at_a_time_give_the_graph_of_those_read_whole(name, gpt2_tiny, tmp_path):
  """A set read from its files a piece at a time (StreamedTranscoders: each layer's encoder while it encodes, the
  firing latents' encoder and decoder rows) gives exactly the graph of the same set read whole: Gemma Scope's npz
  files, and circuit-tracer's safetensors stored in bfloat16, capped; what needs the set whole reads it whole."""
  model, params = gpt2_tiny
  tokens = np.load(FIXTURES / name / "tokens.npy")
  directory, cap = FIXTURES / name, None
  if name != "gemma_scope":  # the same set stored in bfloat16, its graph capped
    directory, cap = tmp_path / "bf16", 40
    shutil.copytree(FIXTURES / name, directory)
    for file in directory.glob("*.safetensors"):
      tensors = {k: v.astype(jnp.bfloat16) for k, v in tracer_formats.hf_files.read_tensors(file)}
      tracer_formats.hf_files.save_safetensors(tensors, file)
  streamed = dictionaries.load_transcoders([str(directory)])[1]
  whole = streamed.in_memory()
  assert isinstance(streamed, replacement.StreamedTranscoders) and not isinstance(whole, type(streamed))
  a, b = (G.attribute(model, params, tokens, tc, max_feature_nodes=cap) for tc in (streamed, whole))
  np.testing.assert_array_equal(a.active_features, b.active_features)
  np.testing.assert_array_equal(a.activations, b.activations)
  np.testing.assert_array_equal(a.adjacency_NxN, b.adjacency_NxN)
  assert cap is None or (a.num_features == cap and a.num_active > cap)
  with pytest.raises(UserError, match=r"read from their files a piece at a time: .in_memory\(\) reads them whole"):
    streamed.encode(streamed.params, 0, np.zeros((1, 64), np.float32))


def test_a_new_prompt_of_the_same_length_reuses_the_row_programs(gpt2_tiny):
  """The rows' programs are compiled for bucketed sizes (the features' count, each layer's entries and slots, the
  batch): another prompt of the same length whose counts fall in the same buckets compiles no new one, and its
  rows are the dense Jacobian's (the padding adds nothing)."""
  model, params = gpt2_tiny
  transcoders = dictionaries.load_transcoders([str(FIXTURES / "relu")])[1]
  tokens = np.load(FIXTURES / "relu" / "tokens.npy")
  first = G.attribute(model, params, tokens, transcoders)
  compiled = G._row_batch._cache_size()
  other = replaced(tokens, len(tokens) - 1, (tokens[-1] + 1) % model.config.vocab_size)
  second = G.attribute(model, params, other, transcoders)
  assert G._row_batch._cache_size() == compiled and second.num_features != first.num_features
  _assert_rows_are_the_dense_jacobians(model, params, other, transcoders, second)


def test_a_prompt_of_a_nearby_length_runs_at_the_same_length_and_the_filler_changes_nothing(gpt2_tiny):
  """A prompt runs at its length's bucket (`prompt_bucket`: 4 sizes an octave), filler after it: one a token
  longer in the same bucket, whose counts fall in the same buckets, compiles no new program, and both graphs'
  rows are the dense Jacobian's of the prompt unpadded; a prompt padded further gives the graph of its own length."""
  model, params = gpt2_tiny
  transcoders = dictionaries.load_transcoders([str(FIXTURES / "relu")])[1]
  tokens = np.load(FIXTURES / "relu" / "tokens.npy")
  assert [jit_args.prompt_bucket(T, 16) for T in (8, 9, 10, 11, 13, 15, 17)] == [8, 10, 10, 12, 14, 16, 17]
  prompt, prompt_12 = np.concatenate([tokens, [4]]), np.concatenate([tokens, [4, 4]])  # both run at 12
  first = G.attribute(model, params, prompt, transcoders)
  compiled = G._clean_run._cache_size(), G._row_batch._cache_size()
  longer = G.attribute(model, params, prompt_12, transcoders)
  assert (G._clean_run._cache_size(), G._row_batch._cache_size()) == compiled
  L, K = model.config.num_layers, len(first.logit_tokens)
  assert first.num_positions == 11 and first.adjacency_NxN.shape[0] == first.num_features + (L + 1) * 11 + K
  _assert_rows_are_the_dense_jacobians(model, params, prompt, transcoders, first)
  _assert_rows_are_the_dense_jacobians(model, params, prompt_12, transcoders, longer)
  own = G.attribute(model, params, tokens, transcoders)  # 10 tokens: a bucket's size, run unpadded
  padded = G.attribute(model, params, tokens, transcoders, padded_length=16)
  np.testing.assert_array_equal(padded.active_features, own.active_features)
  np.testing.assert_array_equal(padded.logit_tokens, own.logit_tokens)
  A = own.adjacency_NxN
  assert padded.adjacency_NxN.shape == A.shape and np.abs(padded.adjacency_NxN - A).max() <= 1e-6 * np.abs(A).max()
  with pytest.raises(UserError, match="padded_length=40: give one from the prompt's 10 tokens to the context's 32"):
    G.attribute(model, params, tokens, transcoders, padded_length=40)


def _assert_rows_are_the_dense_jacobians(model, params, tokens, transcoders, graph):
  n, K = graph.num_features, len(graph.logit_tokens)
  rows = np.concatenate([graph.adjacency_NxN[:n], graph.adjacency_NxN[-K:]])[:, :-K]
  dense = G.dense_rows(model, params, tokens, transcoders, graph)
  np.testing.assert_allclose(rows, dense, atol=1e-5 * np.abs(dense).max())


def test_the_planner_gives_a_graphs_memory_before_it_is_made(gpt2_tiny):
  """graph.plan compiles the graph's programs against abstract arrays (no params allocated): its parts sum to its
  peak, a larger batch of rows needs more, and more firing features more host memory (the rows computed)."""
  model, params = gpt2_tiny
  transcoders = dictionaries.load_transcoders([str(FIXTURES / "relu")])[1]
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  small, large = (G.plan(model, abstract, transcoders, 10, 20, batch_size=b) for b in (8, 64))
  assert large["rows a batch"] > small["rows a batch"] > 0 and large["host"] == small["host"] > 0
  assert small["params"] == sum(x.nbytes for x in jax.tree.leaves(params)) and small["encode a layer"] > 0
  assert small["peak"] > small["params"] + small["host"]
  assert G.plan(model, abstract, transcoders, 10, 40, batch_size=8)["host"] > small["host"]


@pytest.mark.slow
def test_a_graph_over_transcoders_larger_than_the_memory_it_may_use_stays_under_it(tmp_path):
  """A 4-layer model's transcoder set of 524,288 latents a layer, stored in bfloat16 (512 MiB; 1 GiB read whole in
  float32): its graph, in a process of its own, grows that process by less than half of what reading it whole
  would, measured (the peak resident bytes from the graph's start, /proc's VmHWM reset then, less those before)."""
  directory, Z, D = tmp_path / "set", 524_288, 64
  directory.mkdir()
  rng = np.random.default_rng(0)
  for layer in range(4):  # random directions; a bias that leaves a few latents a position firing
    tensors = {"W_enc": (rng.standard_normal((Z, D), np.float32) / 8).astype(jnp.bfloat16), "b_enc": np.full(Z, -4.0)}
    tensors |= {"W_dec": (0.01 * rng.standard_normal((Z, D), np.float32)).astype(jnp.bfloat16), "b_dec": np.zeros(D)}
    tracer_formats.hf_files.save_safetensors(tensors, directory / f"layer_{layer}.safetensors")
  hooks = {"feature_input_hook": "ln2.hook_normalized", "feature_output_hook": "hook_mlp_out"}
  (directory / "config.yaml").write_text(json.dumps({"model_kind": "transcoder_set", **hooks}))
  script = """
import json, sys
from pathlib import Path
import jax, numpy as np
from transformer import dictionaries
from transformer.interp import graph
from transformer.models.gpt import GPT, GPTConfig
model = GPT(GPTConfig().replace(vocab_size=64, max_len=16, num_layers=4, num_heads=2, d_model=64))
params = jax.jit(model.init)(jax.random.key(0), np.zeros((1, 8), np.int32))["params"]
status = lambda key: next(int(l.split()[1]) for l in Path("/proc/self/status").open() if l.startswith(key)) * 1024
before = status("VmRSS:")
Path("/proc/self/clear_refs").write_text("5")  # the peak resident bytes (VmHWM) counted from here
transcoders = dictionaries.load_transcoders([sys.argv[1]])[1]
g = graph.attribute(model, params, np.array([0, 5, 9, 3, 5, 9, 3, 7, 1, 5]), transcoders, max_feature_nodes=64)
print(json.dumps({"grown": status("VmHWM:") - before, "active": g.num_active}))
"""
  proc = subprocess.run(
    [sys.executable, "-c", script, str(directory)], capture_output=True, text=True, cwd=REPO, timeout=600
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  whole = 4 * 2 * 524_288 * 64 * 4  # every layer's encoder and decoder, float32
  assert result["active"] > 64 and result["grown"] < whole / 2, result


def test_targets_beyond_the_top_logits_are_tokens_and_directions(gpt2_tiny):
  """targets as circuit-tracer's AttributionTargets takes them: token ids (a top logit's row is the uncapped graph's
  row for it), and a custom direction: a logit difference's row is the difference of its two tokens' rows (the
  vocabulary's mean cancels), labelled, weight 1; a bad target one error."""
  model, params = gpt2_tiny
  _, transcoders = dictionaries.load_transcoders([str(FIXTURES / "relu")])
  tokens = np.load(FIXTURES / "relu" / "tokens.npy")
  top = G.attribute(model, params, tokens, transcoders)
  a, b = int(top.logit_tokens[0]), int(top.logit_tokens[3])
  pair = G.attribute(model, params, tokens, transcoders, targets=[a, b])
  np.testing.assert_allclose(pair.logit_probabilities, top.logit_probabilities[[0, 3]], rtol=1e-5)
  rows = lambda g: g.adjacency_NxN[g.logit_index(0) :, : g.logit_index(0)]  # the logits' rows over the sources
  np.testing.assert_allclose(rows(pair), rows(top)[[0, 3]], atol=1e-6)
  diff = G.attribute(
    model, params, tokens, transcoders, targets=[graph_targets.logit_difference(model.config, params, a, b)]
  )
  np.testing.assert_allclose(rows(diff)[0], rows(pair)[0] - rows(pair)[1], atol=1e-5)
  assert diff.logit_labels == (f"logit({a})-logit({b})",) and diff.logit_probabilities.tolist() == [1.0]
  data = graph_view.to_json(diff, graph_view.prune(diff), str)
  assert [n["clerp"] for n in data["nodes"] if n["feature_type"] == "logit"] == [
    f'Output "logit({a})-logit({b})" (p=1.000)'
  ]
  with pytest.raises(UserError, match="target tokens \\[97\\]: give ids of the vocabulary, 0 to 96"):
    G.attribute(model, params, tokens, transcoders, targets=[97])


@pytest.mark.parametrize("name", ["cache_mlp_hook_in", "llama_cache_mlp_hook_in", "gemma2_hooks"])
def test_each_circuit_tracer_hook_is_the_tensor_its_replacement_model_reads(name, request):
  """Each hook circuit-tracer's sets name, read by that name from our run, is the tensor circuit-tracer's own
  replacement model has there on the same prompt (hooks.npz; Gemma 2's through its nnsight backend's mapping, the
  norms after each branch): mlp.hook_in (the MLP's input after ln2's weight) apart from ln2.hook_normalized (before
  it), mlp.hook_out and hook_mlp_out one tensor where no norm follows the MLP."""
  if name == "gemma2_hooks":
    config, params = formats.import_lm(REPO / "tests" / "fixtures" / "families" / "gemma2")
    model = GPT(config)
  else:
    model, params = request.getfixturevalue("llama_tiny" if name.startswith("llama") else "gpt2_tiny")
  theirs = np.load(FIXTURES / name / "hooks.npz")
  tokens = np.load(FIXTURES / name / "tokens.npy")[None]
  _, cache = interventions.run_with_cache(model, params, tokens, names=tuple(theirs.files))
  for hook in theirs.files:
    np.testing.assert_allclose(cache[hook][0], theirs[hook], atol=2e-5, err_msg=hook)
  if name != "gemma2_hooks":
    assert np.abs(theirs["blocks.1.mlp.hook_in"] - theirs["blocks.1.ln2.hook_normalized"]).max() > 1e-2
    np.testing.assert_array_equal(theirs["blocks.1.mlp.hook_out"], theirs["blocks.1.hook_mlp_out"])


@pytest.mark.parametrize("which", ["tiny", "tiny_clt"])
def test_the_rows_equal_a_dense_jacobian_of_the_replacement_model(which, request):
  model, params, transcoders = request.getfixturevalue(which)
  # CLT's: batches that do not divide the rows (the per-layer set's: the other tests' programs, compiled once)
  graph = G.attribute(model, params, TOKENS, transcoders, **({"batch_size": 7} if which == "tiny_clt" else {}))
  n = graph.num_features
  assert n > 30 and np.abs(graph.adjacency_NxN[:n]).max() > 1e-2
  _assert_rows_are_the_dense_jacobians(model, params, TOKENS, transcoders, graph)
  assert not graph.adjacency_NxN[n : graph.logit_index(0)].any()  # errors and tokens have no inputs
  feature_layer = graph.active_features[:, 0]
  assert not graph.adjacency_NxN[:n, :n][feature_layer[:, None] <= feature_layer[None, :]].any()  # forward only


@pytest.mark.parametrize("which", ["tiny", "tiny_clt"])
def test_an_edge_is_the_change_of_its_targets_input_when_its_source_is_removed(which, request):
  """A forward pass of the replacement model without one source (its output vectors subtracted where it
  writes: one layer, or a cross-layer transcoder's every later one) moves each target's input by minus its edge:
  a finite difference, on a feature and on a token."""
  model, params, transcoders = request.getfixturevalue(which)
  graph = G.attribute(model, params, TOKENS, transcoders)
  tc = transcoders.unboxed()
  setup, _, _, entries = G._setup(model, tc, params, jax.device_put(TOKENS), True, len(TOKENS))
  sources = G._sources(setup, entries, graph.active_features)
  targets = G._targets(tc, graph.active_features, graph.logit_vectors_KxD, model.config.num_layers, len(TOKENS))
  L, T, D = setup.errors_LxTxD.shape
  zeros = {"mlp_out": np.zeros((L, T, D), np.float32), "embed": np.zeros((T, D), np.float32)}
  run = jax.jit(lambda delta: G.replacement_inputs(model, tc, params, jax.device_put(TOKENS), setup, delta))
  clean = _read(run(zeros), targets)
  rows = np.concatenate([graph.adjacency_NxN[: graph.num_features], graph.adjacency_NxN[-len(graph.logit_tokens) :]])
  first_layer = np.flatnonzero(graph.active_features[:, 0] == 0)
  s = int(first_layer[np.argmax(np.abs(rows[:, first_layer]).max(0))])  # the layer-0 feature of the largest edge
  removed = np.zeros((L, T, D), np.float32)
  for w, written in enumerate(sources["written"]):  # every layer and position it writes
    cells_TxMxD = np.asarray(written["cells_TxMxD"])
    for e in np.flatnonzero(np.asarray(written["feature_e"]) == s):
      p, m = int(written["position_e"][e]), int(written["slot_e"][e])
      removed[w, p] -= cells_TxMxD[p, m]
  assert (np.abs(removed).sum(-1) > 0).sum() == (L if which == "tiny_clt" else 1)
  without = _read(run({**zeros, "mlp_out": removed}), targets)
  np.testing.assert_allclose(clean - without, rows[:, s], atol=1e-4)
  assert np.abs(rows[:, s]).max() > 1e-2
  p = 4
  without = _read(
    run({**zeros, "embed": jax.device_put(replaced(zeros["embed"], p, -sources["embed_TxD"][p]))}), targets
  )
  np.testing.assert_allclose(clean - without, rows[:, graph.token_index(p)], atol=1e-4)


def _read(result, targets) -> np.ndarray:
  inputs_LxTxD, final_TxD = map(np.asarray, result)
  read = np.concatenate([inputs_LxTxD, final_TxD[None]])[targets["layer_N"], targets["position_N"]]
  return (read * targets["vectors_NxD"]).sum(-1)


def test_the_replacement_model_gives_the_models_logits_and_a_perfect_transcoder_leaves_no_error():
  """A ReLU MLP is itself a transcoder from its norm's output (ln_2.normalized, the norm's weight folded into the
  encoder): with it, every error is zero and the replacement model still gives the model's logits."""
  model = GPT(TINY.replace(activation="relu"))
  params = compiled_init(model, np.zeros((1, 8), np.int32), seed=3)
  saes, tc_params = [], []
  for layer in range(2):
    block = params["h"][f"layer_{layer}"]
    gamma, beta = block["ln_2"]["scale"], block["ln_2"]["bias"]
    fc, proj = block["mlp"]["fc"], block["mlp"]["proj"]
    sae = SAE(SAEConfig(d_in=16, d_out=16, d_sae=64, activation="relu"))
    p = dict(compiled_init(sae, np.zeros((2, 16), np.float32)))
    gamma, beta, fc_kernel = np.asarray(gamma), np.asarray(beta), np.asarray(fc["kernel"])
    p.update(W_enc=gamma[:, None] * fc_kernel, b_enc=beta @ fc_kernel + np.asarray(fc["bias"]))
    p.update(W_dec=proj["kernel"], b_dec=proj["bias"])
    saes.append(sae)
    tc_params.append(p)
  perfect = replacement.PerLayerTranscoders(tuple(saes), tuple(tc_params), point_in="ln_2.normalized")
  setup = G._setup(model, perfect, params, jax.device_put(TOKENS), False, len(TOKENS))[0]
  assert np.abs(np.asarray(setup.errors_LxTxD)).max() < 1e-5
  zeros = {"mlp_out": np.zeros((2, 10, 16), np.float32), "embed": np.zeros((10, 16), np.float32)}
  run = jax.jit(lambda d: G.replacement_inputs(model, perfect, params, jax.device_put(TOKENS), setup, d))
  _, final_TxD = run(zeros)
  logits = np.asarray(compiled_apply(model, {"params": params}, TOKENS[None])[0])
  np.testing.assert_allclose(
    np.asarray(final_TxD) @ np.asarray(gpt.unembedding(model.config, params)).T, logits, atol=1e-5
  )
  graph = G.attribute(model, params, TOKENS, perfect)
  losses = replacement.replacement_losses(model, params, TOKENS[None], perfect)  # every MLP replaced, live
  assert losses["replaced"] == pytest.approx(losses["clean"], abs=1e-5) and losses["zero_mlp"] != losses["clean"]
  from_errors = graph.adjacency_NxN[:, graph.num_features : graph.token_index(0)]
  assert np.abs(from_errors).max() < 1e-6 * np.abs(graph.adjacency_NxN).max()  # no error has an effect


def test_a_features_top_contexts_are_where_it_is_most_active(tiny):
  model, params, transcoders = tiny
  held_out = np.stack([TOKENS[::-1], TOKENS])  # the prompt among them: where its features fire
  graph = G.attribute(model, params, TOKENS, transcoders)
  layer, _, latent = graph.active_features[0]
  found = graph_view.top_contexts(model, params, CharIds(), transcoders, held_out, [(layer, latent)], count=2)
  contexts = found[(layer, latent)]
  assert 1 <= len(contexts) <= 2 and all(c.count("[") == 1 for c in contexts), contexts


class CharIds:
  """A tokenizer of ids as letters (a = 0), enough for contexts."""

  def decode(self, ids):
    return "".join(chr(97 + i) for i in ids)


def test_pruning_keeps_the_nodes_that_carry_the_stated_share_of_the_logits_influence():
  """A hand-built graph: one token, two features, an error and one logit. Feature a carries 0.9 of the logit's
  input (feature b 0.05, the error 0.05); the token feeds both features. At 0.8, a and the token stay, b and
  the error go, and so do their edges; at 0.99, all stay."""
  A = np.zeros((5, 5), np.float32)  # nodes: a, b, error (layer 0, position 0), token, logit
  A[4, 0], A[4, 1], A[4, 2] = 0.9, -0.05, 0.05
  A[0, 3], A[1, 3] = 1.0, 1.0
  graph = G.Graph(np.array([7]), np.array([[0, 0, 1], [0, 0, 2]]), np.ones(2), np.array([3]), np.ones(1), A, 1)
  kept = graph_view.prune(graph, node_threshold=0.8, edge_threshold=0.98)
  np.testing.assert_array_equal(kept.node_mask, [True, False, False, True, True])
  assert kept.edge_mask[4, 0] and kept.edge_mask[0, 3] and not kept.edge_mask[:, 1].any()
  assert graph_view.prune(graph, node_threshold=0.99, edge_threshold=0.999).node_mask.all()
  s = graph_view.scores(graph)
  assert s["replacement"] == pytest.approx(0.95 / (0.95 + 0.05), abs=1e-6)
  with pytest.raises(ValueError, match="node_threshold is a share of the influence, between 0 and 1; got 1.5"):
    graph_view.prune(graph, node_threshold=1.5)


@pytest.mark.parametrize("which", ["tiny", "tiny_clt"])
def test_a_feature_set_through_the_model_moves_the_logits_as_its_edges_say(which, request):
  """Zeroing the feature with the largest direct effect on the top logit, with the norms and MLPs fixed (direct
  effects), moves every demeaned logit by minus its edge; through the model (later features responding) the
  top logit moves too, by another amount; no intervention is the model itself."""
  model, params, transcoders = request.getfixturevalue(which)
  graph = G.attribute(model, params, TOKENS, transcoders)
  logits = np.asarray(compiled_apply(model, {"params": params}, TOKENS[None])[0, -1])
  base, z = G.intervene(model, params, TOKENS, transcoders, [])
  np.testing.assert_allclose(base, logits, atol=1e-5)
  top = graph.logit_index(0)
  s = int(np.argmax(np.abs(graph.adjacency_NxN[top, : graph.num_features])))
  layer, pos, latent = graph.active_features[s]
  moved, z_moved = G.intervene(model, params, TOKENS, transcoders, [(layer, pos, latent, 0.0)], direct_effects=True)
  demeaned = (moved - base) - (moved - base).mean()
  expected = -graph.adjacency_NxN[graph.logit_index(0) :, s]
  np.testing.assert_allclose(demeaned[graph.logit_tokens], expected, atol=1e-5)
  assert z_moved[layer, pos, latent] == 0 and z[layer, pos, latent] > 0
  through, _ = G.intervene(model, params, TOKENS, transcoders, [(layer, pos, latent, 0.0)])
  assert np.abs(through - base).max() > 1e-4
  # A prompt of a nearby length runs at the same length bucket (filler after it): no new program, its own logits.
  compiled = G._intervened._cache_size()
  shorter, z_shorter = G.intervene(model, params, TOKENS[:9], transcoders, [])
  assert G._intervened._cache_size() == compiled and z_shorter.shape == (z.shape[0], 9, z.shape[2])
  np.testing.assert_allclose(shorter, compiled_apply(model, {"params": params}, TOKENS[None, :9])[0, -1], atol=1e-5)
  np.testing.assert_allclose(z_shorter, z[:, :9], atol=1e-5)


def test_circuit_tracers_files_round_trip_and_carry_our_scales(tiny, tmp_path):
  """Our transcoders written as circuit-tracer's set and read back give the same outputs and latents (the
  scales folded into the weights); the graph through the files equals the graph through ours."""
  model, params, transcoders = tiny
  layers = [(sae.config, p) for sae, p in zip(transcoders.saes, transcoders.params)]
  with pytest.raises(ConfigError, match="circuit-tracer's loaders read ReLU and JumpReLU transcoders.*way to say TopK"):
    tracer_formats.export_circuit_tracer(layers, tmp_path / "no")
  relu = replacement.PerLayerTranscoders(
    (SAE(transcoders.saes[0].config.replace(activation="relu")), transcoders.saes[1]), transcoders.params
  )
  layers = [(sae.config, p) for sae, p in zip(relu.saes, relu.params)]
  tracer_formats.export_circuit_tracer(layers, tmp_path / "set", model_name="tiny")
  config = (tmp_path / "set" / "config.yaml").read_text()
  assert "feature_input_hook: hook_resid_mid" in config and "feature_output_hook: hook_mlp_out" in config
  back, point_in, point_out = tracer_formats.import_circuit_tracer(tmp_path / "set")
  assert (point_in, point_out) == ("mlp_in", "mlp_out")
  x = np.random.default_rng(5).normal(size=(6, 16)).astype(np.float32)
  for (config, p), sae, ours in zip(back, relu.saes, relu.params):
    y, z = compiled_apply(SAE(config), {"params": p}, x)
    y_ours, z_ours = compiled_apply(sae, {"params": ours}, x)
    np.testing.assert_allclose(y, y_ours, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z, z_ours, rtol=1e-5, atol=1e-5)
  g_ours = G.attribute(model, params, TOKENS, relu)
  g_back = G.attribute(model, params, TOKENS, dictionaries.load_transcoders([str(tmp_path / "set")])[1])
  np.testing.assert_allclose(g_back.adjacency_NxN, g_ours.adjacency_NxN, atol=1e-5)


def test_bad_input_is_one_error(tiny, gpt2_tiny, tmp_path, monkeypatch):
  model, params, transcoders = tiny
  with pytest.raises(UserError, match="it was trained for another model"):
    G.attribute(*gpt2_tiny, TOKENS, transcoders)
  with pytest.raises(UserError, match="a transcoder at each of the model's 2 layers; got 1"):
    G.attribute(model, params, TOKENS, replacement.PerLayerTranscoders(transcoders.saes[:1], transcoders.params[:1]))
  with pytest.raises(UserError, match="a prompt of 17 tokens is longer than the model's context \\(16\\)"):
    G.attribute(model, params, np.zeros(17, int), transcoders)
  sae = SAE(SAEConfig(d_in=16, d_sae=32))
  with pytest.raises(UserError, match="the dictionary of layer 0 is an SAE, not a transcoder"):
    G.attribute(model, params, TOKENS, replacement.PerLayerTranscoders((sae, sae), transcoders.params))
  with pytest.raises(
    UserError,
    match="transcoders from mlp_in, resid_mid, ln_2.normalized or mlp_input to mlp_out .or mlp_output., not mlp_in -> attn_out",
  ):
    G.attribute(
      model, params, TOKENS, replacement.PerLayerTranscoders(transcoders.saes, transcoders.params, point_out="attn_out")
    )
  with pytest.raises(CheckpointError, match="no config.yaml in"):
    tracer_formats.import_circuit_tracer(tmp_path)
  published = tmp_path / "published"
  shutil.copytree(FIXTURES / "published", published)
  config = (published / "config.yaml").read_text()
  (published / "config.yaml").write_text(config.replace("tiny-org/tiny-transcoders/layer_1", "other/repo/sub/layer_1"))
  with pytest.raises(
    CheckpointError,
    match=r"layer 1's file hf://other/repo/sub/layer_1.safetensors is not beside it .* in the repository other/repo; "
    r"fetch it there with `huggingface-cli download other/repo sub/layer_1.safetensors --local-dir",
  ):
    tracer_formats.import_circuit_tracer(published)
  monkeypatch.setattr(hostmem, "available_bytes", lambda: 60_000)  # a set larger than the memory free: said first
  whole = r"reading its transcoders? whole in float32 needs 0.00 GiB and this machine has 0.00 GiB free"
  with pytest.raises(CheckpointError, match=whole):
    tracer_formats.import_circuit_tracer(FIXTURES / "published")
  with pytest.raises(CheckpointError, match=whole):
    dictionaries.load_transcoders([str(FIXTURES / "clt_jumprelu")])
  dictionaries.load_transcoders([str(FIXTURES / "published")])  # streamed: one layer's encoder at a time fits
  monkeypatch.setattr(hostmem, "available_bytes", lambda: 20_000)
  with pytest.raises(CheckpointError, match="reading one layer's encoder to encode it needs 0.00 GiB"):
    dictionaries.load_transcoders([str(FIXTURES / "published")])
  monkeypatch.undo()
  cache = tmp_path / "cache"
  shutil.copytree(FIXTURES / "cache_mlp_hook_in", cache)
  (cache / "layer_0.safetensors").unlink()
  with pytest.raises(CheckpointError, match=r"a transcoder a layer from 0 is needed; found layers \[1\]"):
    tracer_formats.import_circuit_tracer(cache)
  (tmp_path / "config.yaml").write_text("feature_input_hook: mlp.hook_pre\nfeature_output_hook: hook_mlp_out\n")
  with pytest.raises(CheckpointError, match="transcoders from 'mlp.hook_pre' to 'hook_mlp_out'; we read those from"):
    tracer_formats.import_circuit_tracer(tmp_path)


def test_a_graphs_metadata_names_the_transcoders_as_circuit_tracers_viewer_reads_them():
  """scan and transcoder_list: a circuit-tracer set's config.yaml scan and its layers' files (its URIs where it
  lists them); several workdirs, a custom-<digest> as circuit-tracer names a list."""
  scan, files = dictionaries.names([str(FIXTURES / "published")])
  assert scan == "published" and files == tuple(f"hf://tiny-org/tiny-transcoders/layer_{l}.safetensors" for l in (0, 1))
  scan, files = dictionaries.names([str(FIXTURES / "cache_mlp_hook_in")])
  assert scan == "tiny-org/tiny-transcoders" and [Path(f).name for f in files] == [
    "layer_0.safetensors",
    "layer_1.safetensors",
  ]
  scan, files = dictionaries.names(["runs/tc0", "runs/tc1"])
  assert scan.startswith("custom-") and files == ("runs/tc0", "runs/tc1")
  assert scan == dictionaries.names(["runs/tc0", "runs/tc1"])[0] != dictionaries.names(["runs/tc1", "runs/tc0"])[0]


def test_launch_probe_refuses_a_graph_without_transcoders_before_loading_anything(tmp_path):
  refused = run_module("launch.probe", "--graph", "--text=ROMEO:", f"--out={tmp_path / 'g'}")
  assert refused.returncode != 0 and "--graph draws a graph through --transcoders: give both" in refused.stderr
  assert not (tmp_path / "g").exists()


@pytest.mark.slow
def test_launch_probe_draws_the_graph_of_a_text_through_transcoders_trained_here(tmp_path):
  """A tiny GPT trained on Shakespeare, a transcoder trained on each of its layers (mlp_in -> mlp_out) and a
  cross-layer transcoder over both (its evaluation: the replacement model's loss, every MLP replaced at once), and
  `launch.probe --graph` through each: graph.json in circuit-tracer's viewer's form, graph.html, the numbers."""
  c = shakespeare.get_config("tiny")
  c.data.root = str(tmp_path / "data")
  c.num_train_steps = c.eval_every_steps = c.checkpoint_every_steps = 10
  c.sample.max_new_tokens = 0
  train_and_evaluate(c, tmp_path / "lm")
  layers = inference.restore(tmp_path / "lm").model.config.num_layers
  for name, changes in [(f"tc{layer}", dict(layer=layer)) for layer in range(layers)] + [
    ("clt", dict(cross_layer=True))
  ]:
    t = sae_experiment.get_config("tiny")
    t.synthetic_features, t.run, t.point, t.target_point = 0, str(tmp_path / "lm"), "mlp_in", "mlp_out"
    t.seq_len, t.batch_size, t.buffer_sequences, t.lm_batch_size, t.eval_sequences = 32, 128, 16, 8, 4
    t.model.activation, t.model.d_sae = "relu", 128
    t.update(changes)
    result = train_and_evaluate(t, tmp_path / name)
  assert result["ce_loss_zero"] > result["ce_loss_clean"] and np.isfinite(result["ce_loss_score"]), result
  assert inference.restore(tmp_path / "clt").model.config.layers == layers
  for name, tcs in [
    ("per_layer", ",".join(str(tmp_path / f"tc{layer}") for layer in range(layers))),
    ("clt", tmp_path / "clt"),
  ]:
    shown = run_module(
      "launch.probe", "--graph", f"--transcoders={tcs}", "--text=ROMEO:\nO Juli", f"--out={tmp_path / name}"
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "active features; kept" in shown.stdout and "replacement score" in shown.stdout
    assert "with every MLP replaced" in shown.stdout
    data = json.loads((tmp_path / name / "graph.json").read_text())
    assert {"metadata", "qParams", "nodes", "links"} <= set(data) and data["links"]
    meta = data["metadata"]  # what circuit-tracer's viewer names the transcoders by
    assert meta["transcoder_list"] == [str(p) for p in str(tcs).split(",")]
    assert meta["scan"] == ("clt" if name == "clt" else dictionaries.names(str(tcs).split(","))[0])
    assert any(n["feature_type"] == "logit" for n in data["nodes"])
    page = (tmp_path / name / "graph.html").read_text()
    kept_features = any(n["feature_type"] == "cross layer transcoder" for n in data["nodes"])
    assert "<svg" in page and ('"contexts": {"' in page) == kept_features  # their top contexts in held-out text
  refused = run_module(
    "launch.probe", "--graph", f"--transcoders={tmp_path / 'tc0'}", "--text=RO", f"--out={tmp_path / 'n'}"
  )
  assert refused.returncode != 0 and f"one transcoder at each of the {layers} layers" in refused.stderr
  # the workdirs exported: the per-layer ones and the cross-layer one as circuit-tracer's sets, one as SAELens's
  per_layer = ",".join(str(tmp_path / f"tc{layer}") for layer in range(layers))
  for name, flags in [
    ("ct", [f"--transcoders={per_layer}"]),
    ("ct_clt", [f"--transcoders={tmp_path / 'clt'}"]),
    ("saelens", [f"--sae={tmp_path / 'tc0'}"]),
  ]:
    done = run_module("launch.probe", *flags, f"--export={tmp_path / name}")
    assert done.returncode == 0, done.stderr[-3000:]
  lm, tokens = inference.load(workdir=tmp_path / "lm"), np.arange(1, 9)
  for name, paths in [("ct", per_layer.split(",")), ("ct_clt", [str(tmp_path / "clt")])]:
    ours = G.attribute(lm.model, lm.params, tokens, dictionaries.load_transcoders(paths)[1])
    back = G.attribute(lm.model, lm.params, tokens, dictionaries.load_transcoders([str(tmp_path / name)])[1])
    np.testing.assert_allclose(back.adjacency_NxN, ours.adjacency_NxN, atol=1e-4 * np.abs(ours.adjacency_NxN).max())
  config, _ = sae_formats.import_saelens(tmp_path / "saelens")
  cfg = json.loads((tmp_path / "saelens" / "cfg.json").read_text())
  assert config.transcoder and cfg["metadata"]["hook_name"] == "blocks.0.hook_mlp_in"
  refused = run_module("launch.probe", f"--sae={tmp_path / 'clt'}", f"--export={tmp_path / 'no'}")
  assert refused.returncode == 1 and "cannot hold: export it to circuit-tracer" in refused.stderr
  assert not (tmp_path / "no").exists()
  if os.environ.get("TRANSFORMER_CT_PYTHON"):  # circuit-tracer's own loader reads the exports
    for name in ("ct", "ct_clt"):
      load = (
        "import sys, torch; from circuit_tracer.utils.caching import load_transcoders_from_cache as f; "
        "t, c = f(sys.argv[1], cache_dir=sys.argv[2], device=torch.device('cpu')); print(type(t).__name__, c['scan'])"
      )
      read = subprocess.run(
        [os.environ["TRANSFORMER_CT_PYTHON"], "-c", load, name, str(tmp_path)], capture_output=True, text=True
      )
      assert read.returncode == 0 and read.stdout.split()[0] in ("TranscoderSet", "CrossLayerTranscoder"), read.stderr


@pytest.mark.slow
@pytest.mark.skipif(
  not os.environ.get("TRANSFORMER_CT_PYTHON"), reason="set TRANSFORMER_CT_PYTHON to a python with circuit-tracer"
)
@pytest.mark.parametrize("name", ["skip_jumprelu", "clt_jumprelu"])
def test_circuit_tracer_reads_our_exported_transcoders_and_draws_our_graph(gpt2_tiny, tmp_path, name):
  """Transcoders of ours (scales not 1; a skip path, or cross-layer) exported to circuit-tracer's format:
  circuit-tracer 0.5's graph of them on the tiny GPT-2 equals ours."""
  model, params = gpt2_tiny
  tc = dictionaries.load_transcoders([str(FIXTURES / name)])[1].in_memory()
  if isinstance(tc, replacement.PerLayerTranscoders):
    layers = []
    for sae, p in zip(tc.saes, tc.params):
      p = dict(p, input_scale=jnp.float32(2.0), output_scale=jnp.float32(0.5))
      p["W_enc"], p["W_dec"], p["b_dec"] = p["W_enc"] / 2.0, p["W_dec"] * 0.5, p["b_dec"] * 0.5
      p["W_skip"] = p["W_skip"] / 4.0
      layers.append((sae.config, p))
    tracer_formats.export_circuit_tracer(layers, tmp_path, model_name="gpt2-tiny")
    ours = replacement.PerLayerTranscoders(tuple(SAE(c) for c, _ in layers), tuple(p for _, p in layers))
  else:
    p = dict(tc.params, input_scale=jnp.array([2.0, 0.5]), output_scale=jnp.array([0.5, 4.0]))
    p["W_enc"] = tc.params["W_enc"] / p["input_scale"][:, None, None]
    p["b_dec"] = tc.params["b_dec"] * p["output_scale"][:, None]
    for layer in range(2):
      p[f"W_dec_{layer}"] = tc.params[f"W_dec_{layer}"] * p["output_scale"][layer:, None]
    tracer_formats.export_circuit_tracer_clt(tc.clt.config, p, tmp_path)
    ours = replacement.CrossLayerTranscoders(tc.clt, p)
  tokens = np.load(FIXTURES / name / "tokens.npy")
  np.save(tmp_path / "tokens.npy", tokens)
  script = REPO / "tests" / "make_graph_fixtures.py"
  done = subprocess.run(
    [os.environ["TRANSFORMER_CT_PYTHON"], script, "--check", tmp_path], capture_output=True, text=True
  )
  assert done.returncode == 0, done.stderr[-3000:]
  theirs = np.load(tmp_path / "circuit_tracer.npz")
  graph = G.attribute(model, params, tokens, ours)
  np.testing.assert_array_equal(graph.active_features, theirs["active_features"])
  R = theirs["adjacency_matrix"]
  assert np.abs(graph.adjacency_NxN - R).max() <= 1e-4 * np.abs(R).max()
