"""circuit-tracer's attribution graph, timed for `launch.bench --what=graph` beside ours on the same weights.

Runs in a venv of its own with circuit-tracer (launch/bench/peer_env.py makes it); imports nothing from this
repository. Reads a JSON spec (a GPT-2 directory in Hugging Face's files, a circuit-tracer transcoder set,
the prompt's ids as .npy, the batch size, the repeats, where to write the graph), builds circuit-tracer's
TransformerLens replacement model from them, times `attribute` on the prompt (the first call and the median of
the rest), writes the last graph's adjacency and active features to the .npz named, and prints one JSON line.

  <venv>/bin/python launch/bench/peers/graph_peer.py '<json spec>'

tests/make_graph_fixtures.py builds its golden graphs with the same replacement model (`replacement_model`).
"""

import json
import statistics
import sys
import time
from pathlib import Path

import circuit_tracer
import numpy as np
import torch
import yaml
from circuit_tracer import attribute
from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set
from circuit_tracer.utils.caching import load_transcoders_from_cache
from circuit_tracer.utils.hf_utils import load_transcoders, parse_hf_uri
from safetensors.torch import load_file
from transformer_lens import HookedTransformerConfig
from transformer_lens.pretrained.weight_conversions import (
  convert_gpt2_weights,
  convert_llama_weights,
  convert_qwen3_weights,
)
from transformers import GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM


class IdTokenizer:
  """What circuit-tracer asks of a tokenizer, for a prompt of ids: its first id counts as the BOS (so that
  circuit-tracer prepends none), a token decodes to its id."""

  def __init__(self, first: int, vocab_size: int):
    self.all_special_ids = [first]
    self.bos_token_id = self.pad_token_id = self.eos_token_id = first
    self.vocab_size = vocab_size
    self.padding_side = "right"

  def decode(self, ids):
    return " ".join(map(str, ids if isinstance(ids, list) else [ids]))


def hf_model(model_dir: Path):
  """transformers' model of a directory: GPT-2's, or a Llama's or a Qwen3's (the families' fixtures and the
  benchmark's published shapes, written in transformers 5's form, whose rope_parameters this transformers reads as
  rope_theta), in float32."""
  config = json.loads((model_dir / "config.json").read_text())
  if config["model_type"] == "gpt2":
    return GPT2LMHeadModel.from_pretrained(model_dir)
  config["rope_theta"] = config.pop("rope_parameters", {}).get("rope_theta", 10000.0)
  for key in ("transformers_version", "dtype", "architectures", "attn_implementation"):
    config.pop(key, None)
  qwen3 = config["model_type"] == "qwen3"
  hf = Qwen3ForCausalLM(Qwen3Config(**config)) if qwen3 else LlamaForCausalLM(LlamaConfig(**config))
  state = {}
  for file in sorted(model_dir.glob("*.safetensors")):
    state |= {k: v.float() for k, v in load_file(file).items()}
  hf.load_state_dict(state, strict=False)  # a tied head is not in the file
  hf.tie_weights()
  return hf.eval()


def tl_config(hf) -> HookedTransformerConfig:
  c = hf.config
  qwen3 = c.model_type == "qwen3"
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
    use_qk_norm=qwen3,
    model_name="qwen3-shape" if qwen3 else "llama-tiny",
    original_architecture="Qwen3ForCausalLM" if qwen3 else "LlamaForCausalLM",
    default_prepend_bos=False,
    device="cpu",
  )


def load(transcoder_dir: Path, lazy: bool = False):
  """A transcoder set or a cross-layer transcoder by circuit-tracer's own loaders, in any of its layouts: the cache
  layout (config.yaml, and layer_<l>.safetensors or W_enc_<l>/W_dec_<l> beside it) by load_transcoders_from_cache;
  a published one (config.yaml listing hf:// URIs, the files downloaded beside it) by load_transcoders, each URI
  read where a download of its repository put it (the one step offline); the first releases' (entries of id,
  layer and filepath, which 0.5's loaders no longer read) by load_transcoder_set with the paths the entries name."""
  config = yaml.safe_load((transcoder_dir / "config.yaml").read_text())
  cpu = dict(device=torch.device("cpu"), dtype=torch.float32, lazy_encoder=lazy, lazy_decoder=lazy)
  entries = config.get("transcoders")
  if entries is None:
    return load_transcoders_from_cache(transcoder_dir.name, cache_dir=transcoder_dir.parent, **cpu)[0]
  if all(isinstance(e, dict) for e in entries):
    hooks = dict(feature_input_hook=config["feature_input_hook"], feature_output_hook=config["feature_output_hook"])
    paths = {e["layer"]: str(transcoder_dir / e["filepath"]) for e in entries}
    return load_transcoder_set(paths, scan=config.get("scan", "tiny"), **hooks, **cpu)
  local = [str(transcoder_dir / (parse_hf_uri(e).file_path if e.startswith("hf://") else e)) for e in entries]
  repo = parse_hf_uri(entries[0]).repo_id if entries[0].startswith("hf://") else ""
  return load_transcoders({**config, "transcoders": local, "repo_id": repo, "scan": config.get("scan", repo)}, **cpu)


def replacement_model(
  model_dir: Path, transcoder_dir: Path, first: int, lazy: bool = False
) -> TransformerLensReplacementModel:
  """circuit-tracer's TransformerLens replacement model of a GPT-2, Llama or Qwen3 directory and a transcoder set
  or a cross-layer transcoder in circuit-tracer's files (config.yaml's model_kind says which; `lazy`: its encoders
  and decoders read from the files when used, as it reads published sets)."""
  hf = hf_model(model_dir)
  cfg = tl_config(hf)
  converts = {"gpt2": convert_gpt2_weights, "qwen3": convert_qwen3_weights}
  convert = converts.get(hf.config.model_type, convert_llama_weights)
  transcoders = load(transcoder_dir, lazy)
  model = TransformerLensReplacementModel(cfg)
  model.load_and_process_state_dict(convert(hf, cfg), fold_ln=False, center_writing_weights=False, center_unembed=False)
  vocab_size = hf.config.vocab_size
  del hf  # (its float32 copy of the weights)
  model._configure_replacement_model(transcoders)
  model.tokenizer = IdTokenizer(first, vocab_size)
  return model


def main(spec: dict) -> dict:
  torch.manual_seed(0)
  tokens = np.load(spec["tokens"])
  start = time.perf_counter()
  lazy = spec.get("lazy", False)
  model = replacement_model(Path(spec["model"]), Path(spec["transcoders"]), int(tokens[0]), lazy)
  loaded = time.perf_counter() - start
  times, graph = [], None
  cap = spec.get("max_feature_nodes")
  for _ in range(spec["repeats"]):
    start = time.perf_counter()
    graph = attribute(
      torch.tensor(tokens), model, batch_size=spec["batch_size"], max_feature_nodes=cap, offload=spec.get("offload")
    )
    times.append(time.perf_counter() - start)
  np.savez(spec["out"], active_features=graph.active_features.numpy(), adjacency=graph.adjacency_matrix.numpy())
  return {
    "first_seconds": times[0],
    "seconds": statistics.median(times[1:] or times),
    "features": int(len(graph.active_features)),
    "active": int(len(graph.active_features)),
    "load_seconds": loaded,
    "peak_bytes": peak_rss(),
    "versions": f"circuit-tracer {getattr(circuit_tracer, '__version__', '0.5')}, torch {torch.__version__}",
    "threads": torch.get_num_threads(),
  }


def peak_rss() -> int:
  """This process's peak resident bytes (/proc's VmHWM)."""
  for line in Path("/proc/self/status").read_text().splitlines():
    if line.startswith("VmHWM:"):
      return int(line.split()[1]) * 1024
  return -1


if __name__ == "__main__":
  print(json.dumps(main(json.loads(sys.argv[1]))))
