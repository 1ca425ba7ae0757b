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

import json
import sys
from pathlib import Path

import numpy as np
import torch
import yaml
from circuit_tracer import attribute
from circuit_tracer.graph import compute_graph_scores, prune_graph
from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder, load_clt
from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set
from safetensors.torch import load_file, save_file
from transformer_lens import HookedTransformerConfig
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights, convert_llama_weights
from transformers import GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

HERE = Path(__file__).resolve().parent
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


class IdTokenizer:
  """What circuit-tracer asks of a tokenizer, for a model of ids alone: the prompt's first id counts as its BOS
  (so that circuit-tracer prepends none), a token decodes to its id."""

  all_special_ids = [int(TOKENS[0])]
  bos_token_id = pad_token_id = eos_token_id = int(TOKENS[0])
  padding_side = "right"

  def __init__(self, vocab_size: int = 97):
    self.vocab_size = vocab_size

  def decode(self, ids):
    return " ".join(map(str, ids if isinstance(ids, list) else [ids]))


def hf_model(model_dir: Path):
  """transformers' model of a directory: GPT-2's, or a Llama's (the families' fixtures, written by transformers 5,
  whose rope_parameters this transformers reads as rope_theta)."""
  config = json.loads((model_dir / "config.json").read_text())
  if config["model_type"] == "gpt2":
    return GPT2LMHeadModel.from_pretrained(model_dir)
  config["rope_theta"] = config.pop("rope_parameters", {}).get("rope_theta", 10000.0)
  for key in ("transformers_version", "dtype", "architectures", "attn_implementation"):
    config.pop(key, None)
  hf = LlamaForCausalLM(LlamaConfig(**config))
  hf.load_state_dict(load_file(model_dir / "model.safetensors"), strict=False)  # a tied head is not in the file
  hf.tie_weights()
  return hf.eval()


def tl_config(hf) -> HookedTransformerConfig:
  c = hf.config
  if c.model_type == "gpt2":
    shape = dict(
      n_layers=c.n_layer, d_model=c.n_embd, n_ctx=c.n_positions, d_head=c.n_embd // c.n_head, n_heads=c.n_head
    )
    return HookedTransformerConfig(
      **shape,
      d_mlp=4 * c.n_embd,
      d_vocab=c.vocab_size,
      act_fn="gelu_new",
      normalization_type="LN",
      eps=c.layer_norm_epsilon,
      model_name="gpt2-tiny",
      original_architecture="GPT2LMHeadModel",
      default_prepend_bos=False,
      device="cpu",
    )
  return HookedTransformerConfig(
    n_layers=c.num_hidden_layers,
    d_model=c.hidden_size,
    n_ctx=c.max_position_embeddings,
    d_head=c.head_dim,
    n_heads=c.num_attention_heads,
    n_key_value_heads=c.num_key_value_heads,
    d_mlp=c.intermediate_size,
    d_vocab=c.vocab_size,
    act_fn="silu",
    normalization_type="RMS",
    positional_embedding_type="rotary",
    rotary_dim=c.head_dim,
    rotary_base=c.rope_theta,
    gated_mlp=True,
    final_rms=True,
    eps=c.rms_norm_eps,
    model_name="llama-tiny",
    original_architecture="LlamaForCausalLM",
    default_prepend_bos=False,
    device="cpu",
  )


def replacement_model(transcoder_dir: Path, model_dir: Path = MODEL) -> TransformerLensReplacementModel:
  hf = hf_model(model_dir)
  cfg = tl_config(hf)
  convert = convert_gpt2_weights if hf.config.model_type == "gpt2" else convert_llama_weights
  config = yaml.safe_load((transcoder_dir / "config.yaml").read_text())
  hooks = dict(feature_input_hook=config["feature_input_hook"], feature_output_hook=config["feature_output_hook"])
  if config.get("model_kind") == "cross_layer_transcoder":
    transcoders = load_clt(
      str(transcoder_dir), scan="tiny", device=torch.device("cpu"), dtype=torch.float32, lazy_decoder=False, **hooks
    )
  else:
    paths = {t["layer"]: str(transcoder_dir / t["filepath"]) for t in config["transcoders"]}
    transcoders = load_transcoder_set(
      paths, scan="tiny", device=torch.device("cpu"), lazy_encoder=False, lazy_decoder=False, **hooks
    )
  model = TransformerLensReplacementModel(cfg)
  model.load_and_process_state_dict(convert(hf, cfg), fold_ln=False, center_writing_weights=False, center_unembed=False)
  model._configure_replacement_model(transcoders)
  model.tokenizer = IdTokenizer(hf.config.vocab_size)
  return model


def random_transcoders(out: Path, seed: int, skip: bool, jumprelu: bool, model_dir: Path = MODEL) -> None:
  """Random transcoders on the model's activations: encoders scaled to the MLP input's size and biases
  that keep about a fifth of the latents firing (a graph of a few hundred features)."""
  g = torch.Generator().manual_seed(seed)
  hf = hf_model(model_dir)
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
  hf = GPT2LMHeadModel.from_pretrained(MODEL)
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
  model = replacement_model(transcoder_dir, model_dir)
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
