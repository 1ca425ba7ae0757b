r"""Labels texts with a trained classifier (config.task="classification", experiments/sentiment.py).

  python -m launch.classify --workdir=workdirs/sentiment-encoder --text="A gorgeous, witty film."
  python -m launch.classify --workdir=workdirs/sentiment-encoder --input_file=reviews.txt
  echo "Too long and too dull." | python -m launch.classify --workdir=workdirs/sentiment-lstm --input_file=-

Texts come from --text (repeatable), then --input_file (one text a line; "-" is stdin). For each,
one line: the label, a tab, and every class's probability.
"""

from absl import flags

import launch
from transformer import cli, inference
from transformer.errors import UserError

_WORKDIR = flags.DEFINE_string("workdir", None, "A classification training workdir.", required=True)
_STEP = flags.DEFINE_string(
  "step", "best", "'best' (the highest dev accuracy: what the run's test scores are of), 'latest' or a step number."
)
_TEXT = flags.DEFINE_multi_string("text", [], "A text to classify; repeat the flag for several.")
_INPUT_FILE = flags.DEFINE_string("input_file", None, "One text a line; '-' reads stdin.")


def main(argv):
  del argv
  texts = cli.read_inputs(_TEXT.value, _INPUT_FILE.value, "input_file")
  if not texts:
    raise UserError("nothing to classify: give --text or --input_file")
  trained = launch.restore(_WORKDIR.value, _STEP.value, task="classification")
  probs = inference.classify(trained, texts)
  names = trained.task.labels
  for p in probs:
    print(f"{names[p.argmax()]}\t" + " ".join(f"{n}={q:.3f}" for n, q in zip(names, p)))


if __name__ == "__main__":
  cli.run(main)
