r"""Tags every word of texts with a trained tagger (config.task="tagging", experiments/pos.py).

  python -m launch.tag --workdir=workdirs/pos-bilstm --text="The jury said it did not find any evidence ."
  python -m launch.tag --workdir=workdirs/pos-encoder --input_file=sentences.txt

Texts come from --text (repeatable), then --input_file (one text a line; "-" is stdin). For each,
one line of `word/TAG` (words and punctuation as the word tokenizer splits them).
"""

from absl import flags

import launch
from transformer import cli, inference
from transformer.errors import UserError

_WORKDIR = flags.DEFINE_string("workdir", None, "A tagging training workdir.", required=True)
_STEP = flags.DEFINE_string(
  "step", "best", "'best' (the highest dev accuracy: what the run's test scores are of), 'latest' or a step number."
)
_TEXT = flags.DEFINE_multi_string("text", [], "A text to tag; repeat the flag for several.")
_INPUT_FILE = flags.DEFINE_string("input_file", None, "One text a line; '-' reads stdin.")


def main(argv):
  del argv
  texts = cli.read_inputs(_TEXT.value, _INPUT_FILE.value, "input_file")
  if not texts:
    raise UserError("nothing to tag: give --text or --input_file")
  trained = launch.restore(_WORKDIR.value, _STEP.value, task="tagging")
  for tagged in inference.tag(trained, texts):
    print(" ".join(f"{word}/{tag}" for word, tag in tagged))


if __name__ == "__main__":
  cli.run(main)
