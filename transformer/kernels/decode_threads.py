"""Decoding on every core of a CPU: a batch split into parts, each decoded by its own thread, and the
XLA:CPU options of the sampler's program (config.model.kernels: the CPU's forms; the reference
decodes the whole batch in one call, with XLA's default options). The tokens, sampled ones too, are
those of the whole batch decoded at once (tests/test_kernels.py).

Why threads: XLA:CPU runs a program's kernels one after another and spreads only a large product
over the cores, and a decoding step of a small model is ~120 kernels of a few microseconds each, so
one core did nearly all of it. Calls of compiled programs from several threads run at once, one on
each core; one thread dispatching them all runs them one after the other, as one program over two
halves does.

Why the options: a decoding step of a small model is many small elementwise kernels (LayerNorm,
GELU's tanh), which LLVM vectorises at 256 bits by default; 512-bit vectors take half the
instructions for them. Products stay in XLA:CPU's default library (YNNPACK).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent import futures

import jax

from transformer.kernels import argmax, decode_head

# XLA:CPU's options for the sampler's program.
CPU_OPTIONS = {"xla_cpu_prefer_vector_width": 512}

# The fewest prompts a part of a split batch gets: MIN_PART_ROWS; with a vocabulary of
# argmax.LARGE_VOCAB or more, LARGE_VOCAB_PART_ROWS (with fewer, each part computes the tied head from
# its own transposed copy of the embedding: kernels.decode_head); with an output head read from
# memory at every step (`decode_head.streamed_head`), STREAMED_HEAD_PART_ROWS (each part reads it).
MIN_PART_ROWS = 4
LARGE_VOCAB_PART_ROWS = 16
STREAMED_HEAD_PART_ROWS = 32


def cpu_threads(devices: Sequence) -> int:
  """On how many threads at once independent decoding calls run: one per core this process may run
  on where they decode on one CPU device, else 1 (several devices split the batch over them)."""
  if len(devices) > 1 or devices[0].platform != "cpu":
    return 1
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads(forms: str, mesh) -> int:
  """On how many threads a decoder runs its independent calls: `cpu_threads` of the mesh's devices
  (default: the first device) with the CPU's forms (`forms`: kernels.resolve of config.model.kernels),
  else 1."""
  if forms != "cpu":
    return 1
  return cpu_threads(list(mesh.devices.flat) if mesh is not None else jax.devices()[:1])


def parts(vocab_size: int, d_model: int, dtype: str, batch_size: int, threads: int) -> int:
  """Into how many parts a batch of `batch_size` prompts is split, each decoded by its own thread:
  one per thread, each of at least MIN_PART_ROWS prompts (more with a large vocabulary or a head of
  `vocab_size` x `d_model` in `dtype` streamed from memory)."""
  rows = MIN_PART_ROWS
  if vocab_size >= argmax.LARGE_VOCAB:
    rows = LARGE_VOCAB_PART_ROWS
  if decode_head.streamed_head(vocab_size, d_model, dtype):
    rows = STREAMED_HEAD_PART_ROWS
  return max(1, min(threads, batch_size // rows))


def on_threads(fn: Callable, items: Sequence, threads: int) -> list:
  """[fn(item) for item in items], on up to `threads` threads at once."""
  if threads <= 1 or len(items) <= 1:
    return [fn(item) for item in items]
  with futures.ThreadPoolExecutor(min(threads, len(items))) as pool:
    return list(pool.map(fn, items))
