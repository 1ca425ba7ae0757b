"""launch/colab.ipynb, executed: every cell runs on this CPU, in a kernel of this venv, with small
settings that papermill injects after the notebook's parameters cell. A cell that raises fails the
test (papermill raises PapermillExecutionError naming the cell)."""

import platform

import nbformat
import papermill
import pytest

from conftest import REPO

NOTEBOOK = REPO / "launch" / "colab.ipynb"


def _code_cells(nb) -> list:
  return [c for c in nb.cells if c.cell_type == "code"]


def test_the_notebook_is_stored_without_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  cells = _code_cells(nb)
  assert all(c.outputs == [] and c.execution_count is None for c in cells)
  assert "parameters" in cells[0].metadata.get("tags", [])  # papermill's injection point
  assert nb.metadata.kernelspec.name == "python3"


@pytest.mark.slow
def test_the_notebook_runs_on_cpu(tmp_path, monkeypatch):
  # This venv's own python3 kernel (ipykernel's), even where a user-wide kernelspec of that name exists.
  monkeypatch.setenv("JUPYTER_PREFER_ENV_PATH", "1")
  out = tmp_path / "colab.ipynb"
  workdir = tmp_path / "w"
  parameters = dict(
    LM_PRESET="tiny",
    SAE_STEPS=20,
    CLT_STEPS=20,
    MT_PRESET="tiny",
    CPU_DEVICES=2,
    MESH_DATA=1,
    MESH_FSDP=-1,
    WORKDIR=str(workdir),
    DATA_ROOT=str(tmp_path / "data"),
  )
  # Each one a parameter papermill finds in the parameters cell (one name per line), which it lists
  # in `papermill --help-notebook`; an unparsed one is injected anyway, with a warning.
  assert set(parameters) <= set(papermill.inspect_notebook(NOTEBOOK))
  papermill.execute_notebook(
    NOTEBOOK,
    out,
    kernel_name="python3",
    cwd=str(NOTEBOOK.parent),
    progress_bar=False,
    execution_timeout=600,
    parameters=parameters,
  )
  nb = nbformat.read(out, as_version=4)
  assert nb.metadata.language_info.version == platform.python_version()
  outputs = [o for c in _code_cells(nb) for o in c.outputs]
  stdout = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
  pictures = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.data]

  # The two CPU devices and the mesh the config builds over them (batch and parameters split), used by training.
  assert "2 device(s)" in stdout and "mesh {'data': 1, 'fsdp': 2, 'tensor': 1} over 2 device(s)" in stdout
  assert "devices: 2 x cpu" in stdout
  # Training's progress in the cell, then the loss curve, samples, probes, translations.
  assert "step 40: validation loss" in stdout and "step 20: validation loss" in stdout
  assert "ROMEO:" in stdout and "JULIET:" in stdout
  assert "after block 1:" in stdout and "similarity " in stdout
  assert "test split" in stdout and "greedy: " in stdout and "beam 4: " in stdout
  # Interventions: a patching sweep, an ablation, a logit's attribution, the heads' scores; treescope's view.
  assert "patching resid_pre, layers x positions" in stdout and "with head 0.0 ablated" in stdout
  assert "induction scores (layers x heads)" in stdout
  # A sparse autoencoder on the residual stream, scored with the SAE spliced in, and its features' page.
  assert "'ce_loss_score'" in stdout and "their pages in" in stdout
  assert any("top contexts" in o.data.get("text/html", "") for o in outputs if o.output_type == "display_data")
  assert any(
    "treescope" in o.data.get("text/html", "") for o in outputs if o.output_type in ("display_data", "execute_result")
  )
  # loss (GPT), attention, residual norms, logit lens, patching, loss (translation), alignment.
  assert len(pictures) == 7
  assert (workdir / "shakespeare-tiny" / "checkpoints").is_dir()
  assert (workdir / "de-en-tiny" / "test_translations.tsv").exists()
  assert (workdir / "de-en-tiny" / "probes" / "alignment.png").exists()


def _install_functions() -> dict:
  """The install cell's functions (runtime_extra, pip_target, backend_problem), defined apart from the
  cell's Colab-only install, which they decide."""
  import ast

  source = next(c.source for c in _code_cells(nbformat.read(NOTEBOOK, as_version=4)) if "def runtime_extra" in c.source)
  tree = ast.parse(source)
  keep = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef))]
  namespace: dict = {}
  exec(compile(ast.Module(body=keep, type_ignores=[]), "colab-install-cell", "exec"), namespace)
  return namespace


@pytest.mark.parametrize(
  "devices,environ,gpu,extra",
  [
    (["vfio/0"], {}, False, "tpu"),  # Colab's TPU runtime today: one v5e chip, a VFIO device
    (["accel0", "accel1"], {}, False, "tpu"),  # v4 and v5p VMs
    ([], {"TPU_ACCELERATOR_TYPE": "v5litepod-1"}, False, "tpu"),
    ([], {}, True, "cuda"),
    (["vfio/vfio"], {}, False, ""),  # the VFIO control node alone is no chip
    ([], {}, False, ""),
  ],
)
def test_the_install_cell_picks_the_runtimes_extra_and_names_a_cpu_fallback(tmp_path, devices, environ, gpu, extra):
  """The install decision on a simulated runtime (device files under a fake /dev, environment
  variables, nvidia-smi on the PATH or not), without its hardware: the extra, the pip target, and
  the one line the next cell stops with when jax then runs on the CPU of an accelerator runtime."""
  cell = _install_functions()
  for name in devices:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).touch()
  which = lambda program: "/usr/bin/nvidia-smi" if gpu and program == "nvidia-smi" else None
  assert cell["runtime_extra"](tmp_path, environ, which) == extra
  repo = REPO.parent / "repo"
  assert cell["pip_target"](repo, extra) == (f"{repo}[{extra}]" if extra else str(repo))
  problem = cell["backend_problem"](extra, "cpu", "0.7.2")
  if extra:
    assert "jax 0.7.2 found no" in problem and "fell back to the CPU" in problem and "Restart session" in problem
  else:
    assert problem is None
  assert cell["backend_problem"](extra, "tpu" if extra == "tpu" else "gpu", "0.12.0") is None
