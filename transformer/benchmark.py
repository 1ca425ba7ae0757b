"""Timing helpers for benchmarks (launch/bench/__init__.py): medians over repeats, printed as tables.

Never used by tests: speed is measured here, not asserted. (The PyTorch peers that launch/bench/__init__.py
compares against are set up by launch/bench/peer_env.py.)
"""

from __future__ import annotations

import collections
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1, warmup_seconds: float = 0.0) -> float:
  """Median wall time of `fn()` (its result blocked on), after untimed calls: `warmup` of them (the
  first compiles), then more until `warmup_seconds` have passed since the first began."""
  start, calls = time.perf_counter(), 0
  while calls < warmup or time.perf_counter() - start < warmup_seconds:
    jax.block_until_ready(fn())
    calls += 1
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def op_profile(fn: Callable[[], object], compiled_text: str, calls: int = 3) -> list[list]:
  """Where a compiled program's time goes: `fn()` run `calls` times under `jax.profiler.trace`, the
  trace's XLA op events summed by HLO instruction, largest first. Rows: [HLO op, what it computes
  (the JAX operation recorded in `compiled_text`'s metadata), ms per call, share of the ops'
  total]. On an accelerator the device's kernels are counted; on a CPU the XLA threads' thunks
  (thunks that run in parallel each count their own time). A product XLA:CPU leaves to Eigen (a
  plain `dot` in the optimised HLO, not a library fusion) counts only until it is handed to the
  thread pool, where it runs on: the trace's `end: dot.N` event says when it finished."""
  from jax.profiler import ProfileData

  jax.block_until_ready(fn())  # compiled and warm before the trace
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      for _ in range(calls):
        jax.block_until_ready(fn())
    profile = ProfileData.from_file(str(next(Path(trace_dir).rglob("*.xplane.pb"))))
  planes = list(profile.planes)
  device_planes = [p for p in planes if p.name.startswith("/device:")]
  seconds = collections.Counter()
  for plane in device_planes or [p for p in planes if p.name == "/host:CPU"]:
    for line in plane.lines:
      for event in line.events:
        op = dict(event.stats).get("hlo_op")
        if op:
          seconds[op] += event.duration_ns * 1e-9
  what = _per_instruction(compiled_text, r"metadata=\{op_name")  # name -> JAX operation
  total = sum(seconds.values()) or 1.0
  return [
    [op, _short_op_name(what.get(op, "")), s / calls * 1000, f"{s / total:.1%}"] for op, s in seconds.most_common()
  ]


def library_calls(compiled_text: str) -> dict[str, str]:
  """HLO op -> the library routine it calls (`custom_call_target`: cuBLAS products, cuDNN attention).
  A profile grouped by JAX operation alone misnames some: XLA folds the transpose that autodiff puts
  after a kernel's gradient product into the product, which then carries the transpose's name (GPT-2's
  MLP kernel-gradient products read as "transpose")."""
  return _per_instruction(compiled_text, "custom_call_target")


def _per_instruction(compiled_text: str, attribute: str) -> dict[str, str]:
  """HLO instruction -> the value of `attribute` (a regex) on its line: "%fusion.12 = ...
  metadata={op_name="jit(step)/.../dot_general" ...}" -> {"fusion.12": "jit(step)/.../dot_general"}."""
  return dict(re.findall(rf'%?([\w.\-]+) = [^\n]*?{attribute}="([^"]*)"', compiled_text))


def _short_op_name(op_name: str, keep: int = 4) -> str:
  """The last `keep` parts of a JAX op_name path ("jit(f)/jvp(GPT)/block_0/attn/dot_general"), less
  the "cond/branch_N_fun" that a `jax.lax.platform_dependent` or `lax.cond` puts in it."""
  parts = [p for p in op_name.split("/") if p != "cond" and not re.fullmatch(r"branch_\d+_fun", p)]
  return "/".join(parts[-keep:])


def table(headers: list[str], rows: list[list]) -> str:
  """A plain-text table with right-aligned columns."""
  cells = [headers] + [[f"{c:,.1f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
  widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
  line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))
  return "\n".join([line(cells[0]), line(["-" * w for w in widths])] + [line(r) for r in cells[1:]])
