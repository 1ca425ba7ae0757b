r"""Labels texts with a trained classifier (config.task="classification", experiments/sentiment.py).

  python -m launch.classify --workdir=workdirs/sentiment-encoder --text="A gorgeous, witty film."
  python -m launch.classify --workdir=workdirs/sentiment-encoder --input_file=reviews.txt
  echo "Too long and too dull." | python -m launch.classify --workdir=workdirs/sentiment-lstm --input_file=-

Texts come from --text (repeatable), then --input_file (one text a line; "-" is stdin). For each,
one line: the label, a tab, and every class's probability.
"""

import launch
from transformer import cli, inference

_FLAGS = launch.define_text_labelling_flags("classification", "classify")


def main(argv):
  del argv
  texts, trained = launch.texts_and_run(_FLAGS, "classification", "classify")
  probs = inference.classify(trained, texts)
  names = trained.task.labels
  for p in probs:
    print(f"{names[p.argmax()]}\t" + " ".join(f"{n}={q:.3f}" for n, q in zip(names, p)))


if __name__ == "__main__":
  cli.run(main)
