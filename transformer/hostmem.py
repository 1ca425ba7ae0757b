"""Host memory: keep the blocks XLA:CPU frees for its next call, instead of giving them back.

XLA:CPU allocates all of a program's temporary buffers as one block at every call (the README main
job's training step: 327 MB), from a thread of its pool, and frees it when the call ends. glibc
serves a block over 32 MB from a fresh `mmap` whenever the thread has its own arena, and unmaps
it on free, so every call faults all of the block's pages in again: ~84,000 minor faults a step
for the main job, a third of the step on a 2-core Zen 3 VM. With one arena, no `mmap` and no
trimming of the heap's top, the block comes back from the heap at the next call, its pages
already mapped (0 faults a step after the first).

The price: the process keeps its peak heap (a freed block serves later allocations; the memory is
not returned to the OS while the process lives), and every thread allocates from the one arena,
which costs a little under many threads that allocate often. `TRANSFORMER_KEEP_HOST_MEMORY=0`
leaves glibc's defaults.

glibc picks a thread's arena at its first allocation, so this must run before any thread but the
main one allocates: `transformer/__init__.py` calls it first thing. Importing numpy or jax before is
fine; a computation (which starts XLA's threads) before is too late for them.
"""

import ctypes
import os
import platform

ENV = "TRANSFORMER_KEEP_HOST_MEMORY"
# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def keep_freed_blocks() -> bool:
  """One malloc arena, no mmap, no trimming (see the module docstring). True when glibc took all
  three settings; False on another C library, or when turned off with TRANSFORMER_KEEP_HOST_MEMORY=0."""
  if os.environ.get(ENV, "1") == "0" or platform.libc_ver()[0] != "glibc":
    return False
  mallopt = ctypes.CDLL(None).mallopt
  mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  # The trim threshold is a size_t inside glibc: -1 is its largest value, never trim.
  return all(mallopt(param, value) == 1 for param, value in
             ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1)))
