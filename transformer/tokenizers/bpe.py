"""tiktoken's encodings (gpt2 = r50k_base, cl100k_base: their ranks seeded offline from a pinned asset) and
byte-level BPE trained with rustbpe, both run by tiktoken (`TiktokenTokenizer`)."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import rustbpe
import tiktoken
import tiktoken.load
import tiktoken_ext.openai_public

from transformer import assets
from transformer.errors import TokenizerError
from transformer.tokenizers.base import EOT, Tokenizer

# Our name -> (tiktoken encoding name, asset holding its ranks). "gpt2" is r50k_base: the same
# ranks, pattern and <|endoftext|>=50256, stored as one .tiktoken file.
ENCODINGS = {
  "gpt2": ("r50k_base", "gpt2_ranks"),
  "r50k_base": ("r50k_base", "gpt2_ranks"),
  "cl100k_base": ("cl100k_base", "cl100k_ranks"),
}


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


def encoding(name: str) -> TiktokenTokenizer:
  """One of tiktoken's encodings by our name (`ENCODINGS`), its ranks from the pinned asset."""
  encoding_name, _ = ENCODINGS[name]
  seed_tiktoken_cache(encoding_name)
  return TiktokenTokenizer(tiktoken.get_encoding(encoding_name), name)


def from_saved_bpe(directory: Path, config: dict) -> TiktokenTokenizer:
  """A trained BPE as `TiktokenTokenizer._config` saved it: its ranks file, checked against the recorded sha256."""
  ranks_file = directory / config["ranks_file"]
  got = hashlib.sha256(ranks_file.read_bytes()).hexdigest()
  if got != config["ranks_sha256"]:
    raise TokenizerError(
      f"{ranks_file} has sha256 {got} but {directory / 'tokenizer.json'} records "
      f"{config['ranks_sha256']}: the saved tokenizer was modified"
    )
  # tiktoken caches a ranks file by its path, not its contents: without the hash, a tokenizer saved
  # again at the same path (data prepared anew) would load as the old one.
  ranks = tiktoken.load.load_tiktoken_bpe(str(ranks_file), expected_hash=config["ranks_sha256"])
  return _bpe_from_ranks(ranks, config["pattern"], config["special_tokens"], config["name"])


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
  asset = dict(ENCODINGS.values())[encoding_name]
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
