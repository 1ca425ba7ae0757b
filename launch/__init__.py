"""The launch programs: thin absl programs over the `transformer` library, one per thing a user does."""

from transformer import inference
from transformer.errors import CheckpointError

# The program that uses each task's trained model (config.task -> python -m ...).
PROGRAMS = {
  "lm": "launch.sample",
  "translation": "launch.translate",
  "classification": "launch.classify",
  "tagging": "launch.tag",
}


def restore(workdir: str, step: str, task: str, **options) -> inference.Trained:
  """`inference.restore` for a program that uses `task`'s models: a workdir of another task is one
  error naming the program for it."""
  try:
    return inference.restore(workdir, step, task=task, **options)
  except inference.WrongTaskError as e:
    if e.found not in PROGRAMS:  # a task registered from Python: no program of ours uses it
      raise
    raise CheckpointError(f"{e}; use python -m {PROGRAMS[e.found]}") from None
