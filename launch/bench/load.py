"""`launch.bench --what=load`: the host memory that opening a big checkpoint takes.

A random checkpoint of a published shape (--hf_shape; Llama 3.2 1B's for the table in
launch/BENCHMARKS.md) is written once in bfloat16 (formats.export_hf, as the Hub stores it) into
--load_dir, then opened in a fresh process by `inference.load(hf=DIR)`: every param read in its stored
dtype, one safetensors file at a time, and put on its shards. Reported: the file's size, the process's
peak resident memory above what it held before the load (its own jax and numpy), the ratio of the two,
and the seconds the load took. The goal is a peak within 1.3 times the file: no float32 copy of the
model on the host.

  python -m launch.bench --what=load --hf_shape=llama3.2-1b --load_dir=/tmp/llama-1b
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from experiments import shapes
from transformer import benchmark
from transformer.models import formats
from transformer.models.gpt import GPT


def write_checkpoint(shape: str, directory: Path) -> Path:
  """A random `shape` checkpoint in bfloat16 (kept if `directory` already holds one of this shape)."""
  stamp = directory / "bench_shape.txt"
  if stamp.exists() and stamp.read_text() == shape:
    return directory
  cfg = shapes.shape(shape, dtype="bfloat16", param_dtype="bfloat16")
  init = jax.jit(lambda: GPT(cfg).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"])
  formats.export_hf(cfg, init(), directory, shapes.SHAPES[shape]["model_type"])
  stamp.write_text(shape)
  return directory


def measure(directory: str) -> dict:
  """In this process (a fresh one): peak resident bytes above the baseline while `inference.load` opens
  `directory`, and its seconds."""
  from transformer import inference  # noqa: F401  (imported before the baseline is taken)

  baseline = peak_rss()
  start = time.perf_counter()
  trained = inference.load(hf=directory)
  jax.block_until_ready(trained.params)
  seconds = time.perf_counter() - start
  return {"peak_bytes": peak_rss() - baseline, "seconds": seconds, "baseline_bytes": baseline}


def peak_rss() -> int:
  """This process's peak resident bytes so far: /proc's VmHWM, which a new program starts afresh
  (getrusage's ru_maxrss keeps the forking parent's peak across exec)."""
  for line in Path("/proc/self/status").read_text().splitlines():
    if line.startswith("VmHWM:"):
      return int(line.split()[1]) * 1024
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # (no /proc: kilobytes, Linux's unit)


def load_table(o) -> str:
  directory = Path(o.load_dir or tempfile.mkdtemp(prefix="bench-load-"))
  write_checkpoint(o.hf_shape, directory)
  file_bytes = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
  proc = subprocess.run(
    [sys.executable, "-m", "launch.bench.load", str(directory)], capture_output=True, text=True, check=False
  )
  if proc.returncode:
    raise RuntimeError(f"the load failed:\n{proc.stderr[-3000:]}")
  got = json.loads(proc.stdout.splitlines()[-1])
  gib = lambda n: f"{n / 2**30:.2f} GiB"
  rows = [
    [
      o.hf_shape,
      gib(file_bytes),
      gib(got["peak_bytes"]),
      f"{got['peak_bytes'] / file_bytes:.2f}x",
      f"{got['seconds']:.1f}",
    ]
  ]
  header = (
    f"opening a bfloat16 checkpoint with inference.load(hf=...) on {jax.device_count()}x {jax.devices()[0].device_kind}"
  )
  return header + "\n" + benchmark.table(["shape", "safetensors", "peak RSS added", "peak / file", "seconds"], rows)


if __name__ == "__main__":
  print(json.dumps(measure(sys.argv[1])))
