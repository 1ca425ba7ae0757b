"""The repository's promises: layout, packaging and that CI runs what the README says."""

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import DEFAULT_COMPILE_BUDGET, REPO


def test_top_level_layout():
  names = {
    p.name
    for p in REPO.iterdir()
    if not p.name.startswith(".") and p.name not in {"data", "workdirs", "build"} and not p.name.endswith(".egg-info")
  }
  assert names == {"pyproject.toml", "README.md", "transformer", "experiments", "launch", "tests"}


def test_ci_runs_the_readme_test_command():
  readme_blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
  test_cmd = next(b.strip() for b in readme_blocks if "pytest" in b)
  assert test_cmd in (REPO / ".ci" / "run").read_text().splitlines()


def test_packaging():
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  assert project["requires-python"] == ">=3.12"
  deps = " ".join(project["dependencies"])
  assert "jax>=0.11.2" in deps and "torch" not in deps
  for needed in (
    "flax",
    "optax",
    "orbax-checkpoint",
    "tiktoken",
    "ml-collections",
    "absl-py",
    "grain",
    "safetensors",
    "rustbpe",
    "sacrebleu",
    "numpy",
  ):
    assert needed in deps, needed
  extras = project["optional-dependencies"]
  assert "cuda13" in extras["cuda"][0] and "tpu" in extras["tpu"][0]
  assert {"pytest", "chex", "hypothesis", "papermill", "ipykernel"} <= {
    re.split(r"[<>=]", d)[0] for d in extras["test"]
  }


def _library_imports() -> tuple[dict[str, set[str]], list[str]]:
  """The library's modules -> the library modules each imports (`from transformer.x import y` counts
  as transformer.x.y where that is a module), and every import of the library inside a function."""
  files = {}
  for path in (REPO / "transformer").rglob("*.py"):
    parts = path.relative_to(REPO).with_suffix("").parts
    files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  graph, local = {}, []
  for name, path in files.items():
    tree = ast.parse(path.read_text())
    targets = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets |= {a.name for a in node.names}
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        targets |= {
          f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module for a in node.names
        }
    graph[name] = {t for t in targets if t in files and t != name}
    for function in ast.walk(tree):
      if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        local += [
          f"{name}.{function.name}"
          for node in ast.walk(function)
          if isinstance(node, (ast.Import, ast.ImportFrom)) and "transformer" in ast.unparse(node)
        ]
  return graph, local


def test_the_library_has_no_import_cycle_and_no_import_inside_a_function():
  """The modules import each other as a DAG (each can be read knowing only what it imports), and no
  function imports the library to dodge a cycle."""
  graph, local = _library_imports()
  assert len(graph) > 40 and graph["transformer.tasks"] >= {"transformer.tasks.lm", "transformer.config"}
  done, path = set(), []

  def visit(module):
    if module in path:
      raise AssertionError("import cycle: " + " -> ".join(path[path.index(module) :] + [module]))
    if module not in done:
      path.append(module)
      for imported in sorted(graph[module]):
        visit(imported)
      path.pop()
      done.add(module)

  for module in sorted(graph):
    visit(module)
  assert local == []


# The library's floors, lowest first: a module may import its own floor's and those below, never one
# above. `config` holds plain values (no data set is read to resolve one); `data` prepares tokens and
# runs no model; `interp` studies models as values (a training run's config and task are above it:
# opening a workdir is `transformer.inference`'s and `transformer.dictionaries`'); `layers` and `models`
# are the pure functions everything else calls.
_ABOVE_MODELS = ("config", "data", "interp", "tasks", "inference", "train", "dictionaries", "opening")
_BELOW = {
  "config": ("data",),
  "data": ("interp", "tasks", "inference", "train", "dictionaries", "opening"),
  "interp": ("tasks", "inference", "train", "dictionaries", "opening"),
  "layers": _ABOVE_MODELS,
  "models": _ABOVE_MODELS,
}


def _upward(graph: dict[str, set[str]]) -> list[str]:
  inside = lambda module, package: module == f"transformer.{package}" or module.startswith(f"transformer.{package}.")
  return [
    f"{module} imports {imported}"
    for module, imports in sorted(graph.items())
    for floor, above in _BELOW.items()
    if inside(module, floor)
    for imported in sorted(imports)
    if any(inside(imported, a) for a in above)
  ]


def test_no_import_runs_upward():
  """A lower package never imports a higher one (`_BELOW`): the instrument opens nothing by itself, the
  data package runs no model, the config reads no data; the check fails on a planted upward import."""
  graph, _ = _library_imports()
  assert _upward(graph) == []
  planted = {**graph, "transformer.interp.graph": graph["transformer.interp.graph"] | {"transformer.inference"}}
  assert _upward(planted) == ["transformer.interp.graph imports transformer.inference"]


# What a measurement looks like in a comment or docstring: a machine, a speed, a score, a ratio of
# speeds, a date, "today".
_MEASUREMENTS = re.compile(
  r"\b(Zen ?\d|EPYC|Xeon|Ryzen|Core i\d|H100|H200|A100|TPU v\d\w*)\b"
  r"|\d[\d,.]* ?(ms|MB/s|GB/s|TB/s|tok/s|tokens/s|it/s|[GT]FLOP/s)\b"
  r"|[\d.~]+ BLEU|BLEU [\d.]+|\b[\d.]+ ?(×|x|times) (faster|slower)|\d+(\.\d+)?% (faster|slower)"
  r"|\b20\d\d-\d\d-\d\d\b|\btoday('s)?\b",
  re.IGNORECASE,
)


def test_no_module_of_the_library_narrates_a_measurement():
  """Measurements, the machines and the dates they were made on live in the results pages
  (experiments/README.md, launch/BENCHMARKS.md) beside what produced them, not in the library."""
  named = [
    f"{p.relative_to(REPO)}:{text[: m.start()].count(chr(10)) + 1}: {m.group(0)}"
    for p in (REPO / "transformer").rglob("*.py")
    for text in [p.read_text()]
    for m in _MEASUREMENTS.finditer(text)
  ]
  assert named == []
  assert _MEASUREMENTS.search("a step 1.7× faster (Zen 3: 523 → 244 ms), BLEU 5.39 on 2026-11-28")


def _rooms_too_big(roots=("transformer", "launch"), module_lines: int = 600, function_lines: int = 60) -> list[str]:
  found = []
  for root in roots:
    for path in sorted((REPO / root).rglob("*.py")):
      text = path.read_text()
      if (n := len(text.splitlines())) > module_lines:
        found.append(f"{path.relative_to(REPO)}: {n} lines")
      for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
          if (n := node.end_lineno - node.lineno + 1) > function_lines:
            found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {n} lines")
  return found


def test_no_module_over_600_lines_and_no_function_over_60():
  """Rooms that fit: a module a reader holds whole, a function read at a glance (its docstring counts)."""
  assert _rooms_too_big() == []
  assert _rooms_too_big(function_lines=40)  # the check sees functions (a lower bar finds some)


def _private_names_crossing(roots=("transformer", "launch")) -> list[str]:
  """Every `from <ours> import _x` and `<our module>._x` in the library and the programs."""
  found = []
  for root in roots:
    for path in sorted((REPO / root).rglob("*.py")):
      tree, ours = ast.parse(path.read_text()), set()
      for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("transformer", "launch"):
          found += [
            f"{path.relative_to(REPO)}: from {node.module} import {a.name}" for a in node.names if a.name[0] == "_"
          ]
          ours |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
          ours |= {a.asname or a.name for a in node.names if a.name.split(".")[0] in ("transformer", "launch")}
      found += [
        f"{path.relative_to(REPO)}:{node.lineno}: {node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ours
        if node.attr.startswith("_") and not node.attr.startswith("__")
      ]
  return found


def test_no_private_name_is_imported_across_modules():
  """A name with a leading underscore is its module's own: another module that needs it needs a public one."""
  assert _private_names_crossing() == []
  assert _private_names_crossing(("tests",))  # the check sees them (tests may reach inside)


def test_each_layers_module_is_one_idea_a_reader_can_hold():
  """transformer/layers/ is split by concern (its __init__ lists them); a module that grows past
  ~300 lines is holding a second idea."""
  long = {
    p.name: n for p in (REPO / "transformer" / "layers").glob("*.py") if (n := len(p.read_text().splitlines())) > 300
  }
  assert long == {}


def test_the_linter_and_the_formatter_are_clean():
  """ruff's linter and formatter, configured in pyproject.toml, change nothing (CI runs them too,
  before the tests); `ruff format` writes what the formatter wants."""
  ruff = Path(sys.executable).with_name("ruff")
  for command in (["check"], ["format", "--check"]):
    proc = subprocess.run(
      [str(ruff), *command, "transformer", "launch", "experiments", "tests"],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]


@pytest.mark.slow  # a pytest process of its own
def test_the_suite_counts_its_compilations_and_fails_a_module_over_its_budget(tmp_path):
  """tests/conftest.py's count, in a pytest run of two modules of eager ops (a program an op and new
  shape): `--compiles` prints each test's programs and the line that compiled them, and the module
  over the default budget fails the run although its test passed; the one within it does not."""
  for name, shapes in (("test_over", DEFAULT_COMPILE_BUDGET), ("test_within", 3)):
    (tmp_path / f"{name}.py").write_text(  # shapes of their own: (n, 0) and (n, 1)
      f"import jax.numpy as jnp\n\n\ndef test_eager_ops():\n  for n in range(1, {shapes + 1}):\n"
      f"    jnp.ones((n, {int(name == 'test_within')})) + 1.0\n"
    )
  proc = subprocess.run(
    [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "--compiles", "."],
    cwd=tmp_path,
    env={**os.environ, "PYTHONPATH": str(REPO / "tests")},
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1 and "2 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
  over = re.search(r"test_over.py: (\d+) XLA programs in the fast tier, over its budget of (\d+)", proc.stdout)
  assert over and int(over.group(1)) >= 2 * DEFAULT_COMPILE_BUDGET and int(over.group(2)) == DEFAULT_COMPILE_BUDGET
  assert "test_within.py: " not in proc.stdout
  tests = re.findall(r"^ +(\d+) programs .*::test_eager_ops$", proc.stdout, re.M)
  assert sorted(map(int, tests)) == [6, int(over.group(1))], proc.stdout
  lines = dict((where, int(n)) for n, where in re.findall(r"^ +(\d+) programs  (test_\w+\.py:\d+)$", proc.stdout, re.M))
  assert lines["test_over.py:6"] >= 2 * DEFAULT_COMPILE_BUDGET and lines["test_within.py:6"] == 6, proc.stdout


@pytest.mark.slow  # a process that compiles the tour's programs
def test_the_readmes_python_tour_of_the_instrument_runs_as_written():
  """The README's Python block of reading, patching, path patching and probing runs as it is written: its
  imports and its tiny model are in it, nothing comes from elsewhere."""
  blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
  [tour] = [b for b in blocks if "run_with_cache" in b]
  proc = subprocess.run(
    [sys.executable, "-c", tour + "\nprint('ran', probe.test_accuracy)"], cwd=REPO, capture_output=True, text=True
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.startswith("ran")


def test_the_documented_output_folders_are_not_committed():
  """What the README and experiments/README.md tell a user to write (graphs/, probes/, features/, workdirs/, data/)
  is ignored by git: a run in the repository leaves nothing to commit by mistake."""
  paths = ["graphs/juliet/graph.json", "probes/romeo/attention.png", "features/char/features.html"]
  paths += ["workdirs/shakespeare-char/config.json", "data/shakespeare-gpt2/train.bin", "build/pages/graph.png"]
  ignored = subprocess.run(["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True).stdout.split()
  assert ignored == paths
