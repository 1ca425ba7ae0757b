"""Fuzzy matches from a translation memory, for neural fuzzy repair (Bulté & Tezcan 2019, "Neural
Fuzzy Repair: Integrating Fuzzy Matches into Neural Machine Translation").

The memory is the training pairs. A source's fuzzy match is the training pair whose source shares
the most rare token unigrams and bigrams with it, each weighted by its inverse document frequency
(features in more than `max_df` of the sources, such as punctuation and function words, weigh
nothing), and never a pair with the very same source. The model then reads

    source tokens, <|endoftext|>, the match's target tokens

and learns to copy what fits (a rare word's translation, a turn of phrase) and to ignore the rest.
Training pairs are matched against the other training pairs, exactly as a dev or test sentence is
matched against all of them, so the model never sees its own reference in its input.

    >>> memory = TranslationMemory(train_pairs)
    >>> [source_with_match] = memory.augment([source], hint_tokens=32, separator=tokenizer.eot_id)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from transformer.errors import DataError

if TYPE_CHECKING:
  import scipy.sparse

_QUERY_CHUNK = 2048  # sources scored at once: a chunk's score matrix is chunk x memory, sparse


def _features(source: np.ndarray) -> list[tuple[int, ...]]:
  tokens = [int(t) for t in source]
  return [(t,) for t in tokens] + list(zip(tokens, tokens[1:]))


class TranslationMemory:
  """The (source ids, target ids) pairs a model was trained on, indexed for fuzzy matching."""

  def __init__(self, pairs: Sequence[tuple[np.ndarray, np.ndarray]], max_df: float = 0.02):
    if not pairs:
      raise DataError("a translation memory needs training pairs; the training split is empty")
    if not 0.0 < max_df <= 1.0:
      raise DataError(f"max_df must be in (0, 1], got {max_df}")
    self.sources = [np.asarray(s, np.int32) for s, _ in pairs]
    self.targets = [np.asarray(t, np.int32) for _, t in pairs]
    self.max_df = max_df
    columns: dict[tuple[int, ...], int] = {}
    rows = [sorted({columns.setdefault(f, len(columns)) for f in _features(s)}) for s in self.sources]
    n = len(rows)
    df = np.bincount(np.concatenate([np.asarray(r, np.int64) for r in rows]), minlength=len(columns))
    # Inverse document frequency; features too common to tell sentences apart weigh nothing.
    self._idf = np.where(df <= max_df * n, np.log(n / np.maximum(df, 1)), 0.0)
    self._columns = columns
    self._memory_NxF = self._binary(rows).T.tocsr()  # F x N after the transpose: one column per pair

  def _binary(self, rows: list[list[int]]) -> scipy.sparse.csr_matrix:
    import scipy.sparse  # here, not at the top: every launch program imports this module, few match

    indptr = np.cumsum([0] + [len(r) for r in rows])
    indices = np.asarray([c for r in rows for c in r], np.int64)
    return scipy.sparse.csr_matrix((np.ones(len(indices)), indices, indptr), shape=(len(rows), len(self._columns)))

  def match(self, sources: Sequence[np.ndarray]) -> list[int | None]:
    """The index of each source's fuzzy match (None when it shares no rare feature with any pair)."""
    out: list[int | None] = []
    for start in range(0, len(sources), _QUERY_CHUNK):
      chunk = [np.asarray(s, np.int32) for s in sources[start : start + _QUERY_CHUNK]]
      rows = [sorted({self._columns[f] for f in _features(s) if f in self._columns}) for s in chunk]
      weighted_QxF = self._binary(rows).multiply(self._idf[None]).tocsr()
      scores_QxN = (weighted_QxF @ self._memory_NxF).tocsr()
      for q, source in enumerate(chunk):
        lo, hi = scores_QxN.indptr[q], scores_QxN.indptr[q + 1]
        candidates, values = scores_QxN.indices[lo:hi], scores_QxN.data[lo:hi]
        best = None
        # Highest score first, the lower index on a tie (deterministic); skip the very same source.
        for i in np.lexsort((candidates, -values)):
          if values[i] <= 0:
            break
          if not np.array_equal(self.sources[candidates[i]], source):
            best = int(candidates[i])
            break
        out.append(best)
    return out

  def augment(self, sources: Sequence[np.ndarray], hint_tokens: int, separator: int) -> list[np.ndarray]:
    """Each source followed by `separator` and the first `hint_tokens` tokens of its match's target
    (only the separator when it has no match)."""
    return [
      np.concatenate([s, [separator], self.targets[m][:hint_tokens] if m is not None else []]).astype(np.int32)
      for s, m in zip(sources, self.match(sources))
    ]

  def save(self, path: Path) -> None:
    """The pairs as one .npz (the index is rebuilt on load: it is a function of the pairs)."""
    lengths = lambda xs: np.asarray([len(x) for x in xs], np.int64)
    with open(path, "wb") as f:
      np.savez(
        f,
        sources=np.concatenate(self.sources),
        source_lengths=lengths(self.sources),
        targets=np.concatenate(self.targets),
        target_lengths=lengths(self.targets),
        max_df=np.asarray(self.max_df),
      )

  @classmethod
  def load(cls, path: Path) -> TranslationMemory:
    try:
      with np.load(path) as z:
        split = lambda key: np.split(z[key], np.cumsum(z[f"{key[:-1]}_lengths"])[:-1])
        return cls(list(zip(split("sources"), split("targets"))), float(z["max_df"]))
    except (OSError, KeyError, ValueError) as e:
      raise DataError(
        f"{path}: not a readable translation memory ({e}); translate with the workdir that "
        f"training wrote, or train again"
      ) from None
