"""`launch.bench --what=hf`: an open family's model in ours and in transformers on the same CPU.

The model is a published shape (--hf_shape, default SmolLM2-135M's: a Llama of 30 layers, d_model 576,
9 heads and 3 kv heads, MLP 1,536, vocabulary 49,152, tied) with random weights, made here and exported
(formats.export_hf) into a temporary directory that both load: the peer (launch/bench/peers/torch_peer.py's
`family`) with AutoModelForCausalLM in float32, eager. Reported per batch size: the prefill (one forward
over --prompt_len tokens a row) in tokens a second, and greedy generation of --new_tokens with each one's
KV cache in new tokens a second; and whether the first row's greedy tokens are the same in both.
"""

from __future__ import annotations

import tempfile

import jax
import numpy as np

from experiments import shapes
from launch.bench import models as bench_models
from launch.bench import peer_env
from transformer import benchmark
from transformer.generation import sampling
from transformer.models import formats
from transformer.models.gpt import GPT, count_params


def hf_table(o) -> str:
  """The table, for launch.bench's options `o` (hf_shape, batch_sizes, prompt_len, new_tokens, peer_python)."""
  cfg = shapes.shape(o.hf_shape, kernels=o.kernels)
  params = bench_models.params_of(cfg)
  batch_sizes = [int(b) for b in o.batch_sizes]
  prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (max(batch_sizes), o.prompt_len)).tolist()
  with tempfile.TemporaryDirectory() as directory:
    model_type = shapes.SHAPES[o.hf_shape]["model_type"]
    formats.export_hf(cfg, params, directory, model_type)
    spec = {
      "peers": ["family"],
      "family": {"directory": directory, "batch_sizes": batch_sizes, "prompts": prompts, "new_tokens": o.new_tokens},
      "repeats": o.repeats,
    }
    result = peer_env.run_peers(peer_env.peer_python(o.peer_python), spec)
  peer, model = result["family"], GPT(cfg)
  forward = jax.jit(model.apply)
  rows, ours_tokens = [], None
  for b in batch_sizes:
    tokens_BxP = np.asarray(prompts[:b], np.int32)
    prefill = benchmark.median_seconds(lambda: forward({"params": params}, tokens_BxP), repeats=o.repeats)
    rows.append(_row(f"prefill, {o.prompt_len} tokens", b, b * o.prompt_len, prefill, peer["prefill"][str(b)]))
    greedy = lambda: sampling.generate(
      model, params, prompts[:b], max_new_tokens=o.new_tokens, sampling=sampling.Sampling(temperature=0)
    )
    generate = benchmark.median_seconds(lambda: len(greedy()), repeats=o.repeats)
    rows.append(
      _row(f"generate, {o.prompt_len}+{o.new_tokens}", b, b * o.new_tokens, generate, peer["generate"][str(b)])
    )
    ours_tokens = ours_tokens or greedy()[0]
  same = "the same" if ours_tokens == peer["tokens"] else "NOT the same"
  header = (
    f"{o.hf_shape} ({count_params(cfg):,} params, {model_type}, random weights, float32, kernels={cfg.kernels}): "
    f"ours (JAX, jit) vs transformers (PyTorch eager) on {jax.device_count()}x {jax.devices()[0].device_kind}, "
    f"median of {o.repeats}\npeer: torch {result['torch']}, transformers {result['transformers']}, "
    f"{result['threads']} threads; ours: jax {jax.__version__}; greedy tokens of row 0: {same}"
  )
  return header + "\n" + benchmark.table(["benchmark", "batch", "unit", "ours", "HF", "ours/HF"], rows)


def _row(what: str, batch: int, tokens: int, ours_s: float, theirs_s: float) -> list:
  ours, theirs = tokens / ours_s, tokens / theirs_s
  return [what, batch, "tokens/s", ours, theirs, f"{ours / theirs:.2f}x"]
