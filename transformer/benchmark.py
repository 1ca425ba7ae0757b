"""Timing helpers for benchmarks (launch/bench.py): medians over repeats, printed as tables.

Never used by tests: speed is measured here, not asserted.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import jax


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
  """Median wall time of `fn()` (its result blocked on), after `warmup` untimed calls (compiles)."""
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def table(headers: list[str], rows: list[list]) -> str:
  """A plain-text table with right-aligned columns."""
  cells = [headers] + [[f"{c:,.1f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
  widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
  line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))
  return "\n".join([line(cells[0]), line(["-" * w for w in widths])] + [line(r) for r in cells[1:]])
