"""Data: sources (named data sets and user files), preparation into token shards, and loading."""

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

__all__ = [
  "NAMED",
  "NAMED_COLUMNS",
  "PAIR_COLUMNS",
  "PrepareOptions",
  "Prepared",
  "Source",
  "default_dir",
  "ensure_prepared",
  "file_source",
  "lexicon_source",
  "load_prepared",
  "named_source",
  "prepare",
  "removed_if_left_empty",
]
