"""Runs one launch program's `main` on each case of a JSON file, in this one process, as `cli.run`
runs it (the flags parsed anew, a UserError one `error:` line and exit status 1), and prints a JSON
line a case: {"status": exit status or "traceback", "stdout": ..., "stderr": ...}. test_surface.py
walks every program's input surface with it: one process a program instead of one a bad input
(`conftest.run_cases`).

  python tests/surface.py launch.classify cases.json   # [{"args": [...], "stdin_hex": "..."}, ...]
"""

import contextlib
import importlib
import io
import json
import sys
import traceback
from pathlib import Path

from absl import flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: launch/, transformer/

from transformer import cli  # noqa: E402


def main() -> None:
  program, cases = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
  run = cli.clean_errors(importlib.import_module(program).main)
  for case in cases:
    flags.FLAGS.unparse_flags()
    # ml_collections defines a flag for each --config.x=... it finds in sys.argv as --config is parsed.
    for name in [name for name in flags.FLAGS if name.startswith("config.")]:
      delattr(flags.FLAGS, name)
    sys.argv = [program, *case["args"]]
    flags.FLAGS(sys.argv)
    sys.stdin = io.TextIOWrapper(io.BytesIO(bytes.fromhex(case.get("stdin_hex", ""))))
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
      try:
        run([program])
        status = 0
      except SystemExit as e:
        status = e.code
      except BaseException:  # what a process would end with: a traceback
        traceback.print_exc()
        status = "traceback"
    print(json.dumps({"status": status, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}), flush=True)


if __name__ == "__main__":
  main()
