"""The launch programs' input surface: every file a program reads (and stdin), given what users pipe
in by mistake, ends the program with exit status 1 and one `error:` line naming the file (and, for
bytes that are not UTF-8 text, the line), with no traceback and nothing written into the workdir,
data or output directory it was given. A new program or input flag joins PROGRAMS.

Each program meets every bad input in one process (tests/surface.py calls its `main` as cli.run
does, once a case); one real process a program checks the headline case (a Latin-1 line) end to end."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from transformer.data import sources
from transformer.errors import DataError

from conftest import REPO, run_cases, run_module

_RANDOM = np.random.default_rng(0).bytes(4096)
BAD = {
  "random bytes": _RANDOM,
  "random bytes without a NUL": _RANDOM.replace(b"\0", b"\1"),
  "a Latin-1 line": "a good line\nnaïve café\nthe last line\n".encode("latin-1"),
  "a NUL byte": b"hello\0world\n",
  "an empty file": b"",
  "blank lines": b"\n  \n\t\n",
  "a missing file": None,
  "a directory": "directory",
}

# program -> its file inputs: (flag, other arguments) given the file F, workdir W and output directory D.
# Every workdir W is one that does not exist: the input is read (and refused) before a model is.
PROGRAMS = {
  "launch.sample": [
    lambda f, w, d: [f"--workdir={w}", f"--prompts_file={f}"],
    lambda f, w, d: [f"--hf={f}"],  # GPT-2 safetensors
  ],
  "launch.translate": [
    lambda f, w, d: [f"--workdir={w}", f"--input_file={f}"],
    lambda f, w, d: [f"--hf={f}", "--sentence=Guten Morgen."],  # a Marian model's directory
  ],
  "launch.evaluate": [
    lambda f, w, d: [f"--workdir={w}", f"--input_file={f}"],
    lambda f, w, d: [f"--hf={f}", f"--input_file={REPO / 'README.md'}"],  # GPT-2 safetensors
  ],
  "launch.classify": [lambda f, w, d: [f"--workdir={w}", f"--input_file={f}"]],
  "launch.tag": [lambda f, w, d: [f"--workdir={w}", f"--input_file={f}"]],
  "launch.probe": [lambda f, w, d: [f"--hf={f}", "--text=hello", f"--out={d}"]],
  "launch.prepare": [lambda f, w, d: [f"--input_files={f}", "--tokenizer=char", f"--output_dir={d}"]],
  "launch.train": [
    lambda f, w, d: [
      "--config=experiments/shakespeare.py:tiny",
      f"--config.data.input_files={f}",
      f"--config.data.root={d}",
      f"--workdir={w}",
    ]
  ],
}
# Programs that read texts a line each also read them from stdin ("-").
STDIN = {"launch.sample": "--prompts_file=-", "launch.translate": "--input_file=-"}
STDIN |= {"launch.classify": "--input_file=-", "launch.tag": "--input_file=-"}


def _files(tmp_path) -> dict:
  files = {}
  for name, content in BAD.items():
    path = tmp_path / "inputs" / name.replace(" ", "_")
    path.parent.mkdir(exist_ok=True)
    if content == "directory":
      path.mkdir()
    elif content is not None:
      path.write_bytes(content)
    files[name] = path
  return files


def _assert_one_error_line(stderr: str, names: str, what: str) -> str:
  lines = [line for line in stderr.splitlines() if line.strip()]
  errors = [line for line in lines if line.startswith("error: ")]
  assert "Traceback" not in stderr and len(errors) == 1 and lines[-1] == errors[0], f"{what}:\n{stderr[-3000:]}"
  assert names in errors[0], f"{what}: the error does not name {names}: {errors[0]}"
  return errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("program", PROGRAMS)
def test_every_bad_input_is_one_error_line_naming_it_and_writes_nothing(program, tmp_path):
  files, workdir, out = _files(tmp_path), tmp_path / "workdir", tmp_path / "out"
  cases, expected = [], []
  for inputs in PROGRAMS[program]:
    for name, path in files.items():
      cases.append({"args": inputs(path, workdir, out)})
      expected.append((f"{name} as {cases[-1]['args']}", str(path)))
  if program in STDIN:
    for name, content in BAD.items():
      if isinstance(content, bytes):
        cases.append({"args": [f"--workdir={workdir}", STDIN[program]], "stdin_hex": content.hex()})
        expected.append((f"{name} on stdin", f"{STDIN[program]} (stdin)"))
  results = run_cases(program, cases, tmp_path)
  for result, (what, names) in zip(results, expected):
    assert result["status"] == 1, f"{what}: exit status {result['status']}\n{result['stderr'][-3000:]}"
    line = _assert_one_error_line(result["stderr"], names, what)
    if what.startswith("a Latin-1 line") and "--hf" not in what:
      assert "line 2, column 3: byte 0xef is not UTF-8" in line and "convert" in line, line
  assert not workdir.exists() and not out.exists()  # nothing written


# The headline case in a real process per program: exit status 1 and the error as the last line.
@pytest.mark.slow
@pytest.mark.parametrize("program", PROGRAMS)
def test_a_latin1_line_ends_a_real_process_with_one_error_line(program, tmp_path):
  latin1 = _files(tmp_path)["a Latin-1 line"]
  proc = run_module(program, *PROGRAMS[program][0](latin1, tmp_path / "workdir", tmp_path / "out"))
  assert proc.returncode == 1, proc.stderr[-3000:]
  line = _assert_one_error_line(proc.stderr, str(latin1), program)
  if program != "launch.probe":  # its file is GPT-2 safetensors, not text
    assert "line 2, column 3: byte 0xef is not UTF-8" in line, line
  assert not (tmp_path / "workdir").exists() and not (tmp_path / "out").exists()


@given(st.binary(max_size=64))
def test_text_lines_are_the_texts_lines_or_one_error_naming_the_input(data):
  try:
    lines = sources.text_lines(data, "--input_file=x")
  except DataError as e:
    assert str(e).startswith("--input_file=x")
    assert data == b"" or b"\0" in data or not data.decode("utf-8", "replace").strip() or "is not UTF-8" in str(e)
  else:
    assert lines == data.decode("utf-8").splitlines() and any(line.strip() for line in lines)
