"""launch/bench/__init__.py and transformer.benchmark: the programs run and print their tables (speed itself
is measured there, never asserted in tests)."""

import os
import subprocess
import sys

import pytest

from conftest import REPO, run_module


@pytest.mark.slow
def test_benchmark_programs_print_their_tables(tmp_path):
  """launch.bench runs (smoke: the tiny preset, one repeat), several benchmarks in one process, each
  table after a blank line; speed itself is never asserted."""
  proc = run_module(
    "launch.bench",
    *("--what=generate", "--what=train", "--what=profile", "--what=mechanisms", "--what=ceilings", "--what=prepare"),
    "--prepare_mb=0.3",
    f"--prepare_dir={tmp_path}",
    "--preset=cpu-tiny",
    "--vocab_size=97",
    "--batch_sizes=1,2",
    "--new_tokens=4",
    "--prompt_len=3",
    "--seq_len=16",
    "--train_batch=2",
    "--remat_policies=dots",
    "--scan_layers=false,true",
    "--top_ops=1000",  # every op: a tiny step's times are noise
    "--repeats=1",
    "--train_warmup_s=0",
  )
  assert proc.returncode == 0, proc.stderr
  tables = [chunk.splitlines() for chunk in proc.stdout.strip().split("\n\n")]
  table = lambda title: next(t for t in tables if t[0].startswith(title))
  generate = table("KV-cache generation")
  assert generate[1].startswith("weights")
  assert generate[2].split() == [
    "batch",
    "prompt",
    "new",
    "ms/call",
    "ms/token",
    "new",
    "tokens/s",
  ]  # no roofline on a CPU
  assert [line.split()[0] for line in generate[4:]] == ["1", "2"]
  train = table("training step, seq 16")
  rows = [line.split()[:3] for line in train[3:]]
  assert rows == [["False", "dots", "1"], ["False", "dots", "2"], ["True", "dots", "1"], ["True", "dots", "2"]]
  assert all(line.split()[-1] == "n/a" for line in train[3:])  # no MFU without a known peak
  assert "layer_0/attn/qkv/dot_general" in "\n".join(table("training step by XLA op"))  # ops named by what they compute
  assert [line.split()[0] for line in table("attention mechanisms")[3:]] == [
    "dot_product",
    "synthesizer_dense",
    "synthesizer_random",
    "synthesizer_fixed_random",
  ]
  rows = table("ceilings of")[3:]
  assert [row.split()[:2] for row in rows] == [["bf16", "product"], ["float32", "x"]]
  assert all(float(row.split()[-2]) > 0 and row.split()[-1] == "n/a" for row in rows)  # no data sheet for a CPU
  prepare = table("prepare: launch.prepare --tokenizer=gpt2")
  assert prepare[1].split()[:3] == ["MB", "tokens", "tiktoken"] and prepare[3].split()[0] == "0"  # 0.3 MB
  assert (
    prepare[-1].startswith("training loader (windows, 64 x 1024 tokens a batch") and "x what a GPT-2" in prepare[-1]
  )
  assert (tmp_path / "prepared" / "manifest.json").exists()


def test_a_profile_names_library_calls_by_their_routine():
  """A product XLA folded a transpose into carries the transpose's JAX name; its routine says what it is."""
  from transformer import benchmark

  hlo = (
    "  %custom-call.123 = (bf16[768,3072]{1,0}, s8[33554432]{0}) custom-call(%a, %b), "
    'custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/mlp/fc/transpose"}\n'
    "  %loop_add_fusion.3 = bf16[64,768]{1,0} fusion(%c, %d), kind=kLoop, calls=%fused_add.3\n"
  )
  assert benchmark.library_calls(hlo) == {"custom-call.123": "__cublas$lt$matmul"}


@pytest.mark.skipif(
  not os.environ.get("TRANSFORMER_TORCH_PYTHON"),
  reason="set TRANSFORMER_TORCH_PYTHON to a python with torch + transformers",
)
def test_benchmark_against_hugging_face_runs():
  proc = run_module(
    "launch.bench",
    "--what=vs_hf",
    "--preset=cpu-tiny",
    "--batch_sizes=1",
    "--new_tokens=4",
    "--prompt_len=3",
    "--train_batch=2",
    "--seq_len=16",
    "--repeats=1",
    "--train_warmup_s=0",
    f"--peer_python={os.environ['TRANSFORMER_TORCH_PYTHON']}",
  )
  assert proc.returncode == 0, proc.stderr
  assert "ours/HF" in proc.stdout and "train step" in proc.stdout and "generate" in proc.stdout


@pytest.mark.skipif(
  not os.environ.get("TRANSFORMER_TORCH_PYTHON"),
  reason="set TRANSFORMER_TORCH_PYTHON to a python with torch + transformers",
)
def test_an_open_family_beside_transformers_runs_and_generates_the_same_tokens():
  proc = run_module(
    "launch.bench",
    "--what=hf",
    "--hf_shape=pythia-70m",
    "--batch_sizes=1",
    "--new_tokens=4",
    "--prompt_len=3",
    "--repeats=1",
    f"--peer_python={os.environ['TRANSFORMER_TORCH_PYTHON']}",
  )
  assert proc.returncode == 0, proc.stderr
  assert "greedy tokens of row 0: the same" in proc.stdout and "prefill" in proc.stdout


@pytest.mark.slow  # writes a 140 MB checkpoint and opens it in a process of its own
def test_opening_a_checkpoint_takes_about_its_size_in_host_memory(tmp_path):
  proc = run_module("launch.bench", "--what=load", "--hf_shape=pythia-70m", f"--load_dir={tmp_path}")
  assert proc.returncode == 0, proc.stderr
  [row] = [line.split() for line in proc.stdout.splitlines() if line.startswith("pythia-70m")]
  # A smoke bound: at 70M parameters the transient copies of the largest tensors (the two embeddings)
  # weigh; the goal's measurement is the Llama 3.2 1B shape's table (launch/BENCHMARKS.md).
  assert 0.5 < float(row[-2].rstrip("x")) < 2.5


@pytest.mark.skipif(
  not os.environ.get("TRANSFORMER_LENS_PYTHON"),
  reason="set TRANSFORMER_LENS_PYTHON to a python with torch, transformers and transformer-lens",
)
def test_patching_beside_transformer_lens_runs_and_agrees():
  proc = run_module(
    "launch.bench",
    "--what=patching",
    "--preset=cpu-tiny",
    "--seq_len=12",
    f"--peer_python={os.environ['TRANSFORMER_LENS_PYTHON']}",
  )
  assert proc.returncode == 0, proc.stderr
  rows = [line.split() for line in proc.stdout.splitlines() if "layer x" in line]
  assert len(rows) == 2 and all(float(row[-1]) < 1e-4 for row in rows), proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(
  not os.environ.get("TRANSFORMER_CT_PYTHON"), reason="set TRANSFORMER_CT_PYTHON to a python with circuit-tracer"
)
def test_an_attribution_graph_beside_circuit_tracer_runs_and_agrees():
  proc = run_module(
    "launch.bench",
    "--what=graph",
    "--preset=cpu-tiny",
    "--seq_len=12",
    "--repeats=2",
    f"--peer_python={os.environ['TRANSFORMER_CT_PYTHON']}",
  )
  assert proc.returncode == 0, proc.stderr
  assert "the same active features: True" in proc.stdout, proc.stdout
  apart = float(proc.stdout.split("adjacencies apart by ")[1].split()[0])
  assert apart < 1e-4, proc.stdout


@pytest.mark.slow
def test_the_accelerator_check_runs_end_to_end_on_a_cpu(tmp_path):
  """The prepared accelerator check (--what=accelerator), shrunk to a smoke run on this CPU: its test
  selection in a pytest process, the cuDNN row skipped and said so, a planned and timed training
  step, decoding at each batch size; each row printed as it is measured, then one table, and the
  same rows as JSON."""
  import json

  out = tmp_path / "check.json"
  proc = run_module(
    "launch.bench",
    "--what=accelerator",
    "--check_train=cpu-tiny",
    "--check_decode=cpu-tiny",
    "--check_tests=tests/test_kernels.py -k bf16_gradients",
    "--batch_sizes=1,2",
    "--new_tokens=4",
    "--prompt_len=3",
    "--repeats=1",
    f"--check_json={out}",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.startswith("[") and "| tests/test_kernels.py -k bf16_gradients | 1 passed" in proc.stdout
  assert "\naccelerator check on 1 x cpu" in proc.stdout
  rows = json.loads(out.read_text())["rows"]
  assert [r["check"] for r in rows] == [
    "tests",
    "cuDNN, packed rows",
    *["train cpu-tiny, batch 8 x 64, remat none"] * 3,
    "decode cpu-tiny, batch 1, the kernels' loop",
    "decode cpu-tiny, batch 2, the kernels' loop",
    "decode cpu-tiny, batch 1, the stopping loop",
  ]
  assert rows[0]["ok"] is True and "1 passed" in rows[0]["measured"]
  assert rows[1]["measured"].startswith("skipped: cuDNN attention needs an NVIDIA GPU")
  assert rows[3]["measured"] == "n/a" and "MiB / n/a" in rows[4]["measured"]  # no peak FLOP/s or memory_stats on a CPU
  assert all(r["measured"] for r in rows)


@pytest.mark.slow
def test_a_table_is_a_function_of_its_options_callable_from_python():
  """What a notebook does: one table with the settings it changes (`bench.Options`), no flags parsed."""
  code = (
    "from launch import bench\n"
    "o = bench.Options(preset='cpu-tiny', vocab_size=64, batch_sizes=('2',), seq_len=32, repeats=1)\n"
    "assert o.check_train == ('gpt2', 'gpt2-medium')  # the flags' defaults\n"
    "print(bench.forward_table(o))\n"
  )
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.startswith("forward pass: cpu-tiny (") and "\n    2   32 " in proc.stdout
