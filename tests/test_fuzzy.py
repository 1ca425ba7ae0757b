"""The translation memory of neural fuzzy repair (transformer.data.fuzzy): which pair is a source's
fuzzy match, what the model then reads, and the memory on disk."""

import numpy as np
import pytest

from transformer.data.fuzzy import TranslationMemory
from transformer.errors import DataError

THE, DOT = 1, 2  # in every source: too common to tell sentences apart


def _pairs():
  sources = [
    [THE, 10, 11, DOT],
    [THE, 10, 12, DOT],
    [THE, 13, 14, DOT],
    [THE, 10, 11, DOT],
    [THE, 15, 16, 17, DOT],
    [THE, 18, DOT],
    [THE, 19, DOT],
    [THE, 20, 21, DOT],
  ]
  return [(np.array(s), np.array([100 + i, 200 + i, 300 + i])) for i, s in enumerate(sources)]


def test_the_match_shares_the_rarest_tokens_and_never_has_the_same_source():
  memory = TranslationMemory(_pairs(), max_df=0.4)
  assert memory.match([np.array([THE, 13, 99, DOT])]) == [2]  # shares 13
  # Pairs 0 and 3 have this very source: the match is the pair that shares token 10 alone.
  assert memory.match([np.array([THE, 10, 11, DOT])]) == [1]
  # Bigrams count: (15, 16) and (16, 17) as well as the tokens.
  assert memory.match([np.array([THE, 15, 16, 17, DOT])]) == [None]  # pair 4 is the same source; no other shares
  assert memory.match([np.array([THE, 16, 17, 21, DOT])]) == [4]
  # Only common tokens (or unknown ones) shared: no match.
  assert memory.match([np.array([THE, DOT]), np.array([THE, 99, DOT])]) == [None, None]
  # A tie (one rare token each, equally rare) goes to the lower index.
  assert memory.match([np.array([THE, 18, 19, DOT])]) == [5]


def test_training_sources_are_matched_against_the_others_exactly_as_new_ones_are():
  pairs = _pairs()
  memory = TranslationMemory(pairs, max_df=0.4)
  matches = memory.match([s for s, _ in pairs])
  assert matches == [1, 0, None, 1, None, None, None, None]
  for i, m in enumerate(matches):
    assert m is None or not np.array_equal(pairs[m][0], pairs[i][0])  # never its own reference


def test_augment_appends_the_separator_and_the_start_of_the_matchs_target():
  memory = TranslationMemory(_pairs(), max_df=0.4)
  sep = 0
  with_match, without = memory.augment(
    [np.array([THE, 13, DOT]), np.array([THE, 99, DOT])], hint_tokens=2, separator=sep
  )
  np.testing.assert_array_equal(with_match, [THE, 13, DOT, sep, 102, 202])
  np.testing.assert_array_equal(without, [THE, 99, DOT, sep])
  assert with_match.dtype == np.int32


def test_a_saved_memory_loads_with_the_same_matches(tmp_path):
  pairs = _pairs()
  memory = TranslationMemory(pairs, max_df=0.4)
  memory.save(tmp_path / "tm.npz")
  loaded = TranslationMemory.load(tmp_path / "tm.npz")
  assert loaded.max_df == 0.4 and len(loaded.sources) == len(pairs)
  queries = [s for s, _ in pairs] + [np.array([THE, 16, 17, 21, DOT])]
  assert loaded.match(queries) == memory.match(queries)
  (tmp_path / "bad.npz").write_bytes(b"not a memory")
  with pytest.raises(DataError, match="bad.npz: not a readable translation memory"):
    TranslationMemory.load(tmp_path / "bad.npz")


def test_an_empty_memory_is_refused():
  with pytest.raises(DataError, match="needs training pairs"):
    TranslationMemory([])
