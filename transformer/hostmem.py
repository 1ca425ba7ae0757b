"""Host memory: keep the block XLA:CPU frees after a call for its next call, mapped.

XLA:CPU allocates all of a program's temporary buffers as one block at every call (hundreds of MB for a
small GPT's training step), from a thread of its pool, and frees it when the call ends. glibc serves a
block that large with a fresh `mmap`, and unmaps it on free, unless it comes from the main arena with
`mmap` turned off: a thread's own arena is made of heaps of at most 64 MB, so a larger block is always
mmapped there. Each call then faults all of the block's pages in again, a minor fault a page, which can
cost a small model a large part of its step. So: one arena (every thread allocates from the main heap),
no `mmap`, no trimming of the heap's top. A freed block then serves the next call with its pages mapped.
For the first calls the heap still grows (small allocations take pieces of a freed block, and the next
block comes from fresh memory), so a few of a process's first steps still fault, then none. (With a
second arena, steps whose block a thread of that arena allocated would still fault.)

The price: the process keeps its peak heap (freed memory serves later allocations but is not given
back to the OS while the process lives), and every thread allocates from the one arena, which costs
a little where many threads allocate often. `TRANSFORMER_KEEP_HOST_MEMORY=0` leaves glibc's
defaults.

glibc picks a thread's arena at its first allocation, so this must run before any thread but the
main one allocates: the launch programs call it first thing (`transformer.cli.run`); importing
`transformer` does not, so that a library or notebook that imports it keeps its allocator unless it
calls `keep_freed_blocks()` itself. Importing numpy or jax before is
fine; a computation before (which starts XLA's threads) is too late, and so may be a process whose
other threads have allocated already (a Jupyter kernel's), where glibc may have fixed its number of
arenas.
"""

import ctypes
import importlib.metadata
import importlib.util
import os
import platform

ENV = "TRANSFORMER_KEEP_HOST_MEMORY"
# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def keep_freed_blocks() -> bool:
  """One malloc arena, no mmap, no trimming (see the module docstring). True when glibc took all
  three settings; False on another C library, where JAX will run on an accelerator, or when turned
  off with TRANSFORMER_KEEP_HOST_MEMORY=0."""
  if os.environ.get(ENV, "1") == "0" or platform.libc_ver()[0] != "glibc" or not jax_runs_on_cpu():
    return False
  mallopt = ctypes.CDLL(None).mallopt
  mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  # The trim threshold is a size_t inside glibc: -1 is its largest value, never trim. A list, not a
  # generator: every setting is tried even when one is refused.
  return all(
    [mallopt(param, value) == 1 for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))]
  )


def jax_runs_on_cpu() -> bool:
  """Whether JAX will pick its CPU backend, decided before it starts (no backend is initialised):
  JAX_PLATFORMS when set, else no accelerator plugin installed (a CUDA/ROCm plugin registers under
  `jax_plugins`, a TPU runtime is `libtpu`). On an accelerator the temporary buffers live in device
  memory, so the settings above gain nothing there, and they would make the driver's, the compiler's
  and the autotuner's many host threads share one arena without mmap."""
  platforms = os.environ.get("JAX_PLATFORMS", "").strip()
  if platforms:
    return platforms.split(",")[0].strip() == "cpu"
  plugins = importlib.util.find_spec("jax_plugins") or list(importlib.metadata.entry_points(group="jax_plugins"))
  return not (plugins or importlib.util.find_spec("libtpu"))


def available_bytes() -> int | None:
  """The memory the kernel says a new allocation can take without swapping (/proc/meminfo's MemAvailable);
  None where it does not say."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  return None
