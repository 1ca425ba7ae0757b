"""`launch.bench --what=vs_hf|vs_torch`: ours beside the PyTorch peers (launch/bench/peers/torch_peer.py: Hugging Face's
GPT-2 and a minimal nanoGPT-style GPT) on the same shapes, in their own venv (launch/bench/peer_env.py).
"""

from __future__ import annotations

import collections

import jax
import numpy as np

from experiments import shakespeare
from launch.bench import models as bench_models
from launch.bench import peer_env
from transformer import benchmark
from transformer.models import gpt

# --what=vs_torch's two shapes: the README main job's (shakespeare.py:char_gpt2, its batch in the config's
# microbatches) and cpu-small with GPT-2's vocabulary. (name, preset, overrides, train batch, train
# seq, microbatches, new tokens after a 32-token prompt)
VS_TORCH_SHAPES = (
  ("main job", "cpu-small", dict(d_model=128, max_len=128, vocab_size=85), 32, 128, shakespeare.GPT_MICROBATCHES, 96),
  ("cpu-small", "cpu-small", dict(vocab_size=50257), 16, 256, 1, 128),
)


def peer_shape(cfg: gpt.GPTConfig) -> dict:
  """The model's shape as launch/bench/peers/torch_peer.py builds its PyTorch GPT-2."""
  return {
    "vocab_size": cfg.vocab_size,
    "max_len": cfg.max_len,
    "num_layers": cfg.num_layers,
    "num_heads": cfg.block.num_heads,
    "d_model": cfg.block.d_model,
  }


def vs_hf_table(o) -> str:
  cfg = bench_models.model_config(o)
  batch_sizes = [int(b) for b in o.batch_sizes]
  spec = {
    "model": peer_shape(cfg),
    "generate": {"batch_sizes": batch_sizes, "prompt_len": o.prompt_len, "new_tokens": o.new_tokens},
    "train": o.train_batch and {"batch_size": o.train_batch, "seq_len": o.seq_len, "warmup_seconds": o.train_warmup_s},
    "repeats": o.repeats,
  }
  result = peer_env.run_peers(peer_env.peer_python(o.peer_python), spec)
  peer = result["hf"]
  params = bench_models.params_of(cfg)
  rows = []
  for b in batch_sizes:
    ours = b * o.new_tokens / bench_models.generate_seconds(o, cfg, params, b)
    theirs = b * o.new_tokens / peer["generate"][str(b)]
    rows.append(
      [
        f"generate, {o.prompt_len}+{o.new_tokens} tokens",
        b,
        "new tokens/s",
        ours,
        theirs,
        f"{ours / theirs:.2f}x",
      ]
    )
  if o.train_batch:
    tokens = o.train_batch * o.seq_len
    ours, theirs = tokens / bench_models.train_step_seconds(o, cfg, params), tokens / peer["train"]
    rows.append([f"train step, seq {o.seq_len}", o.train_batch, "tokens/s", ours, theirs, f"{ours / theirs:.2f}x"])
  header = (
    bench_models.header(o, "ours (JAX, jit) vs HF transformers (PyTorch eager)", cfg)
    + f"\npeer: torch {result['torch']}, transformers {result['transformers']}, {result['threads']} threads; "
    f"ours: jax {jax.__version__}"
  )
  return header + "\n" + benchmark.table(["benchmark", "batch", "unit", "ours", "HF", "ours/HF"], rows)


def vs_torch_table(o) -> str:
  """Ours beside the minimal PyTorch GPT and HF's GPT-2 (launch/bench/peers/torch_peer.py) on both shapes:
  a training step, and greedy generation at --batch_sizes; --rounds times, alternating."""
  batch_sizes = [int(b) for b in o.batch_sizes]
  python = peer_env.peer_python(o.peer_python)
  rows, versions = [], ""
  for name, preset, overrides, train_batch, seq_len, microbatches, new_tokens in VS_TORCH_SHAPES:
    cfg = gpt.preset(preset, attention=o.attention, dtype=o.dtype, kernels=o.kernels, **overrides)
    spec = {
      "peers": ["minimal", "hf"],
      "model": peer_shape(cfg),
      "generate": {"batch_sizes": batch_sizes, "prompt_len": o.prompt_len, "new_tokens": new_tokens},
      "train": {"batch_size": train_batch, "seq_len": seq_len, "warmup_seconds": o.train_warmup_s},
      "repeats": o.repeats,
    }
    # seconds[(benchmark, batch)][side]: one median per round
    seconds = collections.defaultdict(lambda: collections.defaultdict(list))
    for _ in range(o.rounds):
      peers = peer_env.run_peers(python, spec)
      versions = f"torch {peers['torch']}, transformers {peers['transformers']}, {peers['threads']} threads"
      params = bench_models.params_of(cfg)
      for b in batch_sizes:
        cell = seconds[("generate", b)]
        cell["ours"].append(bench_models.generate_seconds(o, cfg, params, b, new_tokens))
        for peer in ("minimal", "hf"):
          cell[peer].append(peers[peer]["generate"][str(b)])
      cell = seconds[("train", train_batch)]
      cell["ours"].append(
        bench_models.train_step_seconds(o, cfg, params, train_batch, seq_len, microbatches)
      )  # donates: last
      for peer in ("minimal", "hf"):
        cell[peer].append(peers[peer]["train"])
    shape = f"{name}: d {cfg.block.d_model}, {cfg.num_layers} layers, vocab {cfg.vocab_size}"
    rows += _vs_torch_rows(o, shape, seconds, seq_len, microbatches, new_tokens)
  header = (
    f"ours (JAX, jit) vs a minimal PyTorch GPT and HF transformers' GPT-2 (PyTorch eager) on "
    f"{jax.devices()[0].device_kind}, median of {o.repeats}"
    + (f", then the median of {o.rounds} alternating rounds" if o.rounds > 1 else "")
    + f"\npeers: {versions}; ours: jax {jax.__version__}"
  )
  return (
    header
    + "\n"
    + benchmark.table(
      ["shape", "benchmark", "batch", "unit", "ours", "minimal torch", "HF", "ours/minimal", "ours/HF"], rows
    )
  )


def _vs_torch_rows(o, shape: str, seconds, seq_len: int, microbatches: int, new_tokens: int) -> list[list]:
  """One shape's rows: each benchmark's tokens a second (the median of the rounds), ours and the peers'."""
  rows = []
  for (what, batch), cell in sorted(seconds.items(), key=lambda kv: (kv[0][0] != "train", kv[0][1])):
    work = batch * (seq_len if what == "train" else new_tokens)
    ours, minimal, hf = (work / float(np.median(cell[side])) for side in ("ours", "minimal", "hf"))
    label = (
      f"train step, seq {seq_len}" + (f", {microbatches} microbatches" if microbatches > 1 else "")
      if what == "train"
      else f"generate {o.prompt_len}+{new_tokens}"
    )
    unit = "tokens/s" if what == "train" else "new tokens/s"
    rows.append([shape, label, batch, unit, ours, minimal, hf, f"{ours / minimal:.2f}x", f"{ours / hf:.2f}x"])
  return rows
