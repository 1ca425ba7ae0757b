"""circuit-tracer's attribution graph, timed for `launch.bench --what=graph` beside ours on the same weights.

Runs in a venv of its own with circuit-tracer (launch/peer_env.py makes it); imports nothing from this
repository. Reads a JSON spec (a GPT-2 directory in Hugging Face's files, a circuit-tracer transcoder set,
the prompt's ids as .npy, the batch size, the repeats, where to write the graph), builds circuit-tracer's
TransformerLens replacement model from them, times `attribute` on the prompt (the first call and the median of
the rest), writes the last graph's adjacency and active features to the .npz named, and prints one JSON line.

  <venv>/bin/python launch/graph_peer.py '<json spec>'
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
from transformer_lens import HookedTransformerConfig
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
from transformers import GPT2LMHeadModel


class IdTokenizer:
  """What circuit-tracer asks of a tokenizer, for a prompt of ids: its first id counts as the BOS."""

  def __init__(self, first: int, vocab_size: int):
    self.all_special_ids = [first]
    self.bos_token_id = self.pad_token_id = self.eos_token_id = first
    self.vocab_size = vocab_size
    self.padding_side = "right"

  def decode(self, ids):
    return " ".join(map(str, ids if isinstance(ids, list) else [ids]))


def replacement_model(model_dir: Path, transcoder_dir: Path, first: int) -> TransformerLensReplacementModel:
  hf = GPT2LMHeadModel.from_pretrained(model_dir)
  c = hf.config
  cfg = HookedTransformerConfig(
    n_layers=c.n_layer,
    d_model=c.n_embd,
    n_ctx=c.n_positions,
    d_head=c.n_embd // c.n_head,
    n_heads=c.n_head,
    d_mlp=4 * c.n_embd,
    d_vocab=c.vocab_size,
    act_fn="gelu_new",
    normalization_type="LN",
    eps=c.layer_norm_epsilon,
    model_name="gpt2-shape",
    original_architecture="GPT2LMHeadModel",
    default_prepend_bos=False,
    device="cpu",
  )
  config = yaml.safe_load((transcoder_dir / "config.yaml").read_text())
  paths = {t["layer"]: str(transcoder_dir / t["filepath"]) for t in config["transcoders"]}
  transcoders = load_transcoder_set(
    paths,
    scan=config.get("scan", "bench"),
    feature_input_hook=config["feature_input_hook"],
    feature_output_hook=config["feature_output_hook"],
    device=torch.device("cpu"),
    lazy_encoder=False,
    lazy_decoder=False,
  )
  model = TransformerLensReplacementModel(cfg)
  model.load_and_process_state_dict(
    convert_gpt2_weights(hf, cfg), fold_ln=False, center_writing_weights=False, center_unembed=False
  )
  model._configure_replacement_model(transcoders)
  model.tokenizer = IdTokenizer(first, c.vocab_size)
  return model


def main(spec: dict) -> dict:
  torch.manual_seed(0)
  tokens = np.load(spec["tokens"])
  model = replacement_model(Path(spec["model"]), Path(spec["transcoders"]), int(tokens[0]))
  times, graph = [], None
  for _ in range(spec["repeats"]):
    start = time.perf_counter()
    graph = attribute(torch.tensor(tokens), model, batch_size=spec["batch_size"])
    times.append(time.perf_counter() - start)
  np.savez(spec["out"], active_features=graph.active_features.numpy(), adjacency=graph.adjacency_matrix.numpy())
  return {
    "first_seconds": times[0],
    "seconds": statistics.median(times[1:] or times),
    "features": int(len(graph.active_features)),
    "versions": f"circuit-tracer {getattr(circuit_tracer, '__version__', '0.5')}, torch {torch.__version__}",
    "threads": torch.get_num_threads(),
  }


if __name__ == "__main__":
  print(json.dumps(main(json.loads(sys.argv[1]))))
