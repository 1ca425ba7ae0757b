"""launch/bench.py and transformer.benchmark: the programs run and print their tables (speed itself
is measured there, never asserted in tests)."""

import os

import pytest

from conftest import run_module


def test_benchmark_programs_print_their_tables():
  """launch.bench runs (smoke: the tiny preset, one repeat); speed itself is never asserted."""
  proc = run_module("launch.bench", "--what=generate", "--preset=cpu-tiny", "--vocab_size=97", "--batch_sizes=1,2",
                    "--new_tokens=4", "--prompt_len=3", "--repeats=1")
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert "KV-cache generation" in lines[0] and lines[1].split() == ["batch", "prompt", "new", "ms/call",
                                                                    "new", "tokens/s"]
  assert [line.split()[0] for line in lines[3:]] == ["1", "2"]
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
