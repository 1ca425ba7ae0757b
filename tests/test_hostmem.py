"""transformer/hostmem.py: an XLA:CPU program's temporary block stays mapped from one call to the next."""

import json
import platform
import subprocess
import sys

import pytest

from transformer import hostmem

from conftest import REPO

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings")

# A fresh process (glibc picks the arenas at the threads' first allocations): a program with a 48 MB
# temporary (the optimisation barrier keeps sin(x) materialised) called 40 times, the minor page
# faults of each call.
_FAULTS_PER_CALL = """
import json, os, resource
from transformer import hostmem
if os.environ["TRANSFORMER_KEEP_HOST_MEMORY"] == "import":  # import the library whole, as another program would
  import transformer.inference, transformer.plan, transformer.interp.probes, transformer.train
else:
  hostmem.keep_freed_blocks()
import jax, jax.numpy as jnp
x = jax.jit(lambda: jnp.ones((4096, 3072)))()
f = jax.jit(lambda x: jax.lax.optimization_barrier(jnp.sin(x) * 2).sum())
faults = []
for _ in range(40):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  f(x).block_until_ready()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""
_TEMP_PAGES = 4096 * 3072 * 4 // 4096  # 12,288


def _faulting_calls(keep: str) -> int:
  """Of the 40 calls, how many faulted in (most of) a 48 MB block."""
  env = {"TRANSFORMER_KEEP_HOST_MEMORY": keep, "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
  out = subprocess.run(
    [sys.executable, "-c", _FAULTS_PER_CALL], cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=True
  ).stdout
  return sum(faults > _TEMP_PAGES * 0.8 for faults in json.loads(out.splitlines()[-1]))


@pytest.mark.slow
def test_the_temporary_block_is_reused_not_faulted_in_again():
  # glibc's defaults, for contrast: the block is mmapped and unmapped at every call, all its pages
  # faulted in again (what the settings are for; if this stops holding, they may be obsolete).
  assert _faulting_calls("0") >= 36
  # Kept: a call faults only while the heap grows, when small allocations have taken a piece of
  # the freed block; a few of the first 30 calls, then none.
  assert _faulting_calls("1") <= 20


@pytest.mark.slow
def test_importing_the_library_leaves_the_allocator_alone():
  """Only the explicit call (cli.run, or a notebook's) changes glibc's settings: a process that imports
  the library's modules faults the block in at every call, as with glibc's defaults."""
  assert _faulting_calls("import") >= 36


@pytest.mark.parametrize(
  "platforms, on_cpu", [("cpu", True), ("cuda", False), ("tpu,cpu", False), ("cpu,cuda", True), ("", True)]
)
def test_the_settings_are_for_xla_cpu_only(monkeypatch, platforms, on_cpu):
  """On an accelerator (JAX_PLATFORMS naming one first, or an accelerator plugin installed: none is
  in this venv) the device holds the temporaries: glibc's settings stay as they are."""
  monkeypatch.setenv("JAX_PLATFORMS", platforms)
  assert hostmem.jax_runs_on_cpu() is on_cpu
  monkeypatch.setenv(hostmem.ENV, "1")
  if not on_cpu:
    assert hostmem.keep_freed_blocks() is False
