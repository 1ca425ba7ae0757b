"""The interface every tokenizer has (`Tokenizer`), its special tokens, and what works on any of them."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from transformer.errors import TokenizerError

EOT = "<|endoftext|>"
UNK = "<|unk|>"  # the word tokenizer's id for every word outside its vocabulary
CONFIG_FILE = "tokenizer.json"


class Tokenizer:
  """Shared behaviour; subclasses implement `_encode`, `_decode` and `_config`."""

  name: str
  vocab_size: int  # one more than the largest id (embedding tables are this big)
  eot_id: int
  special_tokens: dict[str, int]

  def encode(self, text: str, *, allow_special: bool | Iterable[str] = False) -> list[int]:
    """Token ids of `text`. Special tokens in the text are an error unless allowed by name (or all)."""
    return self._encode(text, self._allowed(text, allow_special))

  def encode_piece(self, text: str, *, allow_special: bool | Iterable[str] = False) -> list[int]:
    """The ids of `text` as a piece inside a document: without the BOS or EOS that `encode` adds to a
    whole text for models that expect them (HFTokenizer); a logit's target token, a word to find."""
    return self.encode(text, allow_special=allow_special)

  def encode_target(self, text: str) -> list[int]:
    """The ids of a translation's target side (one vocabulary for both sides: `encode`'s; a Marian
    pair encodes each side with its own model)."""
    return self.encode(text)

  @property
  def decoder_start_id(self) -> int:
    """The token an encoder-decoder's decoder starts from: <|endoftext|>, as our translation runs
    train (Marian's: <pad>)."""
    return self.eot_id

  @property
  def never_generated(self) -> tuple[int, ...]:
    """Ids a translation may not contain (Marian's <pad>, its decoder's start)."""
    return ()

  def encode_arrays(
    self, texts: Sequence[str], *, allow_special: bool | Iterable[str] = False, num_threads: int = 1
  ) -> list[np.ndarray]:
    """`encode` of each text as a uint32 array. A tokenizer that can (tiktoken's) encodes them on
    `num_threads` threads and writes the ids straight into the arrays, never making Python ints of
    them: what preparing a large corpus needs."""
    return [np.asarray(self.encode(t, allow_special=allow_special), np.uint32) for t in texts]

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    ids = [int(i) for i in np.asarray(ids, dtype=np.int64).reshape(-1)]
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise TokenizerError(f"cannot decode id {bad[0]}: {self.name} has ids 0..{self.vocab_size - 1}")
    return self._decode(ids)

  def save(self, directory: str | os.PathLike) -> Path:
    """Writes the tokenizer to `directory` so that `load_tokenizer(directory)` gives it back."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps(self._config(directory), indent=2) + "\n")
    return directory

  def _allowed(self, text: str, allow_special: bool | Iterable[str]) -> set[str]:
    if allow_special is True:
      allowed = set(self.special_tokens)
    elif allow_special is False:
      allowed = set()
    else:
      allowed = set(allow_special)
      unknown = allowed - set(self.special_tokens)
      if unknown:
        raise TokenizerError(
          f"unknown special token(s) {sorted(unknown)} for {self.name}; "
          f"its special tokens are {sorted(self.special_tokens)}"
        )
    for token in self.special_tokens:
      if token not in allowed and token in text:
        raise TokenizerError(
          f"text contains the special token {token!r} at character {text.index(token)}; pass "
          f"allow_special=True (or a set naming it; --allow_special in launch.sample and launch.evaluate) to "
          f"encode it as id {self.special_tokens[token]}, or remove it from the text"
        )
    return allowed

  def __repr__(self) -> str:
    return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


class NoTokenizer(Tokenizer):
  """The tokenizer of a model directory without tokenizer files: its ids alone (`vocab_size`), and one
  error for anything that needs text."""

  special_tokens: dict[str, int] = {}

  def __init__(self, vocab_size: int, where: str):
    self.vocab_size, self.name, self.eot_id = vocab_size, f"no tokenizer ({where})", vocab_size - 1

  def _refuse(self, *_args, **_kwargs):
    raise TokenizerError(
      f"{self.name.removeprefix('no tokenizer (').removesuffix(')')} has no tokenizer.json: the model opens "
      f"alone, on token ids; put the model's tokenizer.json and tokenizer_config.json beside it for text"
    )

  _encode = _decode = _config = encode_piece = _refuse


def identical(a: Tokenizer, b: Tokenizer) -> bool:
  """Whether two tokenizers give the same ids to every text: their saved configs are equal (a
  trained BPE's names its ranks by sha256)."""
  with tempfile.TemporaryDirectory() as da, tempfile.TemporaryDirectory() as db:
    return json.loads((a.save(da) / CONFIG_FILE).read_text()) == json.loads((b.save(db) / CONFIG_FILE).read_text())
