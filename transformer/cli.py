"""What every absl launch program shares: user errors become one line on stderr and exit 1."""

import sys
import warnings
from pathlib import Path

import jax
from absl import app, flags, logging

from transformer import compile_cache, hostmem
from transformer.data import sources
from transformer.errors import InputWarning, UserError

flags.DEFINE_string(
  "compilation_cache",
  None,
  "JAX's persistent compilation cache: a directory, or off (default: $TRANSFORMER_COMPILATION_CACHE, else "
  "~/.cache/transformer/xla; transformer.compile_cache).",
)


def run(main) -> None:
  """absl's app.run(main), with this codebase's process settings and clean errors: a UserError is
  one `error:` line on stderr and exit status 1, an InputWarning one `warning:` line."""
  # First, before any of XLA's threads allocates (hostmem.py says why and how to turn it off).
  hostmem.keep_freed_blocks()
  app.run(clean_errors(main))


def clean_errors(main):
  """`main(argv)` with this codebase's clean errors: a UserError is one `error:` line on stderr and
  exit status 1, an InputWarning one `warning:` line (`run` runs it under absl; tests/surface.py
  calls it once for each bad input)."""

  def main_with_clean_errors(argv):
    if flags.FLAGS["compilation_cache"].present:  # before anything compiles
      compile_cache.enable(flags.FLAGS.compilation_cache)
    # Libraries (Orbax above all) log a lot at INFO; keep warnings unless --verbosity is given.
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)
    show_warning = warnings.showwarning

    def show_input_warnings_as_one_line(message, category, *args, **kwargs):
      if issubclass(category, InputWarning):
        print(f"warning: {message}", file=sys.stderr)
      else:
        show_warning(message, category, *args, **kwargs)

    warnings.showwarning = show_input_warnings_as_one_line
    try:
      return main(argv)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr)
      # A write that failed inside Orbax's async saving (e.g. a full disk) can leave coroutines that
      # were never awaited; Python warns of each as it exits, after the error, which must stay last.
      warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
      sys.exit(1)
    finally:
      warnings.showwarning = show_warning

  return main_with_clean_errors


def read_inputs(values: list[str], path: str | None, flag: str) -> list[str]:
  """What a launch program works on: the values of a repeatable flag, then the lines of `path`
  (given as --`flag`; "-" reads stdin). A file that cannot be a list of texts is one error naming
  it and, for bytes that are not UTF-8 text, the line, the byte and the fix."""
  lines = list(values)
  if path:
    name = f"--{flag}={path}"
    if path == "-":
      data = sys.stdin.buffer.read()
      name += " (stdin)"
    elif Path(path).is_dir():
      raise UserError(f"{name} is a directory; give a text file, one input a line")
    elif Path(path).is_file():
      data = Path(path).read_bytes()
    else:
      raise UserError(f"{name}: no such file")
    lines += sources.text_lines(data, name)
  return lines


def define_distributed_flags():
  """The multi-process flags of the programs that run on a cluster (launch.train, launch.plan);
  returns the function that starts jax.distributed per them (call it first in main)."""
  coordinator = flags.DEFINE_string(
    "coordinator_address",
    None,
    "Multi-process: host:port of process 0. On TPU pods and SLURM/Kubernetes GPU clusters pass --distributed instead.",
  )
  num_processes = flags.DEFINE_integer("num_processes", None, "Multi-process: how many processes.")
  process_id = flags.DEFINE_integer("process_id", None, "Multi-process: this process's index.")
  distributed = flags.DEFINE_bool(
    "distributed", False, "Call jax.distributed.initialize() with the cluster's auto-detected settings."
  )

  def initialize() -> None:
    if coordinator.value:
      jax.distributed.initialize(coordinator.value, num_processes.value, process_id.value)
    elif distributed.value:
      jax.distributed.initialize()

  return initialize
