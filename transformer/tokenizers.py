"""Tokenizers: tiktoken encodings (gpt2, cl100k_base), character level, word level, BPE trained
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

import base64
import collections
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import rustbpe
import sentencepiece
import tiktoken
import tiktoken.load
import tiktoken_ext.openai_public
import tokenizers as hf_tokenizers

from transformer import assets
from transformer.errors import TokenizerError

# rustbpe logs every 1% of its merges through Python logging; keep its warnings only.
logging.getLogger("rustbpe").setLevel(logging.WARNING)

EOT = "<|endoftext|>"
UNK = "<|unk|>"  # the word tokenizer's id for every word outside its vocabulary
CONFIG_FILE = "tokenizer.json"

# Our name -> (tiktoken encoding name, asset holding its ranks). "gpt2" is r50k_base: the same
# ranks, pattern and <|endoftext|>=50256, stored as one .tiktoken file.
_TIKTOKEN = {
  "gpt2": ("r50k_base", "gpt2_ranks"),
  "r50k_base": ("r50k_base", "gpt2_ranks"),
  "cl100k_base": ("cl100k_base", "cl100k_ranks"),
}


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
          f"allow_special=True (or a set naming it; --allow_special in launch.sample) to encode it as "
          f"id {self.special_tokens[token]}, or remove it from the text"
        )
    return allowed

  def __repr__(self) -> str:
    return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


class TiktokenTokenizer(Tokenizer):
  """A `tiktoken.Encoding`: the pretrained OpenAI encodings and our trained BPE alike."""

  def __init__(self, encoding: tiktoken.Encoding, name: str, trained: bool = False):
    self.encoding = encoding
    self.name = name
    self.vocab_size = encoding.n_vocab
    self.special_tokens = dict(encoding._special_tokens)
    self.eot_id = self.special_tokens[EOT]
    self.trained = trained  # a BPE of ours: `save` writes its ranks, not just its name

  def _encode(self, text: str, allowed: set[str]) -> list[int]:
    return self.encoding.encode(text, allowed_special=allowed, disallowed_special=())

  def encode_arrays(self, texts, *, allow_special=False, num_threads=1):
    allowed = set()
    for t in texts:  # validates every text before the (threaded) encoding
      allowed = self._allowed(t, allow_special)
    # tiktoken releases the GIL while it encodes into the buffer an array is then a view of.
    encode = lambda t: self.encoding.encode_to_numpy(t, allowed_special=allowed, disallowed_special=())
    if num_threads <= 1:
      return [encode(t) for t in texts]
    with concurrent.futures.ThreadPoolExecutor(num_threads) as pool:
      return list(pool.map(encode, texts))

  def _decode(self, ids: list[int]) -> str:
    try:
      return self.encoding.decode(ids)
    except KeyError as e:  # ids inside the range that the encoding leaves unassigned (cl100k has some)
      raise TokenizerError(f"cannot decode: {e.args[0]} ({self.name} assigns no token to it)") from None

  def _config(self, directory: Path) -> dict:
    if not self.trained:
      return {"kind": "tiktoken", "name": self.name}
    target = directory / "ranks.tiktoken"
    _dump_ranks(self.encoding._mergeable_ranks, target)
    return {
      "kind": "bpe",
      "name": self.name,
      "pattern": self.encoding._pat_str,
      "special_tokens": self.special_tokens,
      "ranks_file": target.name,
      "ranks_sha256": hashlib.sha256(target.read_bytes()).hexdigest(),
    }


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

  def __getstate__(self):  # SentencePiece processors do not pickle; their models do
    return {"protos": self._protos, "vocab": self.vocab}

  def __setstate__(self, state):
    self.__init__(*state["protos"], state["vocab"])


def identical(a: Tokenizer, b: Tokenizer) -> bool:
  """Whether two tokenizers give the same ids to every text: their saved configs are equal (a
  trained BPE's names its ranks by sha256)."""
  with tempfile.TemporaryDirectory() as da, tempfile.TemporaryDirectory() as db:
    return json.loads((a.save(da) / CONFIG_FILE).read_text()) == json.loads((b.save(db) / CONFIG_FILE).read_text())


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


@contextlib.contextmanager
def _capturing_tiktoken_loads():
  """Records (url, sha256) of the ranks file each tiktoken encoding constructor asks for."""
  calls = []

  class _Captured(Exception):
    pass

  def capture(url, expected_hash=None):
    calls.append((url, expected_hash))
    raise _Captured

  real = tiktoken_ext.openai_public.load_tiktoken_bpe
  tiktoken_ext.openai_public.load_tiktoken_bpe = capture
  try:
    yield calls, _Captured
  finally:
    tiktoken_ext.openai_public.load_tiktoken_bpe = real


def _tiktoken_cache_dir() -> Path:
  # The directory tiktoken itself reads (tiktoken.load.read_file_cached), in its order.
  for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
    if var in os.environ:
      return Path(os.environ[var])
  return Path(tempfile.gettempdir()) / "data-gym-cache"


def seed_tiktoken_cache(encoding_name: str) -> None:
  """Puts our sha256-verified ranks file where tiktoken looks first (sha1 of its URL).

  tiktoken then loads it with its own hash check and never goes to the network; where a network
  is reachable, nothing changes for it.
  """
  asset = dict(_TIKTOKEN.values())[encoding_name]
  with _capturing_tiktoken_loads() as (calls, captured):
    try:
      tiktoken_ext.openai_public.ENCODING_CONSTRUCTORS[encoding_name]()
    except captured:
      pass
  ((url, expected_hash),) = calls
  if expected_hash != assets.ASSETS[asset].sha256:
    raise TokenizerError(
      f"tiktoken expects sha256 {expected_hash} for {encoding_name}, but the pinned "
      f"asset {asset} has {assets.ASSETS[asset].sha256}"
    )
  cache = _tiktoken_cache_dir()
  target = cache / hashlib.sha1(url.encode()).hexdigest()
  if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == expected_hash:
    return
  source = assets.fetch(asset)
  cache.mkdir(parents=True, exist_ok=True)
  tmp = target.with_suffix(f".{os.getpid()}.tmp")
  shutil.copyfile(source, tmp)
  os.replace(tmp, target)


# ---------------------------------------------------------------------------------------------
# Trained byte-level BPE.


def train_bpe(
  texts: Iterable[str], vocab_size: int, *, pattern: str | None = None, name: str | None = None
) -> TiktokenTokenizer:
  """Byte-level BPE: start from the 256 bytes, merge the most frequent pair until the vocabulary
  (plus <|endoftext|>) has `vocab_size` entries. rustbpe trains; tiktoken encodes."""
  if vocab_size < 258:
    raise TokenizerError(f"bpe vocab_size must be at least 258 (256 bytes, one merge, <|endoftext|>), got {vocab_size}")
  trainer = rustbpe.Tokenizer()
  trainer.train_from_iterator(iter(texts), vocab_size - 1, pattern=pattern)
  ranks = {bytes(token): rank for token, rank in trainer.get_mergeable_ranks()}
  if len(ranks) != vocab_size - 1:
    raise TokenizerError(
      f"the corpus only supports {len(ranks) + 1} BPE tokens, fewer than the "
      f"requested vocab_size {vocab_size}; use a larger corpus or a smaller vocab_size"
    )
  return _bpe_from_ranks(ranks, trainer.get_pattern(), {EOT: len(ranks)}, name or f"bpe{vocab_size}")


def _dump_ranks(ranks: dict[bytes, int], path: Path) -> None:
  # The .tiktoken format: `base64(token) rank` per line (tiktoken's own dump needs blobfile).
  by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
  lines = (f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in by_rank)
  path.write_text("".join(lines))


def _bpe_from_ranks(ranks, pattern, special_tokens, name) -> TiktokenTokenizer:
  encoding = tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special_tokens)
  return TiktokenTokenizer(encoding, name, trained=True)


# ---------------------------------------------------------------------------------------------
# Entry points.


class HFTokenizer(Tokenizer):
  """A Hugging Face tokenizer.json, run by the `tokenizers` library (Rust) that every open family ships
  it for, with the BOS and EOS the model expects: those its tokenizer.json's post-processor adds (what
  transformers 5 writes, and Llama 3's, Qwen's, SmolLM's files), unless its tokenizer_config.json says
  add_bos_token / add_eos_token (the older files of Llama 2 and Gemma, which transformers 4 applied
  over the post-processor). The ids are AutoTokenizer's (tests/test_families.py). `eot_id`: the EOS,
  which ends a document and a generation."""

  FILES = (CONFIG_FILE, "tokenizer_config.json")

  def __init__(self, tokenizer_json: str, config: dict, name: str):
    self.tokenizer = hf_tokenizers.Tokenizer.from_str(tokenizer_json)
    self.tokenizer_json, self.config, self.name = tokenizer_json, config, name
    self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
    added = self.tokenizer.get_added_tokens_decoder()
    self.special_tokens = {t.content: i for i, t in sorted(added.items()) if t.special}
    self.bos_id, eos_id = self._special_id("bos_token"), self._special_id("eos_token")
    self.eot_id = eos_id if eos_id is not None else self.bos_id
    if self.eot_id is None:
      raise TokenizerError(f"{name}: tokenizer_config.json names no eos_token (nor bos_token) that tokenizer.json has")
    self.eos_id = eos_id
    self.add_bos, self.add_eos = config.get("add_bos_token"), config.get("add_eos_token")

  def _special_id(self, key: str) -> int | None:
    token = self.config.get(key)
    token = token.get("content") if isinstance(token, dict) else token
    return None if token is None else self.tokenizer.token_to_id(token)

  @classmethod
  def from_directory(cls, directory: str | os.PathLike) -> HFTokenizer:
    directory = Path(directory)
    path = directory / CONFIG_FILE
    try:
      text = path.read_text()
      config_path = directory / "tokenizer_config.json"
      config = json.loads(config_path.read_text()) if config_path.exists() else {}
      return cls(text, config, str(directory))
    except (OSError, ValueError, Exception) as e:  # tokenizers raises its own Exception for a bad file
      if isinstance(e, TokenizerError):
        raise
      raise TokenizerError(
        f"{path} is not a Hugging Face tokenizer.json ({e}); give the model's own directory"
      ) from None

  def _encode(self, text: str, allowed: set[str]) -> list[int]:
    # Special tokens in the text were refused by `encode` unless allowed; the post-processor's BOS unless
    # tokenizer_config.json says otherwise (then its flags decide).
    explicit = self.add_bos is not None or self.add_eos is not None
    ids = self.tokenizer.encode(text, add_special_tokens=not explicit).ids
    if explicit:
      ids = [self.bos_id] * bool(self.add_bos and self.bos_id is not None) + ids
      ids = ids + [self.eos_id] * bool(self.add_eos and self.eos_id is not None)
    return ids

  def encode_piece(self, text: str, *, allow_special: bool | Iterable[str] = False) -> list[int]:
    self._allowed(text, allow_special)
    return self.tokenizer.encode(text, add_special_tokens=False).ids

  def encode_arrays(self, texts, *, allow_special=False, num_threads=1):
    for t in texts:  # validates every text before the (threaded, in Rust) batch
      self._allowed(t, allow_special)
    if self.add_bos is not None or self.add_eos is not None:
      return [np.asarray(self._encode(t, set()), np.uint32) for t in texts]
    return [np.asarray(e.ids, np.uint32) for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=True)]

  def _decode(self, ids: list[int]) -> str:
    return self.tokenizer.decode(ids, skip_special_tokens=False)

  def _config(self, directory: Path) -> dict:
    (directory / "tokenizer_config.json").write_text(json.dumps(self.config, indent=2) + "\n")
    return json.loads(self.tokenizer_json)  # tokenizer.json itself: `load_tokenizer` reads it back

  def __getstate__(self):  # a tokenizers.Tokenizer pickles, but its source is what we keep
    return {"tokenizer_json": self.tokenizer_json, "config": self.config, "name": self.name}

  def __setstate__(self, state):
    self.__init__(**state)


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


def is_hf_tokenizer(directory: str | os.PathLike) -> bool:
  """Whether `directory`'s tokenizer.json is Hugging Face's (a "model" section), not one `Tokenizer.save` wrote."""
  path = Path(directory) / CONFIG_FILE
  try:
    config = json.loads(path.read_text())
  except (OSError, ValueError):
    return False
  return isinstance(config, dict) and "model" in config and "kind" not in config


def is_marian_pair(directory: str | os.PathLike) -> bool:
  """Whether `directory` holds a Marian tokenizer pair (MarianTokenizer.FILES): a Marian model's, or saved."""
  return (Path(directory) / MarianTokenizer.FILES[0]).is_file()


def saved_sha256(directory: str | os.PathLike) -> str:
  """The sha256 of what makes a saved tokenizer (its tokenizer.json, or a Marian directory's three
  files): the name of the data prepared with it."""
  directory = Path(directory)
  names = (CONFIG_FILE,) if (directory / CONFIG_FILE).exists() else MarianTokenizer.FILES
  if is_hf_tokenizer(directory):
    names = tuple(n for n in HFTokenizer.FILES if (directory / n).exists())
  digest = hashlib.sha256()
  for name in names:
    digest.update((directory / name).read_bytes())
  return digest.hexdigest()


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
  """Loads what `Tokenizer.save` wrote, or a Marian model directory's tokenizer pair."""
  directory = Path(directory)
  config_path = directory / CONFIG_FILE
  if is_marian_pair(directory) and not config_path.exists():  # a Marian model's directory
    return MarianTokenizer.from_directory(directory)
  if not config_path.exists():
    raise TokenizerError(f"no saved tokenizer at {directory} (looked for {config_path})")
  if is_hf_tokenizer(directory):
    return HFTokenizer.from_directory(directory)
  config = json.loads(config_path.read_text())
  kind = config.get("kind")
  if kind == "marian":
    for name in MarianTokenizer.FILES:
      if hashlib.sha256((directory / name).read_bytes()).hexdigest() != config[name]:
        raise TokenizerError(
          f"{directory / name} is not the file {config_path} records: the saved tokenizer was modified"
        )
    return MarianTokenizer.from_directory(directory)
  if kind == "tiktoken":
    return get_tokenizer(config["name"])
  if kind == "char":
    return CharTokenizer(config["chars"])
  if kind == "word":
    return WordTokenizer(config["words"], config["lowercase"])
  if kind == "bpe":
    ranks_file = directory / config["ranks_file"]
    got = hashlib.sha256(ranks_file.read_bytes()).hexdigest()
    if got != config["ranks_sha256"]:
      raise TokenizerError(
        f"{ranks_file} has sha256 {got} but {config_path} records "
        f"{config['ranks_sha256']}: the saved tokenizer was modified"
      )
    # tiktoken caches a ranks file by its path, not its contents: without the hash, a tokenizer saved
    # again at the same path (data prepared anew) would load as the old one.
    ranks = tiktoken.load.load_tiktoken_bpe(str(ranks_file), expected_hash=config["ranks_sha256"])
    return _bpe_from_ranks(ranks, config["pattern"], config["special_tokens"], config["name"])
  raise TokenizerError(f"{config_path} has unknown tokenizer kind {kind!r}")


NAMES = ("gpt2", "r50k_base", "cl100k_base", "char", "bpe", "word")  # what get_tokenizer builds


def get_tokenizer(name: str, **options) -> Tokenizer:
  """`gpt2` | `r50k_base` | `cl100k_base` | `char` (corpus= or path=) | `bpe` (corpus= and vocab_size=, or
  path=) | `word` (corpus=, vocab_size= and optionally lowercase=, or path=)."""
  allowed = {
    "char": {"corpus", "path"},
    "bpe": {"corpus", "vocab_size", "path", "pattern"},
    "word": {"corpus", "vocab_size", "lowercase", "path"},
  }
  allowed.update({n: set() for n in _TIKTOKEN})
  if name not in allowed:
    raise TokenizerError(f"unknown tokenizer {name!r}; choose one of {', '.join(allowed)}")
  extra = set(options) - allowed[name]
  if extra:
    raise TokenizerError(
      f"tokenizer {name!r} takes no option(s) {sorted(extra)}; it takes {sorted(allowed[name]) or 'none'}"
    )
  if name in _TIKTOKEN:
    encoding_name, _ = _TIKTOKEN[name]
    seed_tiktoken_cache(encoding_name)
    return TiktokenTokenizer(tiktoken.get_encoding(encoding_name), name)
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
