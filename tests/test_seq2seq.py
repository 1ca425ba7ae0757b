"""The encoder-decoder Transformer (transformer.models.seq2seq); its decoding is tested in test_beam_search."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.errors import ConfigError
from transformer.models import seq2seq
from transformer.models.seq2seq import Transformer

from conftest import compiled_apply, compiled_init, replaced

CFG = seq2seq.preset("cpu-tiny", vocab_size=50, dropout_rate=0.0)
SRC = np.array([[3, 4, 5, 6, 0, 0], [7, 8, 9, 10, 11, 12]], np.int32)
VALID = SRC != 0
TGT = np.array([[1, 5, 6, 7, 8], [1, 2, 3, 4, 9]], np.int32)


def _params(cfg=CFG, seed=0):
  return compiled_init(Transformer(cfg), SRC, TGT, seed=seed, source_valid_BxS=VALID)


@pytest.fixture(scope="module")
def params():
  return _params()


@pytest.mark.parametrize(
  "changes",
  [
    {},
    {"pre_layer_norm": True},
    {"share_embeddings": False, "tie_output": False},
    {"attention": "einsum"},
    {"scan_layers": True},
    {"num_layers": 3, "num_decoder_layers": 1},
    {"num_layers": 3, "num_decoder_layers": 1, "scan_layers": True},
    {"pre_layer_norm": True, "norm": "rms_norm", "activation": "swiglu", "qk_norm": True},  # the block's options
    {"sinusoids": "halves", "scale_embeddings": False, "logits_bias": True, "activation": "swish"},  # Marian's
  ],
)
@pytest.mark.slow
def test_shapes_and_variants(changes):
  cfg = CFG.replace(**changes)
  params = _params(cfg)
  logits_BxTxV = compiled_apply(Transformer(cfg), {"params": params}, SRC, TGT, source_valid_BxS=VALID)
  chex.assert_shape(logits_BxTxV, (2, 5, 50))
  chex.assert_tree_all_finite(logits_BxTxV)
  names = {"/".join(map(str, p)) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
  assert any("target_embed" in n for n in names) == (not cfg.share_embeddings)
  assert any("head" in n for n in names) == (not cfg.tie_output)
  assert any("encoder_norm" in n for n in names) == cfg.block.pre_layer_norm
  assert (
    any("q_norm" in n for n in names) == any("cross_attn" in n and "k_norm" in n for n in names) == cfg.block.qk_norm
  )
  assert any("gate" in n for n in names) == (cfg.block.activation == "swiglu")
  assert any("final_logits_bias" in n for n in names) == cfg.logits_bias
  depth = lambda stack: (
    jax.tree.leaves(params[stack]["layers"])[0].shape[0]
    if cfg.scan_layers
    else sum(k.startswith("layer_") for k in params[stack])
  )
  assert (depth("encoder"), depth("decoder")) == (cfg.num_layers, cfg.decoder_layers())


class VariantsTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_and_no_jit_agree_and_dropout_is_a_call_argument(self):
    cfg = CFG.replace(dropout_rate=0.3)
    params = _params()  # dropout has no parameters: CFG's
    apply = self.variant(
      lambda p, rng, train: Transformer(cfg).apply(
        {"params": p}, SRC, TGT, source_valid_BxS=VALID, deterministic=not train, rngs={"dropout": rng}
      ),
      static_argnums=2,
    )
    evaluated = apply(params, jax.random.key(1), False)
    chex.assert_shape(evaluated, (2, 5, 50))
    np.testing.assert_allclose(
      evaluated, compiled_apply(Transformer(cfg), {"params": params}, SRC, TGT, source_valid_BxS=VALID), atol=1e-5
    )
    trained = apply(params, jax.random.key(1), True)  # the same module, dropout on
    chex.assert_tree_all_finite(trained)
    assert not np.allclose(trained, evaluated)


def test_marians_variants_are_what_they_say(params):
  """Marian's options (what its weights need): sinusoids in halves are the interleaved ones' sines then
  cosines; unscaled embeddings change the output; the logits bias is added to every logit."""
  interleaved_LxD = seq2seq.layers.sinusoidal_positions(16, 8)
  halves_LxD = seq2seq.layers.sinusoidal_positions(16, 8, "halves")
  np.testing.assert_array_equal(halves_LxD, np.concatenate([interleaved_LxD[:, 0::2], interleaved_LxD[:, 1::2]], 1))
  plain = compiled_apply(Transformer(CFG), {"params": params}, SRC, TGT, source_valid_BxS=VALID)
  for changes in ({"sinusoids": "halves"}, {"scale_embeddings": False}):
    changed = compiled_apply(Transformer(CFG.replace(**changes)), {"params": params}, SRC, TGT, source_valid_BxS=VALID)
    assert np.abs(np.asarray(changed) - np.asarray(plain)).max() > 1e-3, changes
  biased = CFG.replace(logits_bias=True)
  bias_V = replaced(np.zeros(50, np.float32), 7, 3.0)
  logits = compiled_apply(
    Transformer(biased), {"params": {**params, "final_logits_bias": bias_V}}, SRC, TGT, source_valid_BxS=VALID
  )
  np.testing.assert_allclose(np.asarray(logits) - np.asarray(plain), np.broadcast_to(bias_V, plain.shape), atol=1e-5)
  with pytest.raises(ConfigError, match="unknown sinusoids 'shuffled'; choose one of interleaved, halves"):
    CFG.replace(sinusoids="shuffled").check()


def test_every_parameter_has_logical_axis_names():
  boxed = jax.eval_shape(lambda: Transformer(CFG).init(jax.random.key(0), SRC, TGT, source_valid_BxS=VALID))["params"]
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert leaves and all(isinstance(x, nn.Partitioned) for x in leaves)


@pytest.mark.slow
def test_source_padding_does_not_change_outputs(params):
  model = Transformer(CFG)
  padded = compiled_apply(model, {"params": params}, SRC, TGT, source_valid_BxS=VALID)[0]
  alone = compiled_apply(model, {"params": params}, SRC[:1, :4], TGT[:1])[0]
  np.testing.assert_allclose(padded, alone, atol=1e-5)
  # Different padding tokens in the padded slots: still the same.
  other = compiled_apply(
    model, {"params": params}, replaced(SRC, (0, slice(4, None)), 17), TGT, source_valid_BxS=VALID
  )[0]
  np.testing.assert_allclose(other, padded, atol=1e-6)


def test_decoder_is_causal(params):
  model = Transformer(CFG)
  base = compiled_apply(model, {"params": params}, SRC, TGT, source_valid_BxS=VALID)
  changed = compiled_apply(model, {"params": params}, SRC, replaced(TGT, (slice(None), 3), 40), source_valid_BxS=VALID)
  np.testing.assert_allclose(changed[:, :3], base[:, :3], atol=1e-6)
  assert np.abs(np.asarray(changed)[:, 3:] - np.asarray(base)[:, 3:]).max() > 1e-3


def test_changing_the_source_changes_the_output(params):
  model = Transformer(CFG)
  base = compiled_apply(model, {"params": params}, SRC, TGT, source_valid_BxS=VALID)
  changed = compiled_apply(model, {"params": params}, replaced(SRC, (1, 2), 30), TGT, source_valid_BxS=VALID)
  assert np.abs(np.asarray(changed)[1] - np.asarray(base)[1]).max() > 1e-3  # cross-attention is wired
  np.testing.assert_allclose(changed[0], base[0], atol=1e-6)  # and per example


def test_source_word_dropout_drops_whole_source_tokens_in_training_only(params):
  model = Transformer(CFG.replace(source_word_dropout=0.5))
  run = lambda src, deterministic, seed=0: compiled_apply(
    model,
    {"params": params},
    src,
    TGT,
    source_valid_BxS=VALID,
    deterministic=deterministic,
    rngs={"dropout": jax.random.key(seed)},
  )
  plain = compiled_apply(Transformer(CFG), {"params": params}, SRC, TGT, source_valid_BxS=VALID)
  np.testing.assert_array_equal(run(SRC, True), plain)  # evaluation and decoding: no dropout
  assert not np.allclose(run(SRC, False), plain)
  # A dropped token is gone, whatever it was: with every token dropped the source's ids do not matter.
  gone = Transformer(CFG.replace(source_word_dropout=0.999999))
  apply = lambda src: compiled_apply(
    gone, {"params": params}, src, TGT, source_valid_BxS=VALID, deterministic=False, rngs={"dropout": jax.random.key(1)}
  )
  np.testing.assert_allclose(apply(SRC), apply(np.where(VALID, SRC + 1, 0)), atol=1e-5)
  with pytest.raises(ConfigError, match=r"source_word_dropout must be in \[0, 1\)"):
    CFG.replace(source_word_dropout=1.0).check()
  with pytest.raises(ConfigError, match="num_decoder_layers must be >= 0"):
    CFG.replace(num_decoder_layers=-1).check()


def test_bad_config_and_lengths():
  with pytest.raises(ConfigError, match="unknown Transformer preset 'transformer_huge'"):
    seq2seq.preset("transformer_huge")
  with pytest.raises(ConfigError, match="block.d_model=100 is not divisible by block.num_heads=8"):
    seq2seq.preset("transformer_base", vocab_size=10, d_model=100)
  with pytest.raises(ConfigError, match="vocab_size must be positive"):
    seq2seq.preset("transformer_base")
  with pytest.raises(ConfigError, match="a source of 40 tokens is longer than max_len=32"):
    jax.eval_shape(Transformer(CFG).init, jax.random.key(0), jnp.zeros((1, 40), jnp.int32), TGT[:1])


def test_presets_have_the_papers_sizes():
  count = lambda cfg: sum(
    x.size
    for x in jax.tree.leaves(
      nn.unbox(jax.eval_shape(lambda: Transformer(cfg).init(jax.random.key(0), SRC, TGT)["params"]))
    )
  )
  # Table 3 of the paper: base 65M, big 213M (with a ~37k shared vocabulary; biases and norms vary).
  assert 62e6 < count(seq2seq.preset("transformer_base", vocab_size=37000)) < 66e6
  assert 210e6 < count(seq2seq.preset("transformer_big", vocab_size=37000)) < 216e6
