"""Data: sources (named data sets and user files), preparation into token shards, and loading."""

from transformer.data.prepare import PrepareOptions, Prepared, default_dir, load_prepared, prepare
from transformer.data.sources import DataError, NAMED, Source, file_source, named_source

__all__ = ["DataError", "NAMED", "PrepareOptions", "Prepared", "Source", "default_dir", "file_source",
           "load_prepared", "named_source", "prepare"]
