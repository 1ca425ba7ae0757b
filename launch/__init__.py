"""The launch programs: thin absl programs over the `transformer` library, one per thing a user does."""

import sys

from absl import flags

from transformer import cli, inference, kernels
from transformer.errors import CheckpointError, UserError

# The program that uses each task's trained model (config.task -> python -m ...).
PROGRAMS = {
  "lm": "launch.sample",
  "translation": "launch.translate",
  "classification": "launch.classify",
  "tagging": "launch.tag",
}


def restore(workdir: str, step: str, task: str | None = None, **options) -> inference.Trained:
  """`inference.restore` for a program that uses `task`'s models (None: any task's): a workdir of
  another task is one error naming the program for it. Says which kernels the model runs."""
  try:
    trained = inference.restore(workdir, step, task=task, **options)
  except inference.WrongTaskError as e:
    if e.found not in PROGRAMS:  # a task registered from Python: no program of ours uses it
      raise
    raise CheckpointError(f"{e}; use python -m {PROGRAMS[e.found]}") from None
  say_kernels(trained.run.model)
  return trained


def say_kernels(model_config) -> None:
  """The start-up line naming the fast forms the model runs (`transformer.kernels.describe`). On
  stderr: standard output is the program's results."""
  print(kernels.describe(model_config.kernels), file=sys.stderr)


def define_text_labelling_flags(task_noun: str, verb: str):
  """The flags of a program that labels texts with a trained run (launch.classify, launch.tag):
  --workdir, --step ('best' by default), --text (repeatable), --input_file."""
  return (
    flags.DEFINE_string("workdir", None, f"A {task_noun} training workdir.", required=True),
    flags.DEFINE_string(
      "step", "best", "'best' (the highest dev accuracy: what the run's test scores are of), 'latest' or a step number."
    ),
    flags.DEFINE_multi_string("text", [], f"A text to {verb}; repeat the flag for several."),
    flags.DEFINE_string("input_file", None, "One text a line; '-' reads stdin."),
  )


def texts_and_run(labelling_flags, task: str, verb: str) -> tuple[list[str], inference.Trained]:
  """The texts of --text, then --input_file, and the run of --workdir at --step (`task`'s)."""
  workdir, step, text, input_file = labelling_flags
  texts = cli.read_inputs(text.value, input_file.value, "input_file")
  if not texts:
    raise UserError(f"nothing to {verb}: give --text or --input_file")
  return texts, restore(workdir.value, step.value, task=task)
