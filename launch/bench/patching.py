"""`launch.bench --what=patching`: activation patching sweeps, ours beside TransformerLens's, on one
random-weight GPT (default cpu-small; the results page uses --preset=gpt2) and one clean/corrupt pair
of --seq_len tokens: the full layer x position sweep of `resid_pre` and the layer x head sweep of
each head's output (`z`, every position). Ours is timed on its first call, compilation included, and then on the
prompts 3 tokens shorter (in their length bucket, the programs compiled for the first; ours alone); the
peer (launch/bench/peers/lens_peer.py, TransformerLens on Hugging Face's GPT-2 with the same weights, exported
by transformer.models.formats.gpt2) in a Python 3.11 venv with torch's CPU wheel and transformer-lens,
made once under the asset cache ($TRANSFORMER_CACHE/lens-peer-venv) or given by --peer_python.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from launch.bench import models as bench_models
from launch.bench import peer_env
from transformer import benchmark
from transformer.interp import patching
from transformer.models import gpt
from transformer.models.formats.gpt2 import export_hf_gpt2

ANSWER, WRONG = 11, 13  # the metric: logit of ANSWER minus logit of WRONG at the last position


def _ours(model, params, clean, corrupt, metric):
  """Each sweep's (seconds, values) on its first call, then each one's seconds on prompts 3 tokens shorter."""
  ours, shorter = {}, {}
  for over in ("positions", "heads"):
    start = time.perf_counter()
    values = np.asarray(patching.patching_sweep(model, params, clean, corrupt, metric, over=over))
    ours[over] = (time.perf_counter() - start, values)
  for over in ("positions", "heads"):  # a new prompt, in the first one's length bucket
    start = time.perf_counter()
    np.asarray(patching.patching_sweep(model, params, clean[:, 3:], corrupt[:, 3:], metric, over=over))
    shorter[over] = time.perf_counter() - start
  return ours, shorter


def patching_table(o) -> str:
  """The table, for launch.bench's options `o` (the model's preset, seq_len, peer_python)."""
  cfg = bench_models.model_config(o)
  params = bench_models.params_of(cfg)
  header = bench_models.header(o, f"patching sweeps, one pair of {o.seq_len} tokens", cfg).replace(
    f", median of {o.repeats}", ""
  )
  model = gpt.GPT(cfg)
  clean = jax.random.randint(jax.random.key(1), (1, o.seq_len), 0, cfg.vocab_size)
  corrupt = clean.at[:, o.seq_len // 2].set((clean[0, o.seq_len // 2] + 1) % cfg.vocab_size)

  def metric(logits_BxTxV):
    return (logits_BxTxV[:, -1, ANSWER] - logits_BxTxV[:, -1, WRONG]).mean()

  ours, shorter = _ours(model, params, clean, corrupt, metric)
  with tempfile.TemporaryDirectory() as tmp:
    export_hf_gpt2(cfg, params, Path(tmp))
    python = peer_env.peer_python(o.peer_python, peer_env.LENS_REQUIREMENTS, "lens-peer-venv")
    spec = {
      "model_dir": tmp,
      "clean": clean[0].tolist(),
      "corrupt": corrupt[0].tolist(),
      "answer": ANSWER,
      "wrong": WRONG,
    }
    theirs = peer_env.run_peers(python, spec, "lens_peer.py")
  rows = []
  for over, name in (("positions", "resid_pre, layer x position"), ("heads", "z, layer x head")):
    seconds, values = ours[over]
    peer_seconds, peer_values = theirs[over]["seconds"], np.asarray(theirs[over]["values"])
    difference = float(np.abs(values - peer_values).max())
    rows.append(
      [
        name,
        f"{values.size}",
        f"{seconds:.1f}",
        f"{shorter[over]:.1f}",
        f"{peer_seconds:.1f}",
        f"{peer_seconds / seconds:.2f}x",
        f"{difference:.1e}",
      ]
    )
  table = benchmark.table(
    [
      "sweep",
      "patched runs",
      "ours s (1st call)",
      f"ours s, then {o.seq_len - 3} tokens",
      "TransformerLens s",
      "ours faster (1st call)",
      "max |difference|",
    ],
    rows,
  )
  return header + f"\n{table}\npeer: {theirs['versions']}, {theirs['threads']} threads; ours: jax {jax.__version__}"
