#!/usr/bin/env bash
# The accelerator check (`python -m launch.bench --what=accelerator`) on a lent GPU machine that reaches
# nothing: its image has jax, CUDA and most of what this project needs, not these (carried as wheels).
#
#   bash launch/accelerator_check.sh --fetch     # here, once: the wheels, at this venv's versions, into .whl/
#   bash launch/accelerator_check.sh [OUT_DIR]   # there, with .whl carried: install them, run the check
#
# The check prints one table and writes it as OUT_DIR/accelerator_check.json (launch/BENCHMARKS.md keeps
# it, with the chip and the date). Each row is printed as it is measured, the JSON rewritten after each
# section, and every thread's stack printed every 2 minutes: the first try (2026-11-28, one H200) was cut
# off at its time limit with nothing printed. Its sections, in order: the kernel tests on the chip, cuDNN
# attention on packed rows, GPT-2 124M and gpt2-medium training MFU at the planner's batch, decoding
# gpt2 and gpt2-xl at batch 1, 8 and 32 against the HBM roofline. Compiling is most of its time (the
# second try, an H200: 60-80 s a GPT-2 step), so the later sections may need a call of their own
# (--check_tests= --check_train= for decoding alone).
set -euo pipefail
cd "$(dirname "$0")/.."
CARRIED="ml-collections grain array-record portpicker rustbpe tensorboardX zstandard flax orbax-checkpoint optax chex"

if [[ "${1:-}" == "--fetch" ]]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
  rm -rf .whl && mkdir -p .whl
  for name in $CARRIED; do
    version=$(.venv/bin/python -m pip show "$name" | sed -n 's/^Version: //p')
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "$name==$version"
  done
  ls .whl
  exit 0
fi

OUT_DIR="${1:-${OUT:-.}}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# hostmem's allocator settings are XLA:CPU's: say that this process decides it runs on the chip.
python3 -c "import jax; from transformer import hostmem; print(jax.__version__, jax.devices(), 'host settings:', hostmem.jax_runs_on_cpu())"
python3 -m launch.bench --what=accelerator --batch_sizes=1,8,32 --new_tokens=256 --prompt_len=32 \
  --check_json="$OUT_DIR/accelerator_check.json" 2>&1 | tee "$OUT_DIR/accelerator_check.txt"
