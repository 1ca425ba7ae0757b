"""The PyTorch peers of `launch.bench --what=vs_hf|vs_torch`: a virtualenv with torch (CPU) and
transformers, made once under the asset cache, and a run of launch/bench/peers/torch_peer.py (Hugging Face's
GPT-2 and a minimal nanoGPT-style GPT) in it. Neither torch nor transformers is a dependency of this
project: only these benchmarks use them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from transformer import assets
from transformer.errors import UserError

# The PyTorch peers (launch/bench/peers/torch_peer.py) run in their own venv: torch has CPU wheels for
# Python 3.11 only, and neither torch nor transformers is a dependency of this project.
PEER_PYTHON_VERSION = (3, 11)
PEER_REQUIREMENTS = ("torch==2.13.0", "transformers==5.23.0")
# TransformerLens for `--what=patching` (launch/bench/peers/lens_peer.py), in a venv of its own beside the first.
LENS_REQUIREMENTS = (*PEER_REQUIREMENTS, "transformer-lens==4.3.0")
# SAELens for `--what=sae` (launch/bench/peers/sae_peer.py): in a venv of its own, for it pins another transformer-lens.
SAE_REQUIREMENTS = (*PEER_REQUIREMENTS, "sae-lens==6.54.12")


def _is_python(python: str, version: tuple[int, int]) -> bool:
  check = f"import sys; sys.exit(sys.version_info[:2] != {version!r})"
  try:
    return subprocess.run([python, "-c", check], capture_output=True, timeout=60).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


def _find_peer_base_python() -> str | None:
  """python3.11 on PATH, else pyenv's installed 3.11.x."""
  major, minor = PEER_PYTHON_VERSION
  candidates = [shutil.which(f"python{major}.{minor}")]
  pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
  candidates += sorted(map(str, pyenv_root.glob(f"versions/{major}.{minor}.*/bin/python{major}.{minor}")), reverse=True)
  return next((c for c in candidates if c and _is_python(c, PEER_PYTHON_VERSION)), None)


def peer_python(explicit: str | None = None, requirements=PEER_REQUIREMENTS, name: str = "torch-peer-venv") -> str:
  """A Python with torch (CPU) and transformers (the `requirements`) for the peers: `explicit` if
  given, else a venv created once under the asset cache (<cache>/<name>; about 1 GB of wheels)."""
  if explicit:
    return explicit
  venv = assets.cache_dir() / name
  python = venv / "bin" / "python"
  stamp = venv / ".installed"
  if python.exists() and stamp.exists() and stamp.read_text() == " ".join(requirements):
    return str(python)
  base = _find_peer_base_python()
  if base is None:
    raise UserError(
      f"the PyTorch peers need Python {'.'.join(map(str, PEER_PYTHON_VERSION))} (torch's CPU "
      f"wheels): install it (e.g. 'pyenv install 3.11') or pass --peer_python=/path/to/python "
      f"that has {' and '.join(requirements)}"
    )
  print(f"bench: creating {venv} with {base} and installing {' '.join(requirements)} ...", flush=True)
  subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
  subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], check=True)
  stamp.write_text(" ".join(requirements))
  return str(python)


def run_peers(python: str, spec: dict, script: str = "torch_peer.py") -> dict:
  """Runs launch/bench/peers/<script> (torch_peer.py, lens_peer.py, ...) under `python` with `spec`; returns its
  JSON result."""
  script = Path(__file__).resolve().parent / "peers" / script
  proc = subprocess.run([python, str(script), json.dumps(spec)], capture_output=True, text=True)
  if proc.returncode:
    raise UserError(f"the PyTorch peer failed ({python} {script}):\n{proc.stderr[-2000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])
