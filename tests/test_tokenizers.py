import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer import tokenizers
from transformer.errors import TokenizerError
from transformer.tokenizers import EOT, get_tokenizer, load_tokenizer

from conftest import REPO

SEED_004 = (
  "OpenAI's large language models (sometimes referred to as GPT's) process text using tokens, "
  "which are common sequences of characters found in a set of text. The models learn to "
  "understand the statistical relationships between these tokens, and excel at producing the "
  "next token in a sequence of tokens."
)


@pytest.fixture(scope="module")
def gpt2():
  return get_tokenizer("gpt2")


@pytest.fixture(scope="module")
def cl100k():
  return get_tokenizer("cl100k_base")


@pytest.fixture(scope="module")
def bpe(shakespeare_text):
  return get_tokenizer("bpe", corpus=shakespeare_text.splitlines(keepends=True)[:20000], vocab_size=1000)


@pytest.fixture(scope="module")
def char(shakespeare_text):
  return get_tokenizer("char", corpus=shakespeare_text)


def test_gpt2_seed_vectors(gpt2):
  assert gpt2.encode("hello my name is\n") == [31373, 616, 1438, 318, 198]
  for threads in (1, 2):  # threads write the ids into arrays, in order
    arrays = gpt2.encode_arrays(["Every effort moves you", "Every day holds a", ""], num_threads=threads)
    assert [a.tolist() for a in arrays] == [[6109, 3626, 6100, 345], [6109, 1110, 6622, 257], []]
    assert all(a.dtype == np.uint32 for a in arrays)
  assert (gpt2.vocab_size, gpt2.eot_id) == (50257, 50256)


def test_cl100k_seed_vector(cl100k):
  assert len(SEED_004) == 301
  ids = cl100k.encode(SEED_004)
  assert len(ids) == 58 and ids[:4] == [5109, 15836, 596, 3544]
  assert cl100k.decode(ids) == SEED_004


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(st.text())
def test_tiktoken_round_trip_any_unicode(gpt2, cl100k, text):
  text = text.replace(EOT, "")
  assert gpt2.decode(gpt2.encode(text)) == text
  assert cl100k.decode(cl100k.encode(text)) == text


@settings(max_examples=60, deadline=None)
@given(st.text())
def test_trained_bpe_round_trip_any_unicode(bpe, text):
  # Byte-level: characters never seen in training still round-trip through their bytes.
  text = text.replace(EOT, "")
  assert bpe.decode(bpe.encode(text)) == text


def test_char_round_trip_over_its_alphabet(char):
  @settings(max_examples=60, deadline=None)
  @given(st.text(alphabet=st.sampled_from(char.chars)))
  def check(text):
    assert char.decode(char.encode(text)) == text

  check()


def test_char_unknown_character_is_named(char):
  with pytest.raises(TokenizerError, match=r"'€' \(U\+20AC\) is not in this character tokenizer"):
    char.encode("price: 5€")


def test_bpe_has_requested_vocab_size_and_saves(bpe, tmp_path, shakespeare_text):
  assert bpe.vocab_size == 1000 and bpe.eot_id == 999
  assert len(bpe.encode("To be, or not to be")) < len("To be, or not to be") / 2  # it merged
  bpe.save(tmp_path / "tok")
  assert (tmp_path / "tok" / "ranks.tiktoken").exists()
  loaded = load_tokenizer(tmp_path / "tok")
  sample = shakespeare_text[:5000]
  assert loaded.encode(sample) == bpe.encode(sample)
  assert loaded.vocab_size == 1000


def test_bpe_saved_again_at_the_same_path_loads_as_the_new_one(bpe, tmp_path, shakespeare_text):
  # tiktoken caches ranks files by path: data prepared anew into the same directory must not load
  # the tokenizer that was there before (it decoded every token wrongly).
  bpe.save(tmp_path / "tok")
  assert load_tokenizer(tmp_path / "tok").encode("To be, or not to be") == bpe.encode("To be, or not to be")
  other = get_tokenizer("bpe", corpus=[shakespeare_text[::-1]], vocab_size=1000)
  shutil.rmtree(tmp_path / "tok")
  other.save(tmp_path / "tok")
  ids = other.encode("To be, or not to be")
  assert ids != bpe.encode("To be, or not to be")
  assert load_tokenizer(tmp_path / "tok").encode("To be, or not to be") == ids


def test_bpe_corpus_too_small_for_vocab():
  with pytest.raises(TokenizerError, match="only supports"):
    get_tokenizer("bpe", corpus=["ab ab ab"], vocab_size=5000)


def test_saved_bpe_tampered_is_refused(bpe, tmp_path):
  bpe.save(tmp_path / "tok")
  ranks = tmp_path / "tok" / "ranks.tiktoken"
  ranks.write_text(ranks.read_text().replace(" 300\n", " 301\n"))
  with pytest.raises(TokenizerError, match="was modified"):
    load_tokenizer(tmp_path / "tok")


def test_char_saves_and_loads(char, tmp_path):
  char.save(tmp_path)
  assert load_tokenizer(tmp_path).encode("Romeo") == char.encode("Romeo")
  assert get_tokenizer("char", path=tmp_path).chars == char.chars


@pytest.mark.parametrize("name", ["gpt2", "cl100k_base", "bpe", "char"])
def test_special_tokens_are_explicit(name, gpt2, cl100k, bpe, char):
  tok = {"gpt2": gpt2, "cl100k_base": cl100k, "bpe": bpe, "char": char}[name]
  text = f"The end.{EOT}The"
  with pytest.raises(TokenizerError, match="special token '<\\|endoftext\\|>' at character 8"):
    tok.encode(text)
  ids = tok.encode(text, allow_special=True)
  assert ids.count(tok.eot_id) == 1
  assert tok.encode(text, allow_special={EOT}) == ids
  assert tok.decode(ids) == text
  with pytest.raises(TokenizerError, match="unknown special token"):
    tok.encode("x", allow_special={"<|im_start|>"})


@pytest.mark.parametrize("bad", [-1, 50257, 10**9])
def test_decode_out_of_range(gpt2, bad):
  with pytest.raises(TokenizerError, match=f"cannot decode id {bad}: gpt2 has ids 0..50256"):
    gpt2.decode([1, bad])


def test_decode_unassigned_id(cl100k):
  with pytest.raises(TokenizerError, match="assigns no token"):
    cl100k.decode([100256])


def test_decode_accepts_numpy(gpt2):
  assert gpt2.decode(np.array([[31373, 616]], dtype=np.uint16)) == "hello my"


def test_bad_names_and_options():
  with pytest.raises(TokenizerError, match="unknown tokenizer 'gpt5'"):
    get_tokenizer("gpt5")
  with pytest.raises(TokenizerError, match="takes no option"):
    get_tokenizer("gpt2", vocab_size=3)
  with pytest.raises(TokenizerError, match="needs vocab_size"):
    get_tokenizer("bpe", corpus=["hello"])
  with pytest.raises(TokenizerError, match="built from text"):
    get_tokenizer("char")
  with pytest.raises(TokenizerError, match="no saved tokenizer"):
    load_tokenizer("/nonexistent/dir")


def test_tiktoken_itself_works_offline(tmp_path):
  """In a process with no network (proxies to a closed port) and an empty tiktoken cache, our
  tokenizer seeds tiktoken's cache and tiktoken's own get_encoding then loads it, hash-checked."""
  code = (
    "import tiktoken; from transformer.tokenizers import get_tokenizer\n"
    "assert get_tokenizer('gpt2').encode('Every effort moves you') == [6109, 3626, 6100, 345]\n"
    "print(tiktoken.get_encoding('r50k_base').encode('hello my name is'))\n"
  )
  env = {
    **os.environ,
    "TIKTOKEN_CACHE_DIR": str(tmp_path / "tiktoken"),
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "NO_PROXY": "",
  }
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == "[31373, 616, 1438, 318]"
  (seeded,) = (tmp_path / "tiktoken").iterdir()
  # A corrupted copy in tiktoken's cache is replaced, not trusted.
  seeded.write_bytes(b"garbage")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr


def test_every_saved_kind_loads_back_what_was_saved(gpt2, bpe, char, tmp_path):
  """One registry of kinds (tokenizers.SAVED_KINDS): each kind a tokenizer saves is read back by it, as the same
  tokenizer (`identical`: the same saved config), and the registry holds no kind that nothing saves."""
  words = get_tokenizer("word", corpus=["The jury said it.", "It said the jury."], vocab_size=8)
  marian = tokenizers.MarianTokenizer.from_directory(REPO / "tests" / "fixtures" / "marian_tiny")
  saved = {}
  for i, tok in enumerate((gpt2, bpe, char, words, marian)):
    directory = tok.save(tmp_path / str(i))
    saved[json.loads((directory / tokenizers.CONFIG_FILE).read_text())["kind"]] = tok
    assert tokenizers.identical(load_tokenizer(directory), tok)
    assert load_tokenizer(directory).encode("It said.") == tok.encode("It said.")
  assert sorted(saved) == sorted(tokenizers.SAVED_KINDS)
