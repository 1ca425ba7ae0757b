"""Data: sources (named data sets and user files), preparation into token shards, and loading.

A run's config.data (transformer.config.DataConfig, plain values) is read here: `source_of` gives its
files, `prepared_for` its tokens (prepared on first use), `check_config` checks it before anything is
read, `column_names` names a pair's columns without reading the data.
"""

from pathlib import Path

from transformer.data.prepare import (
  Prepared,
  PrepareOptions,
  default_dir,
  ensure_prepared,
  load_prepared,
  prepare,
  removed_if_left_empty,
)
from transformer.data.sources import (
  NAMED,
  NAMED_COLUMNS,
  PAIR_COLUMNS,
  Source,
  file_source,
  lexicon_source,
  named_source,
)
from transformer.errors import ConfigError, UserError


def prepare_options(data_config) -> PrepareOptions:
  """config.data's options of how its text is tokenized and split."""
  c = data_config
  return PrepareOptions(
    tokenizer=c.tokenizer,
    vocab_size=c.vocab_size or None,
    lowercase=c.lowercase,
    seed=c.split_seed,
    validation_fraction=c.validation_fraction,
    test_fraction=c.test_fraction,
    piece_chars=c.piece_chars,
  )


def check_config(data_config) -> None:
  """One error naming the config.data value that cannot be prepared (before any file is read)."""
  try:
    prepare_options(data_config).check()
  except UserError as e:
    raise ConfigError(f"--config.data: {e}") from None


def source_of(data_config, kind: str) -> Source:
  """The files of config.data's data set (a named one is fetched on first use), read as `kind` records."""
  c = data_config
  return file_source(list(c.input_files), kind) if c.input_files else named_source(c.dataset)


def column_names(data_config) -> tuple[str, ...]:
  """The names of a pair's two columns, known without reading or fetching the data: the named data
  set's (ding_de_en: de, en), or source and target for a TSV of your own."""
  c = data_config
  return PAIR_COLUMNS if c.input_files else NAMED_COLUMNS.get(c.dataset, PAIR_COLUMNS)


def prepared_for(data_config, source: Source) -> Prepared:
  """`source` tokenized per config.data's options, prepared now if it has not been."""
  c, options = data_config, prepare_options(data_config)
  lexicon = lexicon_source(c.lexicon, source)
  directory = Path(c.dir) if c.dir else default_dir(source, options, c.root, lexicon)
  return ensure_prepared(source, directory, options, lexicon)


__all__ = [
  "NAMED",
  "NAMED_COLUMNS",
  "PAIR_COLUMNS",
  "PrepareOptions",
  "Prepared",
  "Source",
  "default_dir",
  "check_config",
  "column_names",
  "ensure_prepared",
  "file_source",
  "lexicon_source",
  "load_prepared",
  "named_source",
  "prepare",
  "prepare_options",
  "prepared_for",
  "removed_if_left_empty",
  "source_of",
]
