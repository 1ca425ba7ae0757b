"""JAX's persistent compilation cache, on by default for the launch programs and the library
(transformer.compile_cache): a second process of the same program on the same shapes compiles nothing again."""

import os
import subprocess
import sys

import pytest

from conftest import REPO

MODEL = REPO / "tests" / "fixtures" / "gpt2_own_tokenizer"


def _probe(tmp_path, cache: str | None, *flags: str) -> subprocess.CompletedProcess:
  """launch.probe on a text, in a process whose environment sets no JAX cache of its own (the suite's left out)."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
  env.pop("TRANSFORMER_COMPILATION_CACHE", None)
  env["XDG_CACHE_HOME"] = str(tmp_path / "home-cache")  # the per-user default, here
  if cache is not None:
    env["TRANSFORMER_COMPILATION_CACHE"] = cache
  args = [sys.executable, "-m", "launch.probe", f"--hf={MODEL}", "--text=To be, or not", f"--out={tmp_path / 'p'}"]
  done = subprocess.run([*args, *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return done


def _entries(directory) -> set[str]:
  return {p.name for p in directory.rglob("*") if p.is_file()} if directory.exists() else set()


@pytest.mark.slow  # three launch programs
def test_a_second_run_of_a_program_reads_every_program_it_compiled_from_the_cache(tmp_path):
  """The first run of launch.probe fills the per-user cache (XDG_CACHE_HOME/transformer/xla); a second one on the same
  text adds nothing (every program it runs was read back: 0 compiled); TRANSFORMER_COMPILATION_CACHE=off writes none,
  and --compilation_cache=DIR puts it there."""
  default = tmp_path / "home-cache" / "transformer" / "xla"
  _probe(tmp_path, None)
  first = _entries(default)
  assert len(first) > 5  # every program of the run, however fast it compiled
  _probe(tmp_path, None)
  assert _entries(default) == first
  _probe(tmp_path / "off", "off")
  assert not _entries(tmp_path / "off" / "home-cache" / "transformer" / "xla")
  _probe(tmp_path, None, f"--compilation_cache={tmp_path / 'mine'}")
  assert _entries(tmp_path / "mine") == first
