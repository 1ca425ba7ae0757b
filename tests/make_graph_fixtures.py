"""Golden fixtures from circuit-tracer for tests/test_graph.py: attribution graphs of a prompt through the tiny
GPT-2 of tests/fixtures/gpt2_tiny_a and random per-layer transcoders in circuit-tracer's own format (a
config.yaml and one safetensors a layer) and a random cross-layer transcoder in its files (W_enc_<l>, W_dec_<l>),
computed by circuit-tracer 0.5 on TransformerLens, with its pruning.

Not run by the test suite (torch is not a dependency of this project). Regenerate with a Python 3.11 venv:

  python3.11 -m venv /tmp/ctenv
  /tmp/ctenv/bin/pip install torch==2.13.0 circuit-tracer==0.5.0
  /tmp/ctenv/bin/python tests/make_graph_fixtures.py          # writes tests/fixtures/graph/<variant>/
  /tmp/ctenv/bin/python tests/make_graph_fixtures.py --check DIR
      # circuit-tracer's graph of transcoders we exported (DIR: config.yaml, layer_<l>.safetensors, tokens.npy)
      # on the same model, written to DIR/circuit_tracer.npz

Each variant's directory: the transcoders (config.yaml, layer_<l>.safetensors), tokens.npy, and graph.npz
(active_features, activation_values, selected_features, adjacency_matrix, logit_tokens, logit_probabilities,
node_mask, edge_mask, cumulative_scores, scores: circuit-tracer's `Graph`, `prune_graph` and
`compute_graph_scores`).
"""

import importlib.util
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


def graph_of(transcoder_dir: Path, tokens: np.ndarray, model_dir: Path = MODEL) -> dict:
  model = PEER.replacement_model(model_dir, transcoder_dir, int(tokens[0]))
  graph = attribute(torch.tensor(tokens), model, max_n_logits=10, desired_logit_prob=0.95, batch_size=64)
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


def main(argv: list[str]) -> None:
  torch.manual_seed(0)
  if argv[:1] == ["--check"]:
    out = Path(argv[1])
    np.savez(out / "circuit_tracer.npz", **graph_of(out, np.load(out / "tokens.npy")))
    return
  for i, (name, how) in enumerate(VARIANTS.items()):
    out = FIXTURES / name
    out.mkdir(parents=True, exist_ok=True)
    random_transcoders(out, seed=i, **how)
    np.save(out / "tokens.npy", TOKENS)
    np.savez_compressed(out / "graph.npz", **graph_of(out, TOKENS, how.get("model_dir", MODEL)))
    print(name, {k: v.shape for k, v in np.load(out / "graph.npz").items()})
  for i, (name, how) in enumerate(CLT_VARIANTS.items()):
    out = FIXTURES / name
    out.mkdir(parents=True, exist_ok=True)
    random_clt(out, seed=10 + i, **how)
    np.save(out / "tokens.npy", TOKENS)
    np.savez_compressed(out / "graph.npz", **graph_of(out, TOKENS))
    print(name, {k: v.shape for k, v in np.load(out / "graph.npz").items()})


if __name__ == "__main__":
  main(sys.argv[1:])
