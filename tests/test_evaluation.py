"""Scoring a language model on text (transformer.evaluation): bits per byte computed by hand, windows
that predict every token once, and the label scores' macro-F1 and confusion table."""

import functools
import math

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from transformer import evaluation, tokenizers
from transformer.errors import ConfigError, TokenizerError
from transformer.models.gpt import GPT, GPTConfig
from transformer.tasks import classification

from conftest import compiled_init

# Three-byte and two-byte characters: bytes, characters and tokens all differ.
TEXT = "Naïve café — a snowman ☃ in the rain.\nEvery effort moves you, and the second line ends here.\n"


@pytest.fixture(scope="module")
def gpt2_shaped():
  """A random tiny GPT with GPT-2's vocabulary, and the gpt2 tokenizer."""
  cfg = GPTConfig().replace(vocab_size=50257, max_len=64, num_layers=2, num_heads=2, d_model=32)
  params = compiled_init(GPT(cfg), np.zeros((1, 8), np.int32))
  return GPT(cfg), params, tokenizers.get_tokenizer("gpt2")


@functools.partial(jax.jit, static_argnums=0)  # one program a length (eager ops: one each)
def _forward(model, params, tokens_BxT):
  return model.apply({"params": params}, tokens_BxT)


def _nll_by_hand(model, params, tokens: np.ndarray) -> np.ndarray:
  """-log p(token t | tokens < t) for t = 1 .. len - 1, from one forward pass and numpy's softmax."""
  logits = np.asarray(_forward(model, params, tokens[None, :-1]), np.float64)[0]
  logits -= logits.max(-1, keepdims=True)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  return -log_probs[np.arange(len(tokens) - 1), tokens[1:]]


def test_bits_per_byte_by_hand(gpt2_shaped):
  model, params, tok = gpt2_shaped
  tokens = np.asarray([tok.eot_id, *tok.encode(TEXT)], np.int32)
  assert len(tokens) - 1 < 64 and len(TEXT.encode()) != len(TEXT) != len(tokens) - 1
  nll = _nll_by_hand(model, params, tokens).sum()
  score = evaluation.score_text(model, params, tok, TEXT, context=64)
  assert score.tokens == len(tokens) - 1 and score.bytes == len(TEXT.encode("utf-8")) and score.chars == len(TEXT)
  np.testing.assert_allclose(score.nll, nll, rtol=1e-5)
  np.testing.assert_allclose(score.bits_per_byte, nll / math.log(2) / len(TEXT.encode("utf-8")), rtol=1e-5)
  np.testing.assert_allclose(score.bits_per_char, nll / math.log(2) / len(TEXT), rtol=1e-5)
  np.testing.assert_allclose(score.perplexity, math.exp(nll / (len(tokens) - 1)), rtol=1e-5)


def test_special_tokens_in_the_text_are_refused_unless_allowed(gpt2_shaped):
  """A text with <|endoftext|> written in it: refused, naming the flag both programs define (launch.sample and
  launch.evaluate --allow_special); allowed, read as its id."""
  model, params, tok = gpt2_shaped
  text = "ROMEO: O<|endoftext|>JULIET: Ay"
  with pytest.raises(TokenizerError, match="--allow_special in launch.sample and launch.evaluate"):
    evaluation.score_text(model, params, tok, text, context=64)
  score = evaluation.score_text(model, params, tok, text, allow_special=True, context=64)
  assert score.tokens == len(tok.encode(text, allow_special=True)) and tok.eot_id in tok.encode(
    text, allow_special=True
  )


def test_windows_score_each_token_from_its_own_window(gpt2_shaped):
  """Context 8, stride 3: each window's new targets scored by a forward pass over that window alone."""
  model, params, tok = gpt2_shaped
  tokens = np.asarray([tok.eot_id, *tok.encode(TEXT)], np.int32)
  want = 0.0
  for start, scored, end in evaluation.windows(len(tokens), 8, 3):
    want += _nll_by_hand(model, params, tokens[start:end])[scored - start - 1 :].sum()
  got = evaluation.lm_nll_sum(model, params, tokens, context=8, stride=3, batch_size=4)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  with pytest.raises(ConfigError, match="stride must be in 1..context=8, got 9"):
    evaluation.lm_nll_sum(model, params, tokens, context=8, stride=9)


@given(st.integers(2, 300), st.integers(1, 40), st.integers(1, 40))
def test_windows_predict_every_target_once_with_at_least_context_minus_stride(num_tokens, context, stride):
  stride = min(stride, context)
  seen = []
  for i, (start, scored, end) in enumerate(evaluation.windows(num_tokens, context, stride)):
    assert end - start <= context + 1 and start < scored < end
    if i:  # a later window's targets each see at least context - stride tokens before them
      assert scored - start >= min(context - stride, scored)
    seen += range(scored, end)
  assert seen == list(range(1, num_tokens))


def test_label_scores_macro_f1_over_the_classes_that_occur():
  gold, predicted = np.array([0, 0, 1, 1, 1]), np.array([0, 1, 1, 1, 0])
  result = classification.scores(predicted, gold, num_classes=4)  # classes 2 and 3 never occur
  f1 = [2 * 0.5 * 0.5 / 1.0, 2 * (2 / 3) * (2 / 3) / (4 / 3)]
  assert result["accuracy"] == pytest.approx(0.6) and result["macro_f1"] == pytest.approx(np.mean(f1))
  table = evaluation.confusion_text(result["confusion"], ["neg", "pos", "x", "y"])
  assert table.splitlines()[1].split() == ["neg", "1", "1", "0", "0"]
  many = evaluation.confusion_text(np.eye(20, dtype=int), [f"t{i}" for i in range(20)], most=5)
  assert many.endswith("(5 most frequent of 20 classes)") and len(many.splitlines()) == 7
