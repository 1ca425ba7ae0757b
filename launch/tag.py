r"""Tags every word of texts with a trained tagger (config.task="tagging", experiments/pos.py).

  python -m launch.tag --workdir=workdirs/pos-bilstm --text="The jury said it did not find any evidence ."
  python -m launch.tag --workdir=workdirs/pos-encoder --input_file=sentences.txt

Texts come from --text (repeatable), then --input_file (one text a line; "-" is stdin). For each,
one line of `word/TAG` (words and punctuation as the word tokenizer splits them).
"""

import launch
from transformer import cli, inference

_FLAGS = launch.define_text_labelling_flags("tagging", "tag")


def main(argv):
  del argv
  texts, trained = launch.texts_and_run(_FLAGS, "tagging", "tag")
  for tagged in inference.tag(trained, texts):
    print(" ".join(f"{word}/{tag}" for word, tag in tagged))


if __name__ == "__main__":
  cli.run(main)
