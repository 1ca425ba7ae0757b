"""The tokenizer.json of the open families (Llama, Qwen, Gemma, Pythia, OLMo, SmolLM), run by Hugging Face's
`tokenizers`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import tokenizers as hf_tokenizers

from transformer.errors import TokenizerError
from transformer.tokenizers.base import CONFIG_FILE, EOT, Tokenizer

# GPT-2's own tokenizer files (GPT2Tokenizer's), where a directory has no tokenizer.json
VOCAB, MERGES = "vocab.json", "merges.txt"


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

  @classmethod
  def from_vocab_and_merges(cls, directory: str | os.PathLike) -> HFTokenizer:
    """GPT-2's own tokenizer files (vocab.json + merges.txt, what GPT2Tokenizer.save_pretrained writes): a
    byte-level BPE, as transformers' GPT2TokenizerFast builds from them, its special tokens those of
    tokenizer_config.json (GPT-2's <|endoftext|> where it names none)."""
    directory = Path(directory)
    config_path = directory / "tokenizer_config.json"
    try:
      config = json.loads(config_path.read_text()) if config_path.exists() else {}
      model = hf_tokenizers.models.BPE.from_file(str(directory / VOCAB), str(directory / MERGES))
    except (OSError, ValueError, Exception) as e:  # tokenizers raises its own Exception for a bad file
      raise TokenizerError(f"{directory}: {VOCAB} and {MERGES} are not a GPT-2 tokenizer's ({e})") from None
    tokenizer = hf_tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = hf_tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = hf_tokenizers.decoders.ByteLevel()
    config = {"bos_token": EOT, "eos_token": EOT, "add_bos_token": False, **config}
    named = {config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if isinstance(config.get(k), str)}
    tokenizer.add_special_tokens([t for t in sorted(named) if tokenizer.token_to_id(t) is not None])
    return cls(tokenizer.to_str(), config, str(directory))

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


def has_vocab_and_merges(directory: str | os.PathLike) -> bool:
  return (Path(directory) / VOCAB).is_file() and (Path(directory) / MERGES).is_file()


def is_hf_tokenizer(directory: str | os.PathLike) -> bool:
  """Whether `directory`'s tokenizer.json is Hugging Face's (a "model" section), not one `Tokenizer.save` wrote."""
  path = Path(directory) / CONFIG_FILE
  try:
    text = path.read_text()
  except OSError:
    return False
  try:
    config = json.loads(text)
  except ValueError as e:  # there, but cut or not JSON: said as such, not as a directory without one
    raise TokenizerError(f"{path} is not JSON ({e}): copy the model's tokenizer.json again") from None
  return isinstance(config, dict) and "model" in config and "kind" not in config
