"""launch/bench.py and transformer.benchmark: the programs run and print their tables (speed itself
is measured there, never asserted in tests)."""

import os
import subprocess
import sys

import pytest

from conftest import run_module


def test_benchmark_programs_print_their_tables():
  """launch.bench runs (smoke: the tiny preset, one repeat); speed itself is never asserted."""
  proc = run_module("launch.bench", "--what=generate", "--preset=cpu-tiny", "--vocab_size=97", "--batch_sizes=1,2",
                    "--new_tokens=4", "--prompt_len=3", "--repeats=1")
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert "KV-cache generation" in lines[0] and lines[1].startswith("weights")
  assert lines[2].split() == ["batch", "prompt", "new", "ms/call", "ms/token", "new", "tokens/s"]  # no roofline on a CPU
  assert [line.split()[0] for line in lines[4:]] == ["1", "2"]
  proc = run_module("launch.bench", "--what=train", "--preset=cpu-tiny", "--vocab_size=97", "--batch_sizes=2",
                    "--seq_len=16", "--remat_policies=none,dots", "--scan_layers=false,true", "--repeats=1")
  assert proc.returncode == 0, proc.stderr
  rows = [line.split()[:3] for line in proc.stdout.splitlines()[3:]]
  assert rows == [["False", "none", "2"], ["False", "dots", "2"], ["True", "none", "2"], ["True", "dots", "2"]]
  assert all(line.split()[-1] == "n/a" for line in proc.stdout.splitlines()[3:])  # no MFU without a known peak
  proc = run_module("launch.bench", "--what=profile", "--preset=cpu-tiny", "--vocab_size=97", "--train_batch=2",
                    "--seq_len=16", "--repeats=1")
  assert proc.returncode == 0, proc.stderr
  assert "dot_general" in proc.stdout and "layer_0/attn" in proc.stdout  # ops named by what they compute
  proc = run_module("launch.bench", "--what=mechanisms", "--preset=cpu-tiny", "--vocab_size=97", "--train_batch=2",
                    "--seq_len=16", "--repeats=1")
  assert proc.returncode == 0, proc.stderr
  assert [line.split()[0] for line in proc.stdout.splitlines()[3:]] == [
      "dot_product", "synthesizer_dense", "synthesizer_random", "synthesizer_fixed_random"]


@pytest.mark.skipif(not os.environ.get("TRANSFORMER_TORCH_PYTHON"),
                    reason="set TRANSFORMER_TORCH_PYTHON to a python with torch + transformers")
def test_benchmark_against_hugging_face_runs():
  proc = run_module("launch.bench", "--what=vs_hf", "--preset=cpu-tiny", "--batch_sizes=1", "--new_tokens=4",
                    "--prompt_len=3", "--train_batch=2", "--seq_len=16", "--repeats=1",
                    f"--peer_python={os.environ['TRANSFORMER_TORCH_PYTHON']}")
  assert proc.returncode == 0, proc.stderr
  assert "ours/HF" in proc.stdout and "train step" in proc.stdout and "generate" in proc.stdout


_FAULTS = """
import resource, sys
from transformer import cli
if sys.argv[1] == "keep":
  cli.keep_freed_host_memory()
import jax, jax.numpy as jnp
f = jax.jit(lambda x: (x @ x + 1.0) @ x)  # 16 MB temporaries at every call
x = jnp.ones((2048, 2048))
for _ in range(3):
  f(x).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
  f(x).block_until_ready()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_kept_host_memory_is_not_faulted_in_again():
  """cli.keep_freed_host_memory (every launch program calls it): a computation's buffers come back
  from freed memory instead of fresh pages from the OS (minor page faults per call)."""
  faults = {mode: float(subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True,
                                       check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}).stdout)
            for mode in ("default", "keep")}
  assert faults["default"] > 2000  # 16 MB in 4 KB pages, at least once a call
  assert faults["keep"] < faults["default"] / 2, faults
