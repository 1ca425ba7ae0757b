"""Tokenizers, one module a kind: tiktoken encodings (gpt2, cl100k_base), character level, word level, BPE trained
with rustbpe, the SentencePiece pairs of Marian (OPUS-MT) translation models, and the tokenizer.json
of the open families (Llama, Qwen, Gemma, Pythia, OLMo, SmolLM) through Hugging Face's `tokenizers`.

Every tokenizer has the same small interface (`encode`, `encode_arrays`, `decode`, `vocab_size`,
`eot_id`, `save`), and special tokens are explicit: text that contains `<|endoftext|>` is refused
unless the caller allows it, because silently encoding a document separator that came from user
text is how training data gets corrupted.

    >>> tok = get_tokenizer("gpt2")
    >>> tok.encode("hello my name is\\n")
    [31373, 616, 1438, 318, 198]
    >>> bpe = get_tokenizer("bpe", corpus=open("input.txt").read().splitlines(), vocab_size=8192)
    >>> bpe.save("run/tokenizer"); load_tokenizer("run/tokenizer")
    >>> words = get_tokenizer("word", corpus=texts, vocab_size=20000, lowercase=True)
    >>> words.decode(words.encode("The jury said it."))     # unseen words come back as <|unk|>
    'the jury said it .'
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from transformer.errors import TokenizerError
from transformer.tokenizers.base import CONFIG_FILE, EOT, UNK, NoTokenizer, Tokenizer, identical
from transformer.tokenizers.bpe import (
  ENCODINGS,
  TiktokenTokenizer,
  encoding,
  from_saved_bpe,
  seed_tiktoken_cache,
  train_bpe,
)
from transformer.tokenizers.hf import HFTokenizer, has_vocab_and_merges, is_hf_tokenizer
from transformer.tokenizers.marian import MarianTokenizer
from transformer.tokenizers.words import CharTokenizer, WordTokenizer, fit_text, split_words, word_pieces

# rustbpe logs every 1% of its merges through Python logging; keep its warnings only.
logging.getLogger("rustbpe").setLevel(logging.WARNING)


def is_marian_pair(directory: str | os.PathLike) -> bool:
  """Whether `directory` holds a Marian tokenizer pair (MarianTokenizer.FILES): a Marian model's, or saved."""
  return (Path(directory) / MarianTokenizer.FILES[0]).is_file()


def is_saved(directory: str | os.PathLike) -> bool:
  """Whether `directory` holds what `load_tokenizer` reads: a saved or Hugging Face tokenizer.json, a Marian
  model's pair, or GPT-2's vocab.json + merges.txt."""
  directory = Path(directory)
  return (directory / CONFIG_FILE).is_file() or is_marian_pair(directory) or has_vocab_and_merges(directory)


def saved_sha256(directory: str | os.PathLike) -> str:
  """The sha256 of what makes a saved tokenizer (its tokenizer.json, or a Marian directory's three
  files): the name of the data prepared with it."""
  directory = Path(directory)
  names = (CONFIG_FILE,) if (directory / CONFIG_FILE).exists() else MarianTokenizer.FILES
  if is_hf_tokenizer(directory):
    names = tuple(n for n in HFTokenizer.FILES if (directory / n).exists())
  elif has_vocab_and_merges(directory) and not (directory / CONFIG_FILE).exists():
    names = tuple(n for n in ("vocab.json", "merges.txt", "tokenizer_config.json") if (directory / n).exists())
  digest = hashlib.sha256()
  for name in names:
    digest.update((directory / name).read_bytes())
  return digest.hexdigest()


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
  """Loads what `Tokenizer.save` wrote (its tokenizer.json's `kind`: `SAVED_KINDS`), a Hugging Face
  tokenizer.json, or a Marian model directory's tokenizer pair."""
  directory = Path(directory)
  config_path = directory / CONFIG_FILE
  if is_marian_pair(directory) and not config_path.exists():  # a Marian model's directory
    return MarianTokenizer.from_directory(directory)
  if has_vocab_and_merges(directory) and not config_path.exists():  # GPT-2's own files
    return HFTokenizer.from_vocab_and_merges(directory)
  if not config_path.exists():
    raise TokenizerError(f"no saved tokenizer at {directory} (looked for {config_path})")
  if is_hf_tokenizer(directory):
    return HFTokenizer.from_directory(directory)
  config = json.loads(config_path.read_text())
  kind = config.get("kind")
  if kind not in SAVED_KINDS:
    raise TokenizerError(f"{config_path} has unknown tokenizer kind {kind!r}")
  return SAVED_KINDS[kind](directory, config)


# What `Tokenizer.save` writes as tokenizer.json's "kind" (each class's `_config`) -> what reads it back.
SAVED_KINDS = {
  "tiktoken": lambda directory, config: encoding(config["name"]),
  "bpe": from_saved_bpe,
  "char": CharTokenizer.from_saved,
  "word": WordTokenizer.from_saved,
  "marian": MarianTokenizer.from_saved,
}


NAMES = ("gpt2", "r50k_base", "cl100k_base", "char", "bpe", "word")  # what get_tokenizer builds


def get_tokenizer(name: str, **options) -> Tokenizer:
  """`gpt2` | `r50k_base` | `cl100k_base` | `char` (corpus= or path=) | `bpe` (corpus= and vocab_size=, or
  path=) | `word` (corpus=, vocab_size= and optionally lowercase=, or path=)."""
  allowed = {
    "char": {"corpus", "path"},
    "bpe": {"corpus", "vocab_size", "path", "pattern"},
    "word": {"corpus", "vocab_size", "lowercase", "path"},
  }
  allowed.update({n: set() for n in ENCODINGS})
  if name not in allowed:
    raise TokenizerError(f"unknown tokenizer {name!r}; choose one of {', '.join(allowed)}")
  extra = set(options) - allowed[name]
  if extra:
    raise TokenizerError(
      f"tokenizer {name!r} takes no option(s) {sorted(extra)}; it takes {sorted(allowed[name]) or 'none'}"
    )
  if name in ENCODINGS:
    return encoding(name)
  if options.get("path") is not None:
    if set(options) - {"path"}:
      raise TokenizerError(f"give {name!r} either path= (load) or a corpus (train), not both")
    tok = load_tokenizer(options["path"])
    if tok.name != name and not (name == "bpe" and isinstance(tok, TiktokenTokenizer)):
      raise TokenizerError(f"{options['path']} holds a {tok.name!r} tokenizer, not {name!r}")
    return tok
  if options.get("corpus") is None:
    raise TokenizerError(
      f"tokenizer {name!r} is built from text: pass corpus= (an iterable of strings) "
      f"or path= (a directory it was saved to)"
    )
  corpus = options["corpus"]
  corpus = [corpus] if isinstance(corpus, str) else corpus
  if name == "char":
    return CharTokenizer.from_corpus(corpus)
  if "vocab_size" not in options:
    raise TokenizerError(f"tokenizer {name!r} needs vocab_size= (for example 8192)")
  if name == "word":
    return WordTokenizer.from_corpus(corpus, int(options["vocab_size"]), bool(options.get("lowercase", False)))
  return train_bpe(corpus, int(options["vocab_size"]), pattern=options.get("pattern"))


__all__ = [
  "CONFIG_FILE",
  "EOT",
  "NAMES",
  "SAVED_KINDS",
  "UNK",
  "CharTokenizer",
  "HFTokenizer",
  "MarianTokenizer",
  "NoTokenizer",
  "TiktokenTokenizer",
  "Tokenizer",
  "WordTokenizer",
  "fit_text",
  "get_tokenizer",
  "has_vocab_and_merges",
  "identical",
  "is_hf_tokenizer",
  "is_marian_pair",
  "is_saved",
  "load_tokenizer",
  "saved_sha256",
  "seed_tiktoken_cache",
  "split_words",
  "train_bpe",
  "word_pieces",
]
