"""JAX's persistent compilation cache, on by default: a second run of a program on the same shapes reads what the
first compiled instead of compiling it again (on a CPU, compiling is most of a tool's first call).

The cache is a per-user directory: $TRANSFORMER_COMPILATION_CACHE, else $XDG_CACHE_HOME/transformer/xla, else
~/.cache/transformer/xla. TRANSFORMER_COMPILATION_CACHE=off (or a launch program's --compilation_cache=off) turns
it off; a cache the process already set (JAX_COMPILATION_CACHE_DIR, or jax.config) is left as it is. JAX keys an
entry by the program, the jax version and the compiler's flags, so an entry is only read by the same compilation.
Every program is kept however fast it compiled: this codebase's tools compile many small ones.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

OFF = ("off", "0", "false", "none", "")
ENV = "TRANSFORMER_COMPILATION_CACHE"


def default_dir() -> Path:
  base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
  return Path(base) / "transformer" / "xla"


def enable(directory: str | os.PathLike | None = None) -> Path | None:
  """Turns the cache on in `directory` (None: $TRANSFORMER_COMPILATION_CACHE, else `default_dir()`; "off": turns
  it off), unless the process set its own; returns the directory in use (None: off)."""
  own = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  if own:  # the process's own choice (the test suite's, a user's)
    return Path(own)
  chosen = os.environ.get(ENV, None) if directory is None else str(directory)
  if chosen is not None and chosen.strip().lower() in OFF:
    jax.config.update("jax_compilation_cache_dir", None)
    return None
  path = Path(chosen).expanduser() if chosen else default_dir()
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError:  # a read-only home: compile as without a cache
    return None
  jax.config.update("jax_compilation_cache_dir", str(path))
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  if "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES" not in os.environ:
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path
