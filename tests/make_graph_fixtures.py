"""Golden fixtures from circuit-tracer for tests/test_graph.py: attribution graphs of a prompt through the tiny
GPT-2 of tests/fixtures/gpt2_tiny_a and random per-layer transcoders in circuit-tracer's own format (a
config.yaml and one safetensors a layer) and a random cross-layer transcoder in its files (W_enc_<l>, W_dec_<l>),
computed by circuit-tracer 0.5 on TransformerLens, with its pruning.

Not run by the test suite (torch is not a dependency of this project). Regenerate with a Python 3.11 venv:

  python3.11 -m venv /tmp/ctenv
  /tmp/ctenv/bin/pip install torch==2.13.0 circuit-tracer==0.5.0
  /tmp/ctenv/bin/python tests/make_graph_fixtures.py          # writes tests/fixtures/graph/<variant>/
  /tmp/ctenv/bin/python tests/make_graph_fixtures.py --layouts        # circuit-tracer 0.5's layouts and hooks
  /tmp/ctenv/bin/python tests/make_graph_fixtures.py --gemma2-hooks   # its hooks on Gemma 2 (nnsight 0.6)
  /tmp/ctenv/bin/python tests/make_graph_fixtures.py --capped         # its capped graphs (max_feature_nodes)
  /tmp/ctenv/bin/python tests/make_graph_fixtures.py --check DIR
      # circuit-tracer's graph of transcoders we exported (DIR: config.yaml, layer_<l>.safetensors, tokens.npy)
      # on the same model, written to DIR/circuit_tracer.npz

Each variant's directory: the transcoders (config.yaml, layer_<l>.safetensors), tokens.npy, and graph.npz
(active_features, activation_values, selected_features, adjacency_matrix, logit_tokens, logit_probabilities,
node_mask, edge_mask, cumulative_scores, scores: circuit-tracer's `Graph`, `prune_graph` and
`compute_graph_scores`).
"""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch
import yaml
from circuit_tracer import attribute
from circuit_tracer.graph import compute_graph_scores, prune_graph
from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
# launch/bench/peers/graph_peer.py's replacement model (it imports nothing of this repository, so it loads by its path)
_spec = importlib.util.spec_from_file_location(
  "graph_peer", HERE.parent / "launch" / "bench" / "peers" / "graph_peer.py"
)
PEER = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(PEER)
MODEL = HERE / "fixtures" / "gpt2_tiny_a"
FIXTURES = HERE / "fixtures" / "graph"
TOKENS = np.array([50 % 97, 3, 17, 42, 17, 8, 91, 3, 17, 42], np.int64)  # a repeat in it: something to copy
D_SAE = 96
LLAMA = HERE / "fixtures" / "families" / "smollm"  # a Llama of grouped-query attention (SmolLM's shape, tiny)
VARIANTS = {
  "relu": dict(skip=False, jumprelu=False),
  "skip_jumprelu": dict(skip=True, jumprelu=True),
  "llama_skip_jumprelu": dict(skip=True, jumprelu=True, model_dir=LLAMA),
}
CLT_VARIANTS = {"clt_jumprelu": dict(jumprelu=True)}
# circuit-tracer 0.5's layouts, each written by its own functions (a Gemma Scope npz as Google's files are: numpy),
# the transcoders reading the MLP's own input (mlp.hook_in, after ln2's weight) on GPT-2 and on the Llama
LAYOUT_VARIANTS = {
  "cache_mlp_hook_in": dict(layout="cache", skip=True, jumprelu=True, hooks=("mlp.hook_in", "mlp.hook_out")),
  "llama_cache_mlp_hook_in": dict(
    layout="cache", skip=False, jumprelu=True, hooks=("mlp.hook_in", "mlp.hook_out"), model_dir=LLAMA
  ),
  "published": dict(layout="published", skip=False, jumprelu=False, hooks=("mlp.hook_in", "hook_mlp_out")),
  "gemma_scope": dict(layout="gemma_scope", skip=False, jumprelu=True, hooks=("mlp.hook_in", "hook_mlp_out")),
}
# The hooks whose tensors a fixture keeps (circuit-tracer's replacement model's, on its prompt): hooks.npz
KEPT_HOOKS = ("mlp.hook_in", "mlp.hook_out", "hook_mlp_out", "hook_resid_mid", "ln2.hook_normalized")


def random_transcoders(out: Path, seed: int, skip: bool, jumprelu: bool, model_dir: Path = MODEL) -> None:
  """Random transcoders on the model's activations: encoders scaled to the MLP input's size and biases
  that keep about a fifth of the latents firing (a graph of a few hundred features)."""
  g = torch.Generator().manual_seed(seed)
  hf = PEER.hf_model(model_dir)
  d = hf.config.hidden_size
  with torch.no_grad():
    streams = hf(torch.tensor(TOKENS)[None], output_hidden_states=True).hidden_states
  transcoders = []
  for layer in range(2):
    size = float(streams[layer][0, 1:].norm(dim=-1).mean())  # the stream's size (position 0 apart)
    w = {
      "W_enc": torch.randn(D_SAE, d, generator=g) / size,
      "W_dec": torch.randn(D_SAE, d, generator=g) * 0.1 * size / d**0.5,
      "b_enc": -0.8 + 0.1 * torch.randn(D_SAE, generator=g),
      "b_dec": 0.05 * torch.randn(d, generator=g),
    }
    if skip:
      w["W_skip"] = torch.randn(d, d, generator=g) / d**0.5
    if jumprelu:
      w["activation_function.threshold"] = 0.1 + 0.2 * torch.rand(D_SAE, generator=g)
    save_file({k: v.contiguous() for k, v in w.items()}, str(out / f"layer_{layer}.safetensors"))
    transcoders.append({"id": f"tiny-{layer}", "layer": layer, "filepath": f"layer_{layer}.safetensors"})
  config = {
    "model_name": "gpt2-tiny",
    "scan": "tiny",
    "feature_input_hook": "hook_resid_mid",
    "feature_output_hook": "hook_mlp_out",
    "transcoders": transcoders,
  }
  (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def mlp_input_sizes(hf) -> list[float]:
  """The mean size of each layer's MLP input (after its norm) on TOKENS, position 0 apart."""
  blocks = hf.transformer.h if hf.config.model_type == "gpt2" else hf.model.layers
  sizes = []
  hooks = [
    b.mlp.register_forward_pre_hook(lambda m, args: sizes.append(float(args[0][0, 1:].norm(dim=-1).mean())))
    for b in blocks
  ]
  with torch.no_grad():
    hf(torch.tensor(TOKENS)[None])
  for h in hooks:
    h.remove()
  return sizes


def random_set(out: Path, seed: int, layout: str, skip: bool, jumprelu: bool, hooks, model_dir: Path = MODEL) -> None:
  """Random transcoders on the MLPs' own inputs (scaled as `random_transcoders` scales its own) in one of
  circuit-tracer 0.5's layouts: the cache's (TranscoderSet.to_safetensors and the config.yaml that
  save_transcoders_to_cache writes), a published repository's (hf:// URIs of each SingleLayerTranscoder's
  to_safetensors file), or Gemma Scope's (params.npz a layer, W_enc d_model x d_sae, read by its gemma-scope loader)."""
  from circuit_tracer.transcoder.activation_functions import JumpReLU
  from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet

  g = torch.Generator().manual_seed(seed)
  hf = PEER.hf_model(model_dir)
  d = hf.config.hidden_size
  sizes = mlp_input_sizes(hf)
  transcoders = {}
  for layer, size in enumerate(sizes):
    threshold = 0.1 + 0.2 * torch.rand(D_SAE, generator=g)
    activation = JumpReLU(threshold, 0.1) if jumprelu else torch.nn.functional.relu
    tc = SingleLayerTranscoder(d, D_SAE, activation, layer, skip_connection=skip, dtype=torch.float32)
    with torch.no_grad():
      tc.W_enc.copy_(torch.randn(D_SAE, d, generator=g) / size)
      tc.W_dec.copy_(torch.randn(D_SAE, d, generator=g) * 0.1 * size / d**0.5)
      tc.b_enc.copy_(-0.8 + 0.1 * torch.randn(D_SAE, generator=g))
      tc.b_dec.copy_(0.05 * torch.randn(d, generator=g))
      if skip:
        tc.W_skip.copy_(torch.randn(d, d, generator=g) / d**0.5)
    transcoders[layer] = tc
  hook_in, hook_out = hooks
  config = {"model_kind": "transcoder_set", "feature_input_hook": hook_in, "feature_output_hook": hook_out}
  if layout == "cache":  # save_transcoders_to_cache's: the repository's config less transcoders, repo_id, subfolder
    TranscoderSet(transcoders, hook_in, hook_out, scan="tiny-org/tiny-transcoders").to_safetensors(str(out))
    config |= {"model_name": "tiny", "revision": None, "scan": "tiny-org/tiny-transcoders"}
    (out / "config.yaml").write_text(yaml.dump(config))
    return
  uris = []
  for layer, tc in transcoders.items():
    if layout == "published":
      tc.to_safetensors(str(out / f"layer_{layer}.safetensors"))
      uris.append(f"hf://tiny-org/tiny-transcoders/layer_{layer}.safetensors")
    else:
      npz = out / f"layer_{layer}" / "width_96" / "params.npz"
      npz.parent.mkdir(parents=True, exist_ok=True)
      w = {k: v.detach().numpy() for k, v in tc.state_dict().items()}
      w["W_enc"], w["threshold"] = w["W_enc"].T, w.pop("activation_function.threshold")
      np.savez(npz, **w)
      uris.append(f"hf://google/gemma-scope-tiny-transcoders/layer_{layer}/width_96/params.npz")
  (out / "config.yaml").write_text(
    yaml.safe_dump({**config, "model_name": "tiny", "transcoders": uris}, sort_keys=False)
  )


def kept_hooks(out: Path, model_dir: Path) -> None:
  """circuit-tracer's replacement model's tensors at KEPT_HOOKS of every layer, on TOKENS: hooks.npz."""
  model = PEER.replacement_model(model_dir, out, int(TOKENS[0]))
  names = [f"blocks.{layer}.{hook}" for layer in range(model.cfg.n_layers) for hook in KEPT_HOOKS]
  with torch.no_grad():
    _, cache = model.run_with_cache(torch.tensor(TOKENS)[None], names_filter=lambda n: n in names)
  np.savez(out / "hooks.npz", **{n: cache[n][0].numpy() for n in names if n in cache})


GEMMA2 = HERE / "fixtures" / "families" / "gemma2"
HOOK_ORDER = ("hook_resid_mid", "ln2.hook_normalized", "mlp.hook_in", "mlp.hook_out", "hook_mlp_out")  # as they run


def gemma2_hooks(out: Path) -> None:
  """circuit-tracer's own reading of its hooks on Gemma 2 (its nnsight backend: TransformerLens has no tiny Gemma 2),
  each at the place its `tl_nnsight_mapping` names for Gemma2ForCausalLM, on TOKENS of the gemma2 family fixture:
  hooks.npz. The fixture has no tokenizer and nnsight loads one: a copy of it with the Llama fixture's
  tokenizer.json beside (the ids are given, never encoded). Needs nnsight 0.6 (`pip install 'nnsight==0.6.*'`)."""
  import shutil
  import tempfile

  import nnsight
  from circuit_tracer.replacement_model.replacement_model_nnsight import NNSightReplacementModel
  from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet
  from circuit_tracer.utils.tl_nnsight_mapping import get_mapping

  with tempfile.TemporaryDirectory() as tmp:
    model_dir = Path(tmp) / "gemma2"
    shutil.copytree(GEMMA2, model_dir)
    shutil.copy(LLAMA / "tokenizer.json", model_dir)
    special = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(special))
    config = json.loads((GEMMA2 / "config.json").read_text())
    D, L = config["hidden_size"], config["num_hidden_layers"]
    tcs = {l: SingleLayerTranscoder(D, 32, torch.nn.functional.relu, l, dtype=torch.float32) for l in range(L)}
    transcoders = TranscoderSet(tcs, "ln2.hook_normalized", "hook_mlp_out", scan="tiny")
    model = NNSightReplacementModel.from_pretrained_and_transcoders(
      str(model_dir), transcoders, device="cpu", dtype=torch.float32
    )
    mapping = get_mapping(config["architectures"][0]).feature_hook_mapping
    tokens = torch.tensor(TOKENS % config["vocab_size"])[None]
    saved = {}
    with model.trace(tokens):
      for layer in range(L):
        for hook in [h for h in HOOK_ORDER if h in mapping]:
          pattern, io = mapping[hook]
          envoy = model
          for part in pattern.format(layer=layer).replace("[", ".").replace("]", "").split("."):
            envoy = envoy[int(part)] if part.isdigit() else getattr(envoy, part)
          saved[f"blocks.{layer}.{hook}"] = nnsight.save(envoy.output if io == "output" else envoy.input)
  out.mkdir(parents=True, exist_ok=True)
  np.save(out / "tokens.npy", tokens[0].numpy())
  np.savez(out / "hooks.npz", **{k: v[0].detach().numpy() for k, v in saved.items()})


def random_clt(out: Path, seed: int, jumprelu: bool) -> None:
  """A random cross-layer transcoder over both layers in circuit-tracer's files (its own `to_safetensors`), scaled
  as `random_transcoders` scales its per-layer ones."""
  g = torch.Generator().manual_seed(seed)
  hf = PEER.hf_model(MODEL)
  d, L = hf.config.n_embd, hf.config.n_layer
  with torch.no_grad():
    streams = hf(torch.tensor(TOKENS)[None], output_hidden_states=True).hidden_states
  sizes = [float(streams[layer][0, 1:].norm(dim=-1).mean()) for layer in range(L)]
  clt = CrossLayerTranscoder(
    L,
    D_SAE,
    d,
    activation_function="jump_relu" if jumprelu else "relu",
    lazy_decoder=False,
    device="cpu",
    dtype=torch.float32,
  )
  with torch.no_grad():
    clt.W_enc.copy_(torch.stack([torch.randn(D_SAE, d, generator=g) / size for size in sizes]))
    clt.b_enc.copy_(-0.8 + 0.1 * torch.randn(L, D_SAE, generator=g))
    clt.b_dec.copy_(0.05 * torch.randn(L, d, generator=g))
    for layer in range(L):
      clt.W_dec[layer].copy_(torch.randn(D_SAE, L - layer, d, generator=g) * 0.1 * sizes[layer] / d**0.5)
    if jumprelu:
      clt.activation_function.threshold.copy_(0.1 + 0.2 * torch.rand(L, 1, D_SAE, generator=g))
  clt.to_safetensors(str(out))
  config = {
    "model_kind": "cross_layer_transcoder",
    "feature_input_hook": "hook_resid_mid",
    "feature_output_hook": "hook_mlp_out",
  }
  (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


# circuit-tracer's capped attribution (max_feature_nodes; batch_size 16 and its update_interval 4: a re-ranking
# every 64 rows), two caps, on a GPT-2 and a Llama set: graph_capped_<cap>.npz beside the set's graph.npz
CAPPED = {"skip_jumprelu": MODEL, "llama_skip_jumprelu": LLAMA}
CAPS, CAPPED_BATCH = (64, 200), 16


def graph_of(transcoder_dir: Path, tokens: np.ndarray, model_dir: Path = MODEL, **options) -> dict:
  model = PEER.replacement_model(model_dir, transcoder_dir, int(tokens[0]))
  options = {"batch_size": 64, **options}
  graph = attribute(torch.tensor(tokens), model, max_n_logits=10, desired_logit_prob=0.95, **options)
  node_mask, edge_mask, scores = prune_graph(graph, node_threshold=0.8, edge_threshold=0.98)
  replacement, completeness = compute_graph_scores(graph)
  return {
    "scores": np.array([replacement, completeness]),
    "active_features": graph.active_features.numpy(),
    "activation_values": graph.activation_values.numpy(),
    "selected_features": graph.selected_features.numpy(),
    "adjacency_matrix": graph.adjacency_matrix.numpy(),
    "logit_tokens": graph.logit_token_ids.numpy(),
    "logit_probabilities": graph.logit_probabilities.numpy(),
    "node_mask": node_mask.numpy(),
    "edge_mask": edge_mask.numpy(),
    "cumulative_scores": scores.numpy(),
  }


def make_layout(i: int, name: str) -> None:
  """LAYOUT_VARIANTS[name]'s files, its graph by circuit-tracer and its hooks' tensors."""
  how = LAYOUT_VARIANTS[name]
  out = FIXTURES / name
  out.mkdir(parents=True, exist_ok=True)
  random_set(out, seed=20 + i, **how)
  np.save(out / "tokens.npy", TOKENS)
  np.savez_compressed(out / "graph.npz", **graph_of(out, TOKENS, how.get("model_dir", MODEL)))
  kept_hooks(out, how.get("model_dir", MODEL))
  print(name, {k: v.shape for k, v in np.load(out / "graph.npz").items()})


def main(argv: list[str]) -> None:
  torch.manual_seed(0)
  if argv[:1] == ["--check"]:
    out = Path(argv[1])
    np.savez(out / "circuit_tracer.npz", **graph_of(out, np.load(out / "tokens.npy")))
    return
  if argv[:1] == ["--capped"]:
    for name, model_dir in CAPPED.items():
      out = FIXTURES / name
      for cap in CAPS:
        options = dict(max_feature_nodes=cap, batch_size=CAPPED_BATCH)
        np.savez_compressed(
          out / f"graph_capped_{cap}.npz", **graph_of(out, np.load(out / "tokens.npy"), model_dir, **options)
        )
        print(name, cap, np.load(out / f"graph_capped_{cap}.npz")["adjacency_matrix"].shape)
    return
  if argv[:1] == ["--gemma2-hooks"]:
    gemma2_hooks(FIXTURES / "gemma2_hooks")
    return
  if argv[:1] == ["--layouts"]:  # the layout variants alone (the others' files stay as they were made)
    variants = {k: v for k, v in LAYOUT_VARIANTS.items() if k in argv[1:]} or LAYOUT_VARIANTS
    for i, name in enumerate(LAYOUT_VARIANTS):
      if name in variants:
        make_layout(i, name)
    return
  for i, (name, how) in enumerate(VARIANTS.items()):
    out = FIXTURES / name
    out.mkdir(parents=True, exist_ok=True)
    random_transcoders(out, seed=i, **how)
    np.save(out / "tokens.npy", TOKENS)
    np.savez_compressed(out / "graph.npz", **graph_of(out, TOKENS, how.get("model_dir", MODEL)))
    print(name, {k: v.shape for k, v in np.load(out / "graph.npz").items()})
  for i, name in enumerate(LAYOUT_VARIANTS):
    make_layout(i, name)
  for i, (name, how) in enumerate(CLT_VARIANTS.items()):
    out = FIXTURES / name
    out.mkdir(parents=True, exist_ok=True)
    random_clt(out, seed=10 + i, **how)
    np.save(out / "tokens.npy", TOKENS)
    np.savez_compressed(out / "graph.npz", **graph_of(out, TOKENS))
    print(name, {k: v.shape for k, v in np.load(out / "graph.npz").items()})


if __name__ == "__main__":
  main(sys.argv[1:])
