"""Decoding the encoder-decoder (transformer.generation.beam_search): the cached decoder equals the
full forward pass, beam size 1 is greedy, beams are sorted by their true scores, bad input is
named, and a batch of sentences of one length bucket compiles once."""

import functools
import threading

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import tokenizers
from transformer.errors import UserError
from transformer.generation import beam_search
from transformer.generation.common import until_stop
from transformer.kernels import decode_threads
from transformer.models import seq2seq
from transformer.models.seq2seq import Transformer

from conftest import compiled_apply
from test_seq2seq import CFG, SRC, TGT, VALID, _params


@pytest.fixture(scope="module")
def params():
  return _params()


@pytest.mark.slow
@pytest.mark.parametrize(
  "changes",
  [
    {},
    {"num_decoder_layers": 1},  # a shallower decoder than the encoder (2)
    {"pre_layer_norm": True, "norm": "rms_norm", "activation": "swiglu", "qk_norm": True},  # the block's options
    {"sinusoids": "halves", "scale_embeddings": False, "logits_bias": True, "activation": "swish"},  # Marian's
  ],
)
def test_cached_decoding_equals_full_forward(params, changes):
  cfg = CFG.replace(**changes)
  params = _params(cfg) if changes else params
  model = Transformer(cfg)
  full = compiled_apply(model, {"params": params}, SRC, TGT, source_valid_BxS=VALID)
  encoded = compiled_apply(model, {"params": params}, SRC, source_valid_BxS=VALID, method="encode")
  cache = beam_search.init_cache(model, *TGT.shape[:1], SRC.shape[1], TGT.shape[1])
  steps = []
  for t in range(TGT.shape[1]):
    logits_BxV, cache = _decode_step(model, params, cache, encoded if t == 0 else None, TGT[:, t], VALID)
    chex.assert_shape(logits_BxV, (TGT.shape[0], CFG.vocab_size))
    steps.append(logits_BxV)
  np.testing.assert_allclose(np.stack(steps, axis=1), full, atol=1e-5)


# A decoding step as the searches compile it (eagerly, each of its ops would compile on its own).
_decode_step = jax.jit(beam_search.decode_step, static_argnums=0)


DEC_CFG = CFG.replace(tie_output=False)  # a tied head at random init just repeats its input token
BOS = 1


def _scaled(params, scale=2.0):
  """Weights scaled up so that the next-token distributions are far from uniform and outputs vary."""
  return jax.tree_util.tree_map_with_path(
    lambda path, x: x if "ln" in jax.tree_util.keystr(path) else x * scale, params
  )


@functools.partial(jax.jit, static_argnums=0)  # one program per length, not a compile per op
def _log_probs(cfg, params, source_BxS, target_BxT, valid_BxS):
  return jax.nn.log_softmax(
    Transformer(cfg).apply({"params": params}, source_BxS, target_BxT, source_valid_BxS=valid_BxS)
  )


def _sequence_log_prob(params, source, valid, tokens, eos):
  """log p(tokens + <eos>) by one full forward pass (the reference for beam scores)."""
  lp = np.asarray(_log_probs(DEC_CFG, params, source[None], jnp.array([[BOS] + tokens]), valid[None])[0])
  return float(sum(lp[t, n] for t, n in enumerate(tokens + [eos])))


@pytest.mark.slow
def test_beam_size_one_equals_greedy_and_beams_are_sorted_by_their_scores():
  p = _scaled(_params(DEC_CFG))
  model = Transformer(DEC_CFG)
  unstopped = beam_search.greedy(p, SRC, VALID, model=model, max_len=12, bos_id=BOS, eos_id=49)
  eos = int(unstopped[0, 4])  # a token greedy emits: hypotheses do end
  greedy = beam_search.greedy(p, SRC, VALID, model=model, max_len=12, bos_id=BOS, eos_id=eos)
  beam1, _ = beam_search.beam_search(
    p, SRC, VALID, model=model, beam_size=1, max_len=12, alpha=0.0, bos_id=BOS, eos_id=eos
  )
  assert [until_stop(g, eos) for g in greedy] == [until_stop(b[0], eos) for b in beam1]
  tokens, scores = beam_search.beam_search(
    p, SRC, VALID, model=model, beam_size=4, max_len=12, alpha=0.6, bos_id=BOS, eos_id=eos
  )
  scores = np.asarray(scores)
  assert (np.diff(scores, axis=1) <= 1e-6).all()  # best first
  checked = 0
  for b in range(2):
    hyps = [until_stop(t, eos) for t in tokens[b]]
    assert len({tuple(h) for h in hyps}) == 4
    for hyp, score in zip(hyps, scores[b]):
      if len(hyp) < 12:  # ended with <eos>: its score is log p over the GNMT penalty
        want = _sequence_log_prob(p, SRC[b], VALID[b], hyp, eos) / beam_search.length_penalty(len(hyp) + 1, 0.6)
        assert np.isclose(score, want, atol=1e-3), (hyp, score, want)
        checked += 1
  assert checked >= 4
  # Under its own score the beam's best is at least as good as greedy's output.
  g0 = until_stop(greedy[0], eos)
  g_score = _sequence_log_prob(p, SRC[0], VALID[0], g0, eos) / beam_search.length_penalty(len(g0) + 1, 0.6)
  assert scores[0, 0] >= g_score - 1e-4


@pytest.mark.slow
def test_an_ensemble_decodes_with_the_mean_of_its_members_log_probs():
  """seq2seq.Ensemble: one member decodes exactly as that model; two (of different depths) give the
  mean of their log-softmaxes, the same through the KV cache as in one forward pass."""
  shallow = DEC_CFG.replace(num_layers=1)
  p_a, p_b = _scaled(_params(DEC_CFG)), _scaled(_params(shallow, seed=1))
  one, model = seq2seq.Ensemble((DEC_CFG,)), Transformer(DEC_CFG)
  unstopped = beam_search.greedy(p_a, SRC, VALID, model=model, max_len=12, bos_id=BOS, eos_id=49)
  eos = int(unstopped[0, 4])
  for beam_size in (1, 3):
    alone = beam_search.beam_search(
      p_a, SRC, VALID, model=model, beam_size=beam_size, max_len=12, alpha=0.6, bos_id=BOS, eos_id=eos
    )
    ensembled = beam_search.beam_search(
      {"member_0": p_a}, SRC, VALID, model=one, beam_size=beam_size, max_len=12, alpha=0.6, bos_id=BOS, eos_id=eos
    )
    np.testing.assert_array_equal(alone[0], ensembled[0])
    np.testing.assert_allclose(alone[1], ensembled[1], atol=1e-5)
  pair, p_pair = seq2seq.Ensemble((DEC_CFG, shallow)), {"member_0": p_a, "member_1": p_b}
  mean = (_log_probs(DEC_CFG, p_a, SRC, TGT, VALID) + _log_probs(shallow, p_b, SRC, TGT, VALID)) / 2
  full = compiled_apply(pair, {"params": p_pair}, SRC, TGT, source_valid_BxS=VALID)
  np.testing.assert_allclose(full, mean, atol=1e-5)
  encoded = compiled_apply(pair, {"params": p_pair}, SRC, source_valid_BxS=VALID, method="encode")
  cache = beam_search.init_cache(pair, TGT.shape[0], SRC.shape[1], TGT.shape[1])
  for t in range(TGT.shape[1]):
    step_BxV, cache = _decode_step(pair, p_pair, cache, encoded if t == 0 else None, TGT[:, t], VALID)
    np.testing.assert_allclose(step_BxV, mean[:, t], atol=1e-5)
  # Greedy decoding of the pair takes the argmax of the mean at every step.
  tokens = beam_search.greedy(p_pair, SRC, VALID, model=pair, max_len=6, bos_id=BOS, eos_id=49)
  tokens = np.asarray(tokens)
  mean = compiled_apply(
    pair, {"params": p_pair}, SRC, np.concatenate([np.full((2, 1), BOS), tokens[:, :-1]], 1), source_valid_BxS=VALID
  )
  np.testing.assert_array_equal(tokens, np.argmax(mean, -1))
  with pytest.raises(UserError, match=r"must share one vocabulary, got vocab_size \[50, 60\]"):
    jax.eval_shape(seq2seq.Ensemble((DEC_CFG, DEC_CFG.replace(vocab_size=60))).init, jax.random.key(0), SRC, TGT)


def test_repeated_ngram_mask_names_the_tokens_that_would_repeat():
  tokens = np.array(
    [
      [5, 6, 7, 5, 6, 9, 0, 0],  # ... 5 6 -> 7 and 9 would repeat a trigram
      [3, 3, 3, 3, 0, 0, 0, 0],
    ]
  )  # ... 3 3 -> 3
  mask_of = jax.jit(beam_search.repeated_ngram_mask, static_argnums=(2, 3))  # traced as a search traces it

  def banned(length, n):
    mask = mask_of(tokens, length, n, 10)
    return [set(np.flatnonzero(row).tolist()) for row in mask]

  assert banned(5, 3) == [{7}, set()]  # row 0's last two are 5 6; row 1's (3 0) never came before
  assert banned(4, 3) == [set(), {3}]
  assert banned(6, 2) == [set(), {0}]  # row 0's last token 9 came once; row 1's bigram 0 0 came before
  assert banned(3, 1) == [{5, 6, 7}, {3}]  # unigrams: any token already written
  assert banned(1, 3) == [set(), set()]  # too short to repeat
  # Applied to scores, <eos> (here 7) stays allowed: a translation may always end.
  ban = jax.jit(beam_search.ban_repeated_ngrams, static_argnums=(3, 4))
  scores = ban(np.zeros((2, 10), np.float32), tokens, 3, 1, 7, -np.inf)
  assert [set(np.flatnonzero(np.isinf(row)).tolist()) for row in scores] == [{5, 6}, {3}]


@pytest.mark.slow
@pytest.mark.parametrize("beam_size", [1, 3])
def test_no_repeat_ngram_decodes_no_repeated_ngram(beam_size):
  p = _params(CFG)  # a tied head at random init repeats its input token: every step a repeat
  model = Transformer(CFG)
  kw = dict(model=model, max_len=12, bos_id=BOS, eos_id=49)
  decode = (
    (lambda **o: beam_search.greedy(p, SRC, VALID, **kw, **o))
    if beam_size == 1
    else (lambda **o: beam_search.beam_search(p, SRC, VALID, beam_size=beam_size, alpha=0.6, **kw, **o)[0][:, 0])
  )
  ngrams = lambda row, n: [tuple(row[i : i + n]) for i in range(len(row) - n + 1)]
  repeats = lambda out, n: sum(len(g) - len(set(g)) for g in (ngrams(until_stop(r, 49), n) for r in np.asarray(out)))
  assert repeats(decode(), 2) > 0
  for n in (1, 2, 3):
    assert repeats(decode(no_repeat_ngram=n), n) == 0


def test_translate_refuses_bad_sentences():
  tok = tokenizers.CharTokenizer.from_corpus(["abc"])
  model = Transformer(seq2seq.preset("cpu-tiny", vocab_size=tok.vocab_size, max_len=8))
  # Abstract params (shapes only, nothing compiled): every refusal comes before the model runs.
  params = jax.eval_shape(lambda: _params(model.config))
  with pytest.raises(UserError, match="sentence 1 is 12 tokens, longer than the model's max_len=8"):
    beam_search.translate_texts(model, params, tok, ["abc", "abcabcabcabc"])
  with pytest.raises(UserError, match="sentence 0 is empty"):
    beam_search.translate_texts(model, params, tok, ["  "])
  with pytest.raises(UserError, match="not one string"):
    beam_search.translate_texts(model, params, tok, "abc")
  with pytest.raises(UserError, match=r"no_repeat_ngram must be >= 0 \(0: repeats allowed\), got -1"):
    beam_search.translate_texts(model, params, tok, ["abc"], no_repeat_ngram=-1)


@pytest.mark.slow
@pytest.mark.parametrize("beam_size", [1, 3])
def test_one_length_bucket_compiles_once(params, monkeypatch, beam_size):
  """Sources of 3 to 15 tokens, in batches of 2 with a filler row: one shape, so one trace."""
  name = "greedy" if beam_size == 1 else "beam_search"
  static = ("model", "max_len", "bos_id", "eos_id", "no_repeat_ngram")
  static += ("beam_size", "alpha", "penalty") if beam_size > 1 else ()
  traced = jax.jit(chex.assert_max_traces(getattr(beam_search, name).__wrapped__, n=1), static_argnames=static)
  monkeypatch.setattr(beam_search, name, traced)
  sources = [list(range(3, 3 + n)) for n in (3, 7, 15, 5, 11)]
  out = beam_search.translate_ids(
    Transformer(CFG), params, sources, eos_id=2, beam_size=beam_size, batch_size=2, max_len=8
  )
  assert len(out) == 5 and all(len(o) <= 8 for o in out)


@pytest.mark.slow
@pytest.mark.parametrize("beam_size", [1, 3])
def test_batches_decode_on_threads_at_once_into_the_translations_of_each_sentence_alone(monkeypatch, beam_size):
  """With the CPU's kernels on a CPU device, `translate_ids` decodes its batches on one thread per core
  (kernels.decode_threads): the translations, in the sources' order, are those of decoding each
  sentence alone."""
  p, model = _scaled(_params(DEC_CFG)), Transformer(DEC_CFG)
  sources = [list(range(3, 3 + n)) for n in (3, 7, 15, 5, 11, 20, 4)]
  run = lambda sources: beam_search.translate_ids(
    model, p, sources, eos_id=2, beam_size=beam_size, batch_size=2, max_len=10
  )
  monkeypatch.setattr(decode_threads, "cpu_threads", lambda devices: 1)
  alone = [run([source])[0] for source in sources]
  name = "greedy" if beam_size == 1 else "beam_search"
  search, threads = getattr(beam_search, name), set()
  monkeypatch.setattr(beam_search, name, lambda *args, **kw: threads.add(threading.get_ident()) or search(*args, **kw))
  monkeypatch.setattr(decode_threads, "cpu_threads", lambda devices: 3)
  assert run(sources) == alone
  assert len(threads) > 1
  assert len({tuple(t) for t in alone}) > 3  # varied translations, not one repeated output
