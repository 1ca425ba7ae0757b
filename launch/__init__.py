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


def load(task: str | None = None, **where) -> inference.Trained:
  """`inference.load(**where)` for a program that uses `task`'s models (None: any task's): a model of
  another task is one error naming the program for it. Says which kernels the model runs."""
  try:
    trained = inference.load(task=task, **where)
  except inference.WrongTaskError as e:
    if e.found not in PROGRAMS:  # a task registered from Python: no program of ours uses it
      raise
    raise CheckpointError(f"{e}; use python -m {PROGRAMS[e.found]}") from None
  say_kernels(trained.run.model)
  return trained


# What --hf opens: a language model (launch.sample); launch.evaluate and launch.probe take Marian's too (HF_MARIAN).
HF_HELP = (
  "Instead of --workdir: a Hugging Face language model's directory: an open family's (config.json, safetensors "
  "and tokenizer.json: Llama, Mistral, Qwen2/3, SmolLM, Gemma 1-3, Pythia, OLMo 2) or GPT-2's (model.safetensors, "
  "with its tokenizer.json or vocab.json + merges.txt where it has a tokenizer of its own)."
)
HF_MARIAN = " Or a Marian model's directory (MarianMTModel + MarianTokenizer files: a translation model)."


class ModelFlags:
  """The flags that say which model a program uses, the same in every program: --workdir, --step,
  and, where the program takes Hugging Face weights, --hf and --tokenizer. `load()` reads them."""

  def __init__(self, workdir_help: str, hf_help: str | None = None, required: bool = False, gpt2: bool = True):
    self.workdir = flags.DEFINE_string("workdir", None, workdir_help, required=required)
    self.step = flags.DEFINE_string(
      "step",
      None,
      "With --workdir: 'latest', 'best' (by the task's evaluation: lowest validation loss, highest dev "
      "BLEU or accuracy) or a step number. Default: 'best' for the tasks that end on their best "
      "checkpoint (classification, tagging), else 'latest'.",
    )
    self.hf = self.tokenizer = None
    if hf_help:
      self.hf = flags.DEFINE_string("hf", None, hf_help)
    if hf_help and gpt2:  # OpenAI's GPT-2 files hold no tokenizer
      self.tokenizer = flags.DEFINE_string(
        "tokenizer", "gpt2", "With --hf of a GPT-2 without tokenizer files of its own: the tokenizer (gpt2: OpenAI's)."
      )

  def where(self) -> dict:
    """The model's place as `inference.load` takes it."""
    where = {"workdir": self.workdir.value, "step": self.step.value}
    if self.hf is not None:
      where["hf"] = self.hf.value
    if self.tokenizer is not None:
      where["tokenizer"] = self.tokenizer.value
    return where

  def load(self, task: str | None = None, **options) -> inference.Trained:
    return load(task, **self.where(), **options)


def say_kernels(model_config) -> None:
  """The start-up line naming the fast forms the model runs (`transformer.kernels.describe`). On
  stderr: standard output is the program's results."""
  print(kernels.describe(model_config.kernels), file=sys.stderr)


def define_text_labelling_flags(task_noun: str, verb: str):
  """The flags of a program that labels texts with a trained run (launch.classify, launch.tag): the
  model's (`ModelFlags`: --workdir, --step), --text (repeatable), --input_file."""
  return (
    ModelFlags(f"A {task_noun} training workdir.", required=True),
    flags.DEFINE_multi_string("text", [], f"A text to {verb}; repeat the flag for several."),
    flags.DEFINE_string("input_file", None, "One text a line; '-' reads stdin."),
  )


def texts_and_run(labelling_flags, task: str, verb: str) -> tuple[list[str], inference.Trained]:
  """The texts of --text, then --input_file, and the run of --workdir at --step (`task`'s)."""
  model, text, input_file = labelling_flags
  texts = cli.read_inputs(text.value, input_file.value, "input_file")
  if not texts:
    raise UserError(f"nothing to {verb}: give --text or --input_file")
  return texts, model.load(task)
