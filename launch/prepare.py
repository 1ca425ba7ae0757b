r"""Tokenizes a data set into train/validation/test shards.

python -m launch.prepare                                   # Shakespeare, GPT-2 BPE, into data/
python -m launch.prepare --dataset=ding_de_en --tokenizer=bpe --vocab_size=8000
python -m launch.prepare --input_files=a.txt,b.txt --tokenizer=char --output_dir=data/mine
python -m launch.prepare --input_files='corpus/**/*.txt.gz'       # a directory, a glob; .gz/.zst stream
python -m launch.prepare --input_files=pairs.tsv --input_format=pairs
python -m launch.prepare --dataset=ding_de_en --tokenizer=bpe --vocab_size=2000 --lexicon=dictionary
python -m launch.prepare --dataset=brown --tokenizer=word --vocab_size=20000 --test_fraction=0.1
"""

from absl import flags

from transformer import cli, data
from transformer.data import show

_DATASET = flags.DEFINE_enum("dataset", "shakespeare", data.NAMED, "A named data set (fetched offline).")
_INPUT_FILES = flags.DEFINE_list(
  "input_files",
  None,
  "Your own files instead of --dataset: text "
  "documents (one per file), TSV sentence pairs (--input_format=pairs), "
  "label<TAB>text lines (classification) or word/TAG sentences (tagged).",
)
_INPUT_FORMAT = flags.DEFINE_enum("input_format", "text", data.sources.KINDS, "Format of --input_files.")
_TOKENIZER = flags.DEFINE_string(
  "tokenizer",
  "gpt2",
  "gpt2 | cl100k_base | char | bpe | word, or the "
  "directory of a saved tokenizer (e.g. a training workdir's tokenizer/).",
)
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", None, "Vocabulary size of a trained 'bpe' or 'word' tokenizer.")
_LOWERCASE = flags.DEFINE_bool("lowercase", False, "'word': lower-case the text first.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where to write (default data/<name>-<tokenizer>).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the train/validation/test split.")
_VALIDATION = flags.DEFINE_float("validation_fraction", 0.1, "Share of the data held out for validation.")
_TEST = flags.DEFINE_float("test_fraction", 0.0, "Share of the data held out for testing.")
_PIECE_CHARS = flags.DEFINE_integer(
  "piece_chars",
  16384,
  "Documents are split into pieces cut at the first line end past this many characters; pieces go to splits.",
)
_LEXICON = flags.DEFINE_string(
  "lexicon",
  "",
  "Pairs: training-only pairs beside the sentences, 'dictionary' "
  "(the data set's own word and phrase entries: ding_de_en) or a TSV file.",
)
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace a different preparation in --output_dir.")
_NUM_WORKERS = flags.DEFINE_integer(
  "num_workers",
  0,
  "Threads (gpt2, cl100k_base, bpe) or processes (char, word; inputs of 32 MB or more) that tokenize text; "
  "0: every core. The output is the same for any count.",
)


def main(argv):
  del argv
  if _INPUT_FILES.value:
    source = data.file_source(_INPUT_FILES.value, _INPUT_FORMAT.value)
  else:
    source = data.named_source(_DATASET.value)
  options = data.PrepareOptions(
    tokenizer=_TOKENIZER.value,
    vocab_size=_VOCAB_SIZE.value,
    lowercase=_LOWERCASE.value,
    seed=_SEED.value,
    validation_fraction=_VALIDATION.value,
    test_fraction=_TEST.value,
    piece_chars=_PIECE_CHARS.value,
    num_workers=_NUM_WORKERS.value,
  )
  lexicon = data.lexicon_source(_LEXICON.value, source)
  out_dir = _OUTPUT_DIR.value or data.default_dir(source, options, lexicon=lexicon)
  data.prepare(source, out_dir, options, lexicon=lexicon, overwrite=_OVERWRITE.value)
  print(show.summary(data.load_prepared(out_dir)))


if __name__ == "__main__":
  cli.run(main)
