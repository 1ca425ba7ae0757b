"""The SentencePiece pairs of Marian (OPUS-MT) translation models: a source model, a target model, one vocab."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import sentencepiece

from transformer.errors import TokenizerError
from transformer.tokenizers.base import Tokenizer


class MarianTokenizer(Tokenizer):
  """A Marian (OPUS-MT) model's tokenizer pair, as `transformers.MarianTokenizer` reads its directory:
  two SentencePiece models, `source.spm` (the source language's pieces) and `target.spm` (the
  target's), and one `vocab.json` that gives every piece of both its id in the model's shared
  embedding. `encode` is what the encoder reads: the source's pieces, then `</s>` (Marian ends
  every source with it); `encode_target` is a target's pieces, which the translation pipeline ends
  with `</s>` (eot_id) itself; `decode` turns a translation's ids back into text through the
  target model, leaving out the special tokens (as Hugging Face's `skip_special_tokens=True`).

  As transformers does: a leading `>>xx<<` (a multilingual model's target-language code) is one
  token, and a piece that vocab.json lacks is `<unk>`. Unlike it, text is not Moses-normalised
  (transformers does that only when the optional `sacremoses` is installed), and the special
  tokens are refused in text, as every tokenizer here refuses them. The decoder starts from
  `<pad>` (Marian's `decoder_start_token_id`), which no translation may contain."""

  FILES = ("source.spm", "target.spm", "vocab.json")

  def __init__(self, source_spm: bytes, target_spm: bytes, vocab: dict[str, int], where: str = "marian"):
    self._protos = (source_spm, target_spm)
    try:
      self._source, self._target = (sentencepiece.SentencePieceProcessor(model_proto=p) for p in self._protos)
    except RuntimeError as e:
      raise TokenizerError(f"{where}: a .spm file is not a SentencePiece model ({e})") from None
    missing = [t for t in ("</s>", "<unk>", "<pad>") if t not in vocab]
    if missing:
      raise TokenizerError(f"{where}/vocab.json lacks {', '.join(missing)}: not a Marian vocabulary")
    if sorted(vocab.values()) != list(range(len(vocab))):
      raise TokenizerError(f"{where}/vocab.json does not number its pieces 0..{len(vocab) - 1} once each")
    self.vocab, self.name, self.vocab_size = dict(vocab), "marian", len(vocab)
    self._pieces = {i: p for p, i in vocab.items()}
    self.eot_id, self.unk_id, self.pad_id = vocab["</s>"], vocab["<unk>"], vocab["<pad>"]
    self.special_tokens = {"</s>": self.eot_id, "<unk>": self.unk_id, "<pad>": self.pad_id}

  @property
  def decoder_start_id(self) -> int:
    return self.pad_id

  @property
  def never_generated(self) -> tuple[int, ...]:
    return (self.pad_id,)

  @classmethod
  def from_directory(cls, directory: str | os.PathLike) -> MarianTokenizer:
    """The pair in a Marian model's directory (or a saved one): its source.spm, target.spm, vocab.json."""
    directory = Path(directory)
    missing = [name for name in cls.FILES if not (directory / name).is_file()]
    if missing:
      raise TokenizerError(
        f"{directory} has no {', '.join(missing)}: a Marian tokenizer is its model directory's "
        f"{', '.join(cls.FILES)} (MarianTokenizer.save_pretrained writes them)"
      )
    try:
      vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise TokenizerError(f"{directory / 'vocab.json'} is not JSON ({e})") from None
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
      raise TokenizerError(f"{directory / 'vocab.json'} is not a piece -> id mapping")
    source, target = ((directory / name).read_bytes() for name in cls.FILES[:2])
    return cls(source, target, vocab, str(directory))

  def _ids(self, model, text: str) -> list[int]:
    code = []
    if text.startswith(">>") and (end := text.find("<<")) != -1:  # a target-language code: one token
      code, text = [text[: end + 2]], text[end + 2 :]
    return [self.vocab.get(p, self.unk_id) for p in code + model.encode(text, out_type=str)]

  def _encode(self, text: str, allowed: set[str]) -> list[int]:
    return self._ids(self._source, text) + [self.eot_id]

  def encode_piece(self, text: str, *, allow_special: bool | Iterable[str] = False) -> list[int]:
    """The ids of `text` as a piece inside a document: without the BOS or EOS that `encode` adds to a
    whole text for models that expect them (HFTokenizer); a logit's target token, a word to find."""
    return self.encode(text, allow_special=allow_special)

  def encode_target(self, text: str) -> list[int]:
    self._allowed(text, False)
    return self._ids(self._target, text)

  def _decode(self, ids: list[int]) -> str:
    pieces = [self._pieces[i] for i in ids if i not in self.special_tokens.values()]
    return self._target.decode_pieces(pieces).replace("\u2581", " ").strip()

  def write_files(self, directory: Path) -> dict[str, str]:
    """Writes source.spm, target.spm and vocab.json (as MarianTokenizer.save_pretrained does); their sha256s."""
    files = dict(zip(self.FILES, (*self._protos, json.dumps(self.vocab, ensure_ascii=False, indent=2).encode())))
    for name, data in files.items():
      (Path(directory) / name).write_bytes(data)
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}

  def _config(self, directory: Path) -> dict:
    return {"kind": "marian", "name": self.name, **self.write_files(directory)}

  @classmethod
  def from_saved(cls, directory: Path, config: dict) -> MarianTokenizer:
    """The pair `_config` saved: its three files, each checked against the sha256 recorded."""
    for name in cls.FILES:
      if hashlib.sha256((directory / name).read_bytes()).hexdigest() != config[name]:
        raise TokenizerError(
          f"{directory / name} is not the file {directory / 'tokenizer.json'} records: the saved tokenizer was modified"
        )
    return cls.from_directory(directory)

  def __getstate__(self):  # SentencePiece processors do not pickle; their models do
    return {"protos": self._protos, "vocab": self.vocab}

  def __setstate__(self, state):
    self.__init__(*state["protos"], state["vocab"])
