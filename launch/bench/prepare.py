"""`launch.bench --what=prepare`: launch.prepare on Shakespeare repeated to each size, against raw tiktoken on
the same text (the ceiling of tokenizing alone).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from transformer import benchmark, data, tokenizers
from transformer.data import pipeline
from transformer.data.prepare import BATCH_CHARS


def _repeated_text(path: Path, megabytes: float) -> Path:
  """A text file of `megabytes` MB: the Shakespeare corpus's files, repeated, cut at a line end."""
  want = int(megabytes * 1e6)
  if path.exists() and path.stat().st_size >= want:
    return path
  corpus = b"".join(f.read_bytes() for f in data.named_source("shakespeare").files)
  with open(path, "wb") as f:
    for _ in range(want // len(corpus)):
      f.write(corpus)
    f.write(corpus[: corpus.rfind(b"\n", 0, want % len(corpus)) + 1])
  return path


def _raw_tiktoken_seconds(path: Path, threads: int) -> tuple[float, int]:
  """Seconds tiktoken's `encode_ordinary_batch` spends on the file's text (read as `launch.prepare`
  reads it: pieces of ~16 KB cut at line ends, 4 MB of them a call) on `threads` threads, and the
  token count. Only the calls are timed; reading is not."""
  encoding = tokenizers.get_tokenizer("gpt2").encoding
  seconds, tokens = 0.0, 0
  with open(path, encoding="utf-8") as f:
    while text := f.read(BATCH_CHARS) + f.readline():
      pieces, at = [], 0
      while at < len(text):
        end = text.find("\n", at + data.PrepareOptions().piece_chars) + 1 or len(text)
        pieces.append(text[at:end])
        at = end
      start = time.perf_counter()
      ids = encoding.encode_ordinary_batch(pieces, num_threads=threads)
      seconds += time.perf_counter() - start
      tokens += sum(map(len, ids))
  return seconds, tokens


def _prepare_process(path: Path, out_dir: Path) -> tuple[float, int]:
  """Wall seconds and peak RSS (bytes) of `python -m launch.prepare` on the file, a process of its own."""
  command = [sys.executable, "-m", "launch.prepare", f"--input_files={path}", "--tokenizer=gpt2"]
  command += [f"--output_dir={out_dir}"]
  shutil.rmtree(out_dir, ignore_errors=True)  # else an identical preparation is reused, not redone
  start = time.perf_counter()
  process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  _, status, usage = os.wait4(process.pid, 0)
  seconds = time.perf_counter() - start
  if os.waitstatus_to_exitcode(status):
    raise RuntimeError(f"{' '.join(command)} failed:\n{process.stderr.read().decode()[-2000:]}")
  return seconds, usage.ru_maxrss * 1024


def prepare_table(o) -> str:
  """launch.prepare (the whole program: start, sha256 of the input, reading, tokenizing on every core,
  writing) against tiktoken's bare batch encoding of the same text on the same cores, per file size;
  then the training loader's tokens/s on the largest preparation, against what a GPT-2 124M step
  consumes on an H200 (64 x 1,024 tokens every 121 ms, README "On accelerators": ~540k tokens/s)."""
  threads = os.cpu_count() or 1
  root = Path(o.prepare_dir or tempfile.mkdtemp(prefix="bench-prepare-"))
  root.mkdir(parents=True, exist_ok=True)
  rows = []
  for mb in map(float, o.prepare_mb):
    path = _repeated_text(root / f"shakespeare-{mb:g}MB.txt", mb)
    raw, prep, rss = [], [], []
    for _ in range(o.repeats):  # alternating: both sides in the same minutes
      seconds, tokens = _raw_tiktoken_seconds(path, threads)
      raw.append(seconds)
      seconds, peak = _prepare_process(path, root / "prepared")
      prep.append(seconds)
      rss.append(peak)
    size = path.stat().st_size
    raw_s, prep_s = statistics.median(raw), statistics.median(prep)
    rows.append(
      [
        f"{size / 1e6:,.0f}",
        f"{tokens / 1e6:,.1f}M",
        f"{size / raw_s / 1e6:.1f}",
        f"{size / prep_s / 1e6:.1f}",
        f"{tokens / prep_s / 1e6:.2f}M",
        f"{raw_s / prep_s:.2f}",
        f"{max(rss) / 2**20:,.0f}",
      ]
    )
  table = benchmark.table(
    ["MB", "tokens", "tiktoken MB/s", "prepare MB/s", "prepare tokens/s", "prepare / tiktoken", "peak RSS MB"], rows
  )
  prepared = data.load_prepared(root / "prepared")
  batch, seq_len = 64, 1024
  batches = pipeline.lm_train_dataset(prepared, seq_len=seq_len, global_batch=batch, seed=0)
  step = lambda: [batches[i] for i in range(20)]
  loader_s = benchmark.median_seconds(step, repeats=o.repeats) / 20
  loader = batch * seq_len / loader_s
  return (
    f"prepare: launch.prepare --tokenizer=gpt2 (a process each: start to exit) vs tiktoken "
    f"encode_ordinary_batch alone, {threads} threads each, median of {o.repeats}\n{table}\n"
    f"training loader (windows, {batch} x {seq_len} tokens a batch, one thread): {loader / 1e6:.2f}M tokens/s, "
    f"{loader / 540e3:.1f}x what a GPT-2 124M step on an H200 reads (~540k tokens/s)"
  )
