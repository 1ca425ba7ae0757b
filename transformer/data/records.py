"""What each data kind writes of a record into a split's files (the layout transformer.data.prepare's
docstring describes): `SplitWriter` appends a split's token ids and keeps its index rows and labels; one
record writer a kind (`RECORD_WRITERS`: sentence pairs, labelled texts, tagged sentences) turns a record
into them; text, tokenized in batches on threads, is written piece by piece (`write_text_piece`); a
lexicon's training-only pairs go to a split of their own (`write_lexicon`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import ClassVar

import numpy as np

from transformer import tokenizers
from transformer.data.sources import Source, records
from transformer.errors import DataError

LEXICON = "lexicon"  # the training-only pairs of a lexicon source, when one was prepared


class SplitWriter:
  """Appends token ids of one split to binary files and keeps its index rows."""

  def __init__(self, directory: Path, split: str, kind: str, dtype):
    columns = ("src", "tgt") if kind == "pairs" else ("",)
    self.kind = kind
    self.paths = [directory / (f"{split}.{c}.bin" if c else f"{split}.bin") for c in columns]
    self.files = [open(p, "wb") for p in self.paths]
    self.lengths = [0] * len(columns)
    self.dtype = dtype
    self.rows: list[tuple] = []
    self.labels: list[float] = []
    self.documents: set[int] = set()

  def append(self, column: int, ids: list[int] | np.ndarray) -> tuple[int, int]:
    np.asarray(ids, self.dtype).tofile(self.files[column])
    start = self.lengths[column]
    self.lengths[column] += len(ids)
    return start, start + len(ids)

  def close(self, directory: Path, split: str) -> None:
    for f in self.files:
      f.close()
    width = {"text": 4, "pairs": 5, "classification": 3, "tagged": 3}[self.kind]
    np.save(directory / f"{split}.idx.npy", np.asarray(self.rows, dtype=np.int64).reshape(-1, width))
    if self.kind == "classification":
      np.save(directory / f"{split}.labels.npy", np.asarray(self.labels, dtype=str))
    elif self.kind == "tagged":
      np.save(directory / f"{split}.labels.npy", np.asarray(self.labels, dtype=np.int16))


def write_text_piece(w: SplitWriter, doc: int, piece: int, ids, last: bool, eot_id: int) -> None:
  """A text piece's ids; a document's last piece ends with <|endoftext|>."""
  start, end = w.append(0, ids)
  if last:
    w.append(0, [eot_id])
  w.rows.append((doc, piece, start, end))
  w.documents.add(doc)


class RecordWriter:
  """One data kind's records -> a split's files: `write` each record (with the split it went to); what the
  kind learns on the way (the tags seen) is read after the last."""

  kind: ClassVar[str]

  def __init__(self, tokenizer, lexicon: bool):
    self.tokenizer = tokenizer

  def write(self, w: SplitWriter, split: int, lineno: int, rec: tuple) -> None:
    raise NotImplementedError

  def label_names(self, source_name: str) -> list[str]:
    """The names of the labels the records' indices stand for (`source_name`'s, for an error)."""
    return []


class PairRecords(RecordWriter):
  """Sentence pairs: the source tokens in column 0, the target's in 1. With a lexicon, the keys of every pair
  and of the validation and test pairs' sides, which no lexicon pair may repeat."""

  kind = "pairs"

  def __init__(self, tokenizer, lexicon: bool):
    super().__init__(tokenizer, lexicon)
    self.lexicon = lexicon
    self.held_out: set[str] = set()
    self.sentence_pairs: set[bytes] = set()

  def write(self, w: SplitWriter, split: int, lineno: int, rec: tuple) -> None:
    a = w.append(0, self.tokenizer.encode(rec[0]))
    b = w.append(1, self.tokenizer.encode_target(rec[1]))
    w.rows.append((lineno, *a, *b))
    if self.lexicon:
      self.sentence_pairs.add(pair_key(rec))
      if split:
        self.held_out.update(map(side_key, rec))


class LabelledRecords(RecordWriter):
  """A label and a text: the text's tokens (cut to the tokenizer's fit), the label as written."""

  kind = "classification"

  def write(self, w: SplitWriter, split: int, lineno: int, rec: tuple) -> None:
    w.rows.append((lineno, *w.append(0, self.tokenizer.encode(tokenizers.fit_text(self.tokenizer, rec[1])))))
    w.labels.append(rec[0])


class TaggedRecords(RecordWriter):
  """A sentence of (word, tag): the words' tokens, the tag's index at each word's first token, -1 at the others."""

  kind = "tagged"

  def __init__(self, tokenizer, lexicon: bool):
    super().__init__(tokenizer, lexicon)
    self.tags: dict[str, int] = {}

  def write(self, w: SplitWriter, split: int, lineno: int, rec: tuple) -> None:
    ids, firsts = tokenizers.word_pieces(self.tokenizer, [word for word, _ in rec])
    labels = np.full(len(ids), -1, np.int16)
    labels[firsts] = [self.tags.setdefault(tag, len(self.tags)) for _, tag in rec]
    w.rows.append((lineno, *w.append(0, ids)))
    w.labels.extend(labels.tolist())

  def label_names(self, source_name: str) -> list[str]:
    if len(self.tags) > np.iinfo(np.int16).max:
      raise DataError(
        f"{source_name} has {len(self.tags)} distinct tags; at most {np.iinfo(np.int16).max} are supported"
      )
    return list(self.tags)


RECORD_WRITERS = {c.kind: c for c in (PairRecords, LabelledRecords, TaggedRecords)}


def side_key(text: str) -> str:
  return " ".join(text.split()).casefold()


def pair_key(rec: tuple) -> bytes:
  return hashlib.blake2b(repr(tuple(map(side_key, rec))).encode(), digest_size=12).digest()


def write_lexicon(
  lexicon: Source, tokenizer, dtype, directory: Path, held_out: set[str], sentence_pairs: set[bytes]
) -> dict:
  """The lexicon's pairs into the `lexicon` split: once each, none that repeats a sentence pair or
  has a side of a validation or test pair (compared case- and space-insensitively)."""
  w = SplitWriter(directory, LEXICON, "pairs", dtype)
  counts = {"records": 0, "tokens": 0, "chars": 0, "duplicates": 0, "held_out": 0}
  seen = set(sentence_pairs)
  try:
    for _, lineno, rec in records(lexicon):
      key = pair_key(rec)
      if key in seen:
        counts["duplicates"] += 1
      elif any(side_key(side) in held_out for side in rec):
        counts["held_out"] += 1
      else:
        seen.add(key)
        w.rows.append((lineno, *w.append(0, tokenizer.encode(rec[0])), *w.append(1, tokenizer.encode_target(rec[1]))))
        counts["chars"] += len(rec[0]) + len(rec[1])
  finally:
    w.close(directory, LEXICON)
  counts.update(records=len(w.rows), documents=len(w.rows), tokens=int(sum(w.lengths)))
  return counts
