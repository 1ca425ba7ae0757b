"""Character-level (nanoGPT's shakespeare_char) and word-level tokenizers, built from a corpus."""

from __future__ import annotations

import collections
import re
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

from transformer.errors import TokenizerError
from transformer.tokenizers.base import EOT, UNK, Tokenizer


class CharTokenizer(Tokenizer):
  """One id per character seen in the corpus (sorted), then <|endoftext|>. nanoGPT's shakespeare_char."""

  def __init__(self, chars: str):
    if not chars:
      raise TokenizerError("a character tokenizer needs a non-empty corpus to take its characters from")
    self.chars = "".join(sorted(set(chars)))
    self.name = "char"
    self._id = {c: i for i, c in enumerate(self.chars)}
    self.eot_id = len(self.chars)
    self.vocab_size = len(self.chars) + 1
    self.special_tokens = {EOT: self.eot_id}

  @classmethod
  def from_corpus(cls, texts: Iterable[str]) -> CharTokenizer:
    seen: set[str] = set()
    for t in texts:
      seen.update(t)
    return cls("".join(seen))

  def _encode(self, text: str, allowed: set[str]) -> list[int]:
    ids: list[int] = []
    for i, part in enumerate(text.split(EOT) if EOT in allowed else [text]):
      if i:
        ids.append(self.eot_id)
      try:
        ids.extend(self._id[c] for c in part)
      except KeyError as e:
        c = e.args[0]
        raise TokenizerError(
          f"character {c!r} (U+{ord(c):04X}) is not in this character tokenizer's "
          f"vocabulary of {len(self.chars)} characters; build it from a corpus that "
          f"contains it"
        ) from None
    return ids

  def _decode(self, ids: list[int]) -> str:
    return "".join(EOT if i == self.eot_id else self.chars[i] for i in ids)

  def _config(self, directory: Path) -> dict:
    return {"kind": "char", "name": self.name, "chars": self.chars}

  @classmethod
  def from_saved(cls, directory: Path, config: dict) -> CharTokenizer:
    return cls(config["chars"])

  def fold(self, text: str) -> str:
    """`text` with each character this vocabulary lacks replaced by its unaccented letter (é -> e,
    by Unicode NFKD) when that is in the vocabulary, and dropped otherwise: how text from elsewhere
    (e.g. movie reviews for a model pretrained on Shakespeare's characters) is made encodable."""
    if all(c in self._id for c in text):
      return text
    out = []
    for c in text:
      if c in self._id:
        out.append(c)
      else:
        out.extend(b for b in unicodedata.normalize("NFKD", c) if b in self._id and not unicodedata.combining(b))
    return "".join(out)


# Words: runs of letters/digits with inner hyphens or apostrophes ("term-end", "Atlanta's"), or a
# run of other non-space characters (punctuation: ",", "``", "--").
_WORD = re.compile(r"\w+(?:[-'’]\w+)*|[^\w\s]+")


def split_words(text: str) -> list[str]:
  """The words of `text` as the word tokenizer (and launch.tag) sees them."""
  return _WORD.findall(text)


class WordTokenizer(Tokenizer):
  """One id per word of a vocabulary (the most frequent words of a training corpus), <|unk|> for any
  other word, then <|endoftext|>. Text is split into words and punctuation (`split_words`), so
  `decode` joins words with single spaces: it gives back the words, not the original spacing."""

  def __init__(self, words: Sequence[str], lowercase: bool = False):
    if not words:
      raise TokenizerError("a word tokenizer needs a non-empty vocabulary")
    self.words = list(words)
    self.lowercase = lowercase
    self.name = "word"
    self._id = {w: i for i, w in enumerate(self.words)}
    self.unk_id, self.eot_id = len(self.words), len(self.words) + 1
    self.vocab_size = len(self.words) + 2
    self.special_tokens = {UNK: self.unk_id, EOT: self.eot_id}

  @classmethod
  def from_corpus(cls, texts: Iterable[str], vocab_size: int, lowercase: bool = False) -> WordTokenizer:
    """The `vocab_size - 2` most frequent words of `texts` (ties: the first seen), <|unk|>, <|endoftext|>."""
    if vocab_size < 3:
      raise TokenizerError(f"word vocab_size must be at least 3 (a word, <|unk|>, <|endoftext|>), got {vocab_size}")
    counts = collections.Counter()
    for text in texts:
      counts.update(split_words(text.lower() if lowercase else text))
    counts.pop(UNK, None), counts.pop(EOT, None)
    return cls([w for w, _ in counts.most_common(vocab_size - 2)], lowercase)

  def _encode(self, text: str, allowed: set[str]) -> list[int]:
    if self.lowercase:
      text = text.lower()
      allowed = {t.lower() for t in allowed}
    ids: list[int] = []
    specials = {t.lower() if self.lowercase else t: i for t, i in self.special_tokens.items()}
    pieces = re.split(f"({'|'.join(map(re.escape, allowed))})", text) if allowed else [text]
    for piece in pieces:
      if piece in allowed:
        ids.append(specials[piece])
      else:
        ids.extend(self._id.get(w, self.unk_id) for w in split_words(piece))
    return ids

  def _decode(self, ids: list[int]) -> str:
    names = {i: t for t, i in self.special_tokens.items()}
    return " ".join(names[i] if i in names else self.words[i] for i in ids)

  def _config(self, directory: Path) -> dict:
    return {"kind": "word", "name": self.name, "lowercase": self.lowercase, "words": self.words}

  @classmethod
  def from_saved(cls, directory: Path, config: dict) -> WordTokenizer:
    return cls(config["words"], config["lowercase"])


def fit_text(tokenizer: Tokenizer, text: str) -> str:
  """`text` made encodable by `tokenizer`: a character tokenizer folds characters it lacks
  (`CharTokenizer.fold`); every other tokenizer encodes any text (bytes, or <|unk|>) as it is."""
  return tokenizer.fold(text) if isinstance(tokenizer, CharTokenizer) else text


def word_pieces(tokenizer: Tokenizer, words: Sequence[str]) -> tuple[list[int], list[int]]:
  """(token ids of the words as one text, the index of each word's first token). Words after the
  first are encoded with the space before them (as BPE sees them inside a text); a word's first
  token is its first one with a non-space character, where a tagger predicts the word's tag (the
  other tokens of the word are masked out of the loss and the accuracy)."""
  ids: list[int] = []
  firsts: list[int] = []
  for i, word in enumerate(words):
    pieces = tokenizer.encode(fit_text(tokenizer, (" " if i else "") + word))
    if not pieces:  # e.g. a word of characters a char vocabulary lacks
      pieces = tokenizer.encode(" ") if isinstance(tokenizer, CharTokenizer) and " " in tokenizer.chars else []
      if not pieces:
        raise TokenizerError(f"word {i} ({word!r}) encodes to no token with the {tokenizer.name} tokenizer")
    first = next((j for j, t in enumerate(pieces) if tokenizer.decode([t]).strip()), 0)
    firsts.append(len(ids) + first)
    ids.extend(pieces)
  return ids, firsts


# ---------------------------------------------------------------------------------------------
# tiktoken's pretrained encodings, offline.
