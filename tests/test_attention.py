"""Attention's guarantees, for every model family, in the inner loop (tiny sizes, the fast tier): a
token never sees the future, a packed document or sentence pair sees only itself, and padding changes
nothing. Each runs under the forms a run takes by default (config.model.kernels=auto: the CPU's here)
and the reference, so an edit of transformer/layers/ or of transformer.kernels that breaks one fails here.

And the mechanism registry's promise: an attention mechanism defined outside the library (ALiBi,
Press et al. 2022) is one `layers.register_mechanism` call, after which it trains through
`train_and_evaluate` and decodes through the sampler with the KV cache, unchanged."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import shakespeare
from transformer import inference, layers, metrics, train
from transformer.generation import sampling
from transformer.models.encoder import Encoder, EncoderConfig
from transformer.models.gpt import GPT, GPTConfig
from transformer.models.seq2seq import Transformer, preset
from transformer.tasks.lm import document_ids

from conftest import compiled_init


def alibi_scores(attn, x_BxTxD, q_BxTxHxK, k_BxSxHxK, positions):
  """ALiBi: dot products minus a per-head slope times the distance from the query back to the key
  (the slopes 2^(-8h/H) of the paper); no position embeddings needed."""
  q_positions_BxT, k_positions_BxS = positions
  H = q_BxTxHxK.shape[2]
  slopes_H = 2.0 ** (-8.0 * jnp.arange(1, H + 1) / H)
  distance_BxTxS = (q_positions_BxT[:, :, None] - k_positions_BxS[:, None, :]).astype(jnp.float32)
  scores_BxHxTxS = layers.dot_product_scores(attn, x_BxTxD, q_BxTxHxK, k_BxSxHxK, positions)
  return scores_BxHxTxS - slopes_H[None, :, None, None] * distance_BxTxS[:, None]


@pytest.fixture(scope="module", autouse=True)
def alibi():
  layers.register_mechanism("alibi", layers.Mechanism(alibi_scores))
  yield
  del layers.MECHANISMS["alibi"]


GPT_TINY = GPTConfig().replace(vocab_size=50, max_len=32, num_layers=2, num_heads=2, d_model=32)
GPT_VARIANTS = {
  "gpt2": {},  # kernels=auto: causal self-attention by the CPU's blocks, masked by XLA's kernel
  "reference": {"kernels": "reference"},
  "modern": {"positions": "rope", "norm": "rms_norm", "qk_norm": True, "activation": "relu2"},
  "synthesizer_dense": {"attention_mechanism": "synthesizer_dense"},
  "alibi": {"attention_mechanism": "alibi", "positions": "none"},
}


@functools.lru_cache  # each variant initialised once in a test process
def _gpt(variant: str):
  cfg = GPT_TINY.replace(**GPT_VARIANTS[variant])
  model = GPT(cfg)
  if variant == "reference":  # the kernels change no parameter: gpt2's, not another compiled init
    return model, _gpt("gpt2")[1]
  return model, {"params": compiled_init(model, jnp.zeros((1, 8), jnp.int32))}


def _future_changed(tokens_T, vocab_size: int):
  """T rows: row t has every token after t changed (row T - 1 is the tokens themselves)."""
  T = len(tokens_T)
  return np.stack([np.where(np.arange(T) > t, (tokens_T + 7) % vocab_size, tokens_T) for t in range(T)])


def _assert_causal(logits_TxTxV):
  """Row t's logits up to position t equal the unchanged row's; at t + 1 they differ."""
  logits_TxTxV = np.asarray(logits_TxTxV)  # read on the host: a slice a position, no program each
  base = logits_TxTxV[-1]
  for t in range(len(base) - 1):
    np.testing.assert_allclose(
      logits_TxTxV[t, : t + 1], base[: t + 1], atol=1e-5, err_msg=f"position {t} sees the future"
    )
    assert np.abs(logits_TxTxV[t, t + 1] - base[t + 1]).max() > 1e-5


@pytest.mark.parametrize("variant", GPT_VARIANTS)
def test_a_gpt_token_never_sees_the_future(variant):
  model, params = _gpt(variant)
  tokens_T = np.random.default_rng(1).integers(0, GPT_TINY.vocab_size, 10, np.int32)
  _assert_causal(jax.jit(model.apply)(params, _future_changed(tokens_T, GPT_TINY.vocab_size)))


@pytest.mark.parametrize("variant", GPT_VARIANTS)
def test_a_gpt_document_sees_only_itself_and_padding_changes_nothing(variant):
  """Three rows end in the same document: after two different documents, after three, and alone
  after left padding. Its logits are the same in all three; without segments they are not."""
  model, params = _gpt(variant)
  eot, doc = 49, [7, 3, 3, 9, 12, 4]
  rows = np.array(
    [
      [eot, 1, 2, 3, 8, 8, 8, 8, 1, 0, eot, *doc],
      [eot, 5, 6, eot, 3, 3, 3, 3, 3, eot, eot, *doc],
      [0] * 10 + [eot, *doc],
    ]
  )
  valid = np.ones(rows.shape, bool)
  valid[2, :10] = False
  logits = jax.jit(lambda p, t, v: model.apply(p, t, valid_BxT=v, segments_BxT=document_ids(t, eot)))(
    params, rows, valid
  )
  tails = np.asarray(logits[:, -len(doc) - 1 :])
  np.testing.assert_allclose(tails[0], tails[2], atol=1e-5)
  np.testing.assert_allclose(tails[1], tails[2], atol=1e-5)
  joined = jax.jit(model.apply)(params, rows[:1])  # without segments the earlier documents are read
  assert np.abs(np.asarray(joined[0, -len(doc) - 1 :]) - tails[2]).max() > 1e-4


@functools.lru_cache
def _initialised(model, num_inputs: int):
  """`model`'s parameters, initialised once in a test process: a model's kernels change none of them,
  nor do its inputs' lengths, so every test and kernels setting of a model reads the same ones."""
  return {"params": compiled_init(model, *[jnp.zeros((1, 4), jnp.int32)] * num_inputs)}


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_an_encoders_states_do_not_depend_on_its_padding(kernels):
  cfg = EncoderConfig(vocab_size=40, max_len=16, num_layers=2).replace(
    d_model=32, num_heads=2, d_mlp=64, kernels=kernels
  )
  model = Encoder(cfg)
  tokens = np.array([[5, 6, 7, 8, 0, 0], [5, 6, 7, 8, 9, 9]])
  valid = np.arange(6)[None] < 4
  params = _initialised(Encoder(cfg.replace(kernels="reference")), 1)
  with jax.default_matmul_precision("highest"):  # a GPU's default (TF32) products differ by ~1e-3 by shape
    padded = jax.jit(lambda p, t: model.apply(p, t, valid_BxT=jnp.broadcast_to(valid, t.shape)))(params, tokens)
    alone = jax.jit(model.apply)(params, tokens[:1, :4])
  np.testing.assert_allclose(padded[0, :4], alone[0], atol=1e-5)
  np.testing.assert_allclose(padded[1, :4], alone[0], atol=1e-5)  # other padding tokens: the same


S2S = preset("cpu-tiny", vocab_size=50, dropout_rate=0.0)


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_a_translation_decoder_token_never_sees_the_future(kernels):
  model = Transformer(S2S.replace(kernels=kernels))
  source = np.array([[3, 4, 5, 6]])
  target_T = np.array([1, 5, 6, 7, 8, 9, 10])
  params = _initialised(Transformer(S2S), 2)
  targets = _future_changed(target_T, S2S.vocab_size)
  _assert_causal(jax.jit(model.apply)(params, np.repeat(source, len(targets), 0), targets))


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_a_packed_sentence_pair_sees_only_itself_and_source_padding_changes_nothing(kernels):
  """Pair B packed after pair A in one row, and alone in a padded row (padding tokens differing):
  its logits are the same."""
  model = Transformer(S2S.replace(kernels=kernels))
  a_src, a_tgt, b_src, b_tgt = [11, 12, 13], [1, 21, 22], [14, 15, 16, 17], [1, 23, 24, 25]
  source = np.array([a_src + b_src, b_src + [0, 0, 0], b_src + [9, 9, 9]])
  target = np.array([a_tgt + b_tgt, b_tgt + [0, 0, 0], b_tgt + [0, 0, 0]])
  source_segments = np.array([[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0]])
  target_segments = np.array([[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0]])
  params = _initialised(Transformer(S2S), 2)
  apply = jax.jit(
    lambda p, s, t, ss, ts: model.apply(
      p, s, t, source_valid_BxS=ss > 0, source_segments_BxS=ss, target_segments_BxT=ts
    )
  )
  logits = np.asarray(apply(params, source, target, source_segments, target_segments))
  np.testing.assert_allclose(logits[0, 3:], logits[1, :4], atol=1e-5)
  np.testing.assert_allclose(logits[2, :4], logits[1, :4], atol=1e-5)
  unpacked = np.asarray(jax.jit(model.apply)(params, source[:1], target[:1]))  # pair B then reads pair A
  assert np.abs(unpacked[0, 3:] - logits[1, :4]).max() > 1e-4


def test_a_registered_mechanism_is_a_config_value_and_unknown_names_list_it():
  assert GPT_TINY.replace(attention_mechanism="alibi").check().block.attention_mechanism == "alibi"
  with pytest.raises(Exception, match="choose one of dot_product, .*, alibi"):
    GPT_TINY.replace(attention_mechanism="alibi2").check()
  with pytest.raises(TypeError, match="takes a layers.Mechanism"):
    layers.register_mechanism("bad", alibi_scores)


@pytest.mark.slow
def test_a_mechanism_registered_outside_the_library_trains_and_decodes_unchanged(tmp_path):
  """ALiBi, defined above, through the main training loop and the KV-cache sampler: it learns, and
  greedy decoding with the cache gives the tokens of full forward passes (the sliding sampler)."""
  config = shakespeare.get_config("tiny")
  config.data.root = str(tmp_path / "data")
  config.model.positions = "none"
  config.model.block.attention_mechanism = "alibi"
  train.train_and_evaluate(config, tmp_path / "w")
  losses = metrics.last_per_step(metrics.read_jsonl(tmp_path / "w" / "metrics.jsonl"), "loss")
  assert losses[40] < losses[5] - 0.5, losses  # it learns
  trained = inference.restore(tmp_path / "w")
  assert trained.model.config.block.attention_mechanism == "alibi"
  prompts = [trained.tokenizer.encode("ROMEO:"), trained.tokenizer.encode("To be, or")]
  greedy = sampling.Sampling(temperature=0)
  cached = sampling.generate(trained.model, trained.params, prompts, max_new_tokens=12, sampling=greedy)
  for prompt, tokens in zip(prompts, cached):
    full = sampling.generate_sliding(trained.model, trained.params, prompt, max_new_tokens=12, sampling=greedy)
    assert tokens == full
