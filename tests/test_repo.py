"""The repository's promises: layout, packaging and that CI runs what the README says."""

import re
import tomllib

from conftest import REPO


def test_top_level_layout():
  names = {p.name for p in REPO.iterdir() if not p.name.startswith(".") and p.name not in
           {"data", "workdirs", "build"} and not p.name.endswith(".egg-info")}
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
  for needed in ("flax", "optax", "orbax-checkpoint", "tiktoken", "ml-collections", "absl-py", "grain",
                 "safetensors", "rustbpe", "sacrebleu", "numpy"):
    assert needed in deps, needed
  extras = project["optional-dependencies"]
  assert "cuda13" in extras["cuda"][0] and "tpu" in extras["tpu"][0]
  assert {"pytest", "chex", "hypothesis", "papermill", "ipykernel"} <= {re.split(r"[<>=]", d)[0] for d in extras["test"]}
