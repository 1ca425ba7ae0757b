#!/usr/bin/env bash
# Creates .venv (Python >= 3.12) in the repository root and installs the project into it.
# Usage: bash launch/setup.sh [--test]     (--test also installs pytest, chex, hypothesis)
# Idempotent: a second run with the same pyproject.toml installs nothing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
extras=""
[[ "${1:-}" == "--test" ]] && extras="[test]"

is_py312() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }

find_python() {
  # An explicit choice wins, then PATH, then pyenv's installed versions: on machines where
  # pyenv's global python3 is older, the python3.12 shim fails unless told a version.
  local c
  for c in "${PYTHON:-}" python3.13 python3.12 python3 python; do
    [[ -n "$c" ]] && command -v "$c" >/dev/null 2>&1 && is_py312 "$c" && { command -v "$c"; return; }
  done
  local pyenv_root="${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}"
  for c in $(ls -d "$pyenv_root"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -rV); do
    is_py312 "$c" && { echo "$c"; return; }
  done
  return 1
}

if [[ ! -x "$venv/bin/python" ]] || ! is_py312 "$venv/bin/python"; then
  py="$(find_python)" || {
    echo "error: no Python >= 3.12 found (looked at \$PYTHON, python3.13, python3.12, python3 on PATH" >&2
    echo "and pyenv's versions). Install one, e.g. 'pyenv install 3.12' or 'apt-get install python3.12-venv'," >&2
    echo "or point PYTHON=/path/to/python3.12 at it, then run this again." >&2
    exit 1
  }
  echo "setup: creating $venv with $py ($("$py" --version))"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi

stamp="$venv/.installed$extras"
want="$(cat "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "setup: installing transformer$extras into $venv"
  "$venv/bin/python" -m pip install -q -e "$root$extras"
  echo "$want" > "$stamp"
fi
