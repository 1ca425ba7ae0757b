"""`launch.bench --what=ceilings`: what this machine can do at all: a bfloat16 matrix product's FLOP/s and a
copy's bytes a second, beside the device's data sheet.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformer import benchmark, metrics


def ceilings_table(o) -> str:
  """The chip's two ceilings, measured: a large bf16 matrix product's FLOP/s (random data: zeros
  run faster) and a large copy's memory bandwidth (bytes read plus bytes written), beside the data
  sheet's peaks that `metrics` divides by. A step's MFU over the measured product rate says how far
  it is from what the chip's matrix units really deliver."""
  device = jax.devices()[0]
  accelerator = device.platform != "cpu"
  n, copy_bytes = (8192, 2**32) if accelerator else (1024, 2**27)
  a_NxN, b_NxN = (jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16) for i in (0, 1))
  x_N = jax.random.normal(jax.random.key(2), (copy_bytes // 4,), jnp.float32)
  matmul, copy = jax.jit(lambda a, b: a @ b), jax.jit(lambda x: x + 1)  # + 1: a plain copy could be elided
  # Each timed sample is `calls` launches waited on once: one ~1 ms launch waited on alone would
  # count the host's dispatch and wait too (an 8192^3 product on an H200 read 664 TFLOP/s that way).
  calls = 20 if accelerator else 2

  def seconds(fn, *args):
    def sample():
      for _ in range(calls):  # each result freed when the next replaces it: 20 copies would not fit
        result = fn(*args)
      return result

    return benchmark.median_seconds(sample, repeats=o.repeats, warmup=2) / calls

  matmul_s, copy_s = seconds(matmul, a_NxN, b_NxN), seconds(copy, x_N)
  peak_flops, peak_bytes = metrics.peak_flops(device), metrics.peak_bandwidth(device)
  rows = [
    [
      f"bf16 product {n}x{n}x{n}",
      "TFLOP/s",
      f"{2 * n**3 / matmul_s / 1e12:.3g}",
      f"{peak_flops / 1e12:.0f}" if peak_flops else "n/a",
    ],
    [
      f"float32 x + 1 over {copy_bytes / 2**30:g} GiB (read + write)",
      "TB/s",
      f"{2 * copy_bytes / copy_s / 1e12:.3g}",
      f"{peak_bytes / 1e12:.2f}" if peak_bytes else "n/a",
    ],
  ]
  return (
    f"ceilings of 1x {device.device_kind}, jax {jax.__version__}, median of {o.repeats} samples of "
    f"{calls} calls\n" + benchmark.table(["what", "unit", "measured", "data sheet"], rows)
  )
