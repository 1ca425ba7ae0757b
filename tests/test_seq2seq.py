"""The encoder-decoder Transformer (transformer.models.seq2seq) and its decoding (greedy, beam)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import layers
from transformer.layers import ConfigError
from transformer.models import seq2seq
from transformer.models.seq2seq import Transformer

CFG = seq2seq.preset("cpu-tiny", vocab_size=50, dropout_rate=0.0)
SRC = jnp.array([[3, 4, 5, 6, 0, 0], [7, 8, 9, 10, 11, 12]])
VALID = SRC != 0
TGT = jnp.array([[1, 5, 6, 7, 8], [1, 2, 3, 4, 9]])


def _params(cfg=CFG, seed=0):
  return nn.unbox(Transformer(cfg).init(jax.random.key(seed), SRC, TGT, source_valid_BxS=VALID)["params"])


@pytest.fixture(scope="module")
def params():
  return _params()


def test_sinusoidal_positions_are_the_papers():
  pe = layers.sinusoidal_positions(50, 16)
  pos, i = 7, 3
  assert np.isclose(pe[pos, 2 * i], np.sin(pos / 10000 ** (2 * i / 16)))
  assert np.isclose(pe[pos, 2 * i + 1], np.cos(pos / 10000 ** (2 * i / 16)))


@pytest.mark.parametrize("changes", [{}, {"pre_layer_norm": True}, {"share_embeddings": False, "tie_output": False},
                                     {"attention": "einsum"}, {"scan_layers": True}])
def test_shapes_and_variants(changes):
  cfg = CFG.replace(**changes)
  params = _params(cfg)
  logits_BxTxV = Transformer(cfg).apply({"params": params}, SRC, TGT, source_valid_BxS=VALID)
  assert logits_BxTxV.shape == (2, 5, 50) and np.isfinite(np.asarray(logits_BxTxV)).all()
  names = {"/".join(map(str, p)) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
  assert any("target_embed" in n for n in names) == (not cfg.share_embeddings)
  assert any("head" in n for n in names) == (not cfg.tie_output)
  assert any("encoder_norm" in n for n in names) == cfg.pre_layer_norm


def test_every_parameter_has_logical_axis_names():
  boxed = Transformer(CFG).init(jax.random.key(0), SRC, TGT, source_valid_BxS=VALID)["params"]
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert leaves and all(isinstance(x, nn.Partitioned) for x in leaves)


def test_source_padding_does_not_change_outputs(params):
  model = Transformer(CFG)
  padded = model.apply({"params": params}, SRC, TGT, source_valid_BxS=VALID)[0]
  alone = model.apply({"params": params}, SRC[:1, :4], TGT[:1])[0]
  np.testing.assert_allclose(padded, alone, atol=1e-5)
  # Different padding tokens in the padded slots: still the same.
  other = model.apply({"params": params}, SRC.at[0, 4:].set(17), TGT, source_valid_BxS=VALID)[0]
  np.testing.assert_allclose(other, padded, atol=1e-6)


def test_decoder_is_causal(params):
  model = Transformer(CFG)
  base = model.apply({"params": params}, SRC, TGT, source_valid_BxS=VALID)
  changed = model.apply({"params": params}, SRC, TGT.at[:, 3].set(40), source_valid_BxS=VALID)
  np.testing.assert_allclose(changed[:, :3], base[:, :3], atol=1e-6)
  assert np.abs(np.asarray(changed[:, 3:] - base[:, 3:])).max() > 1e-3


def test_changing_the_source_changes_the_output(params):
  model = Transformer(CFG)
  base = model.apply({"params": params}, SRC, TGT, source_valid_BxS=VALID)
  changed = model.apply({"params": params}, SRC.at[1, 2].set(30), TGT, source_valid_BxS=VALID)
  assert np.abs(np.asarray(changed[1] - base[1])).max() > 1e-3  # cross-attention is wired
  np.testing.assert_allclose(changed[0], base[0], atol=1e-6)  # and per example


def test_cached_decoding_equals_full_forward(params):
  model = Transformer(CFG)
  full = model.apply({"params": params}, SRC, TGT, source_valid_BxS=VALID)
  encoded = model.apply({"params": params}, SRC, source_valid_BxS=VALID, method="encode")
  step_model = Transformer(CFG, decode=True)
  cache = jax.eval_shape(lambda: step_model.init(jax.random.key(0), SRC, TGT, source_valid_BxS=VALID))["cache"]
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache)
  steps = []
  for t in range(TGT.shape[1]):
    logits, variables = step_model.apply({"params": params, "cache": cache}, encoded if t == 0 else None,
                                         TGT[:, t:t + 1], source_valid_BxS=VALID, mutable=["cache"],
                                         method="decode_logits")
    cache = variables["cache"]
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


def test_bad_config_and_lengths():
  with pytest.raises(ConfigError, match="unknown Transformer preset 'transformer_huge'"):
    seq2seq.preset("transformer_huge")
  with pytest.raises(ConfigError, match="d_model=100 is not divisible by num_heads=8"):
    seq2seq.preset("transformer_base", vocab_size=10, d_model=100)
  with pytest.raises(ConfigError, match="vocab_size must be positive"):
    seq2seq.preset("transformer_base")
  with pytest.raises(ConfigError, match="a source of 40 tokens is longer than max_len=32"):
    Transformer(CFG).init(jax.random.key(0), jnp.zeros((1, 40), jnp.int32), TGT[:1])


def test_presets_have_the_papers_sizes():
  count = lambda cfg: sum(x.size for x in jax.tree.leaves(nn.unbox(jax.eval_shape(
      lambda: Transformer(cfg).init(jax.random.key(0), SRC, TGT)["params"]))))
  # Table 3 of the paper: base 65M, big 213M (with a ~37k shared vocabulary; biases and norms vary).
  assert 62e6 < count(seq2seq.preset("transformer_base", vocab_size=37000)) < 66e6
  assert 210e6 < count(seq2seq.preset("transformer_big", vocab_size=37000)) < 216e6


DEC_CFG = CFG.replace(tie_output=False)  # a tied head at random init just repeats its input token
BOS = 1


def _scaled(params, scale=2.0):
  """Weights scaled up so that the next-token distributions are far from uniform and outputs vary."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x if "ln" in jax.tree_util.keystr(path) else x * scale, params)


def _sequence_log_prob(params, source, valid, tokens, eos):
  """log p(tokens + <eos>) by one full forward pass (the reference for beam scores)."""
  logits = Transformer(DEC_CFG).apply({"params": params}, source[None], jnp.array([[BOS] + tokens]),
                                      source_valid_BxS=valid[None])[0]
  lp = jax.nn.log_softmax(logits)
  return float(sum(lp[t, n] for t, n in enumerate(tokens + [eos])))


def test_beam_size_one_equals_greedy_and_beams_are_sorted_by_their_scores():
  from transformer import translate
  p = _scaled(_params(DEC_CFG))
  model = Transformer(DEC_CFG)
  unstopped = translate.greedy(p, SRC, VALID, model=model, max_len=12, bos_id=BOS, eos_id=49)
  eos = int(unstopped[0, 4])  # a token greedy emits: hypotheses do end
  greedy = translate.greedy(p, SRC, VALID, model=model, max_len=12, bos_id=BOS, eos_id=eos)
  beam1, _ = translate.beam_search(p, SRC, VALID, model=model, beam_size=1, max_len=12, alpha=0.0, bos_id=BOS,
                                   eos_id=eos)
  assert [translate.strip(g, eos) for g in greedy] == [translate.strip(b[0], eos) for b in beam1]
  tokens, scores = translate.beam_search(p, SRC, VALID, model=model, beam_size=4, max_len=12, alpha=0.6,
                                         bos_id=BOS, eos_id=eos)
  scores = np.asarray(scores)
  assert (np.diff(scores, axis=1) <= 1e-6).all()  # best first
  checked = 0
  for b in range(2):
    hyps = [translate.strip(t, eos) for t in tokens[b]]
    assert len({tuple(h) for h in hyps}) == 4
    for hyp, score in zip(hyps, scores[b]):
      if len(hyp) < 12:  # ended with <eos>: its score is log p over the GNMT penalty
        want = _sequence_log_prob(p, SRC[b], VALID[b], hyp, eos) / translate.length_penalty(len(hyp) + 1, 0.6)
        assert np.isclose(score, want, atol=1e-3), (hyp, score, want)
        checked += 1
  assert checked >= 4
  # Under its own score the beam's best is at least as good as greedy's output.
  g0 = translate.strip(greedy[0], eos)
  g_score = _sequence_log_prob(p, SRC[0], VALID[0], g0, eos) / translate.length_penalty(len(g0) + 1, 0.6)
  assert scores[0, 0] >= g_score - 1e-4
