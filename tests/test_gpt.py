import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import layers
from transformer.errors import ConfigError
from transformer.models.gpt import GPT, GPTConfig, count_params, preset

from conftest import compiled_apply, compiled_init

TINY = GPTConfig().replace(vocab_size=61, max_len=16, num_layers=2, num_heads=4, d_model=32)


def _init(cfg, T=8, seed=0):
  return compiled_init(GPT(cfg), np.zeros((1, T), np.int32), seed=seed)


def _tokens(cfg, B=2, T=8, seed=1):
  return _randint(seed, (B, T), cfg.vocab_size)


_randint = jax.jit(
  lambda seed, shape, high: jax.random.randint(jax.random.key(seed), shape, 0, high), static_argnums=(0, 1, 2)
)


@pytest.mark.parametrize(
  "name,expected",
  [("gpt2", 124_439_808), ("gpt2-medium", 354_823_168), ("gpt2-large", 774_030_080), ("gpt2-xl", 1_557_611_200)],
)
@pytest.mark.slow
def test_preset_parameter_counts(name, expected):
  assert count_params(preset(name)) == expected  # jax.eval_shape: nothing allocated
  assert count_params(preset(name, scan_layers=True)) == expected
  untied = count_params(preset(name, tie_embeddings=False))
  assert untied == expected + 50257 * preset(name).block.d_model


@pytest.mark.slow
def test_gpt2_124m_seed_batch():
  cfg = preset("gpt2")
  model = GPT(cfg)
  tokens_BxT = jnp.array([[6109, 3626, 6100, 345], [6109, 1110, 6622, 257]])
  # The preset's shapes, filled from numpy's normal: drawing 124M numbers through the model's own
  # initializers takes ~20 s on a CPU, and the tiny configs test those initializers.
  shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens_BxT))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: 0.02 * rng.standard_normal(s.shape, np.float32), shapes)
  logits_BxTxV = jax.jit(model.apply)(params, tokens_BxT)
  chex.assert_shape(logits_BxTxV, (2, 4, 50257))
  chex.assert_tree_all_finite(logits_BxTxV)


@pytest.mark.slow
def test_every_parameter_has_logical_axes():
  for cfg in (TINY, TINY.replace(scan_layers=True), TINY.replace(tie_embeddings=False)):
    boxed = jax.eval_shape(GPT(cfg).init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]  # traced only
    leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert leaves and all(isinstance(x, nn.Partitioned) for x in leaves)
    for x in leaves:
      assert len(x.names) == x.value.ndim
      assert set(x.names) <= {None, "vocab", "embed", "heads", "kv", "mlp", "position", "layers"}
      if cfg.scan_layers and x.value.ndim and x.names[0] == "layers":
        assert x.value.shape[0] == cfg.num_layers


class TestVariants(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_and_no_jit_agree(self):
    params = _init(TINY)
    tokens = _tokens(TINY)
    apply = self.variant(lambda p, t: GPT(TINY).apply({"params": p}, t))
    logits = apply(params, tokens)
    chex.assert_shape(logits, (2, 8, TINY.vocab_size))
    reference = jax.jit(lambda p, t: GPT(TINY).apply({"params": p}, t))(params, tokens)
    np.testing.assert_allclose(logits, reference, atol=1e-5)


# Today's options together (each one config value: transformer.models.gpt's docstring).
MODERN = {"positions": "rope", "norm": "rms_norm", "activation": "swiglu", "qk_norm": True, "logits_softcap": 5.0}


def _axis_names(cfg) -> dict:
  """Every parameter's path ("h/layer_0/attn/qkv/kernel") -> its logical axis names, allocating nothing."""
  boxed = jax.eval_shape(GPT(cfg).init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
  leaves = jax.tree_util.tree_flatten_with_path(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]
  return {"/".join(k.key for k in path): x.names for path, x in leaves}


def test_each_option_makes_the_parameters_it_names_with_logical_axes():
  gpt2, modern = _axis_names(TINY), _axis_names(TINY.replace(**MODERN, tie_embeddings=False))
  assert "wpe" in gpt2 and "wpe" not in modern  # rotary: no position table
  for positions in ("sinusoidal", "none"):  # a fixed table, or none: no parameter either
    assert "wpe" not in _axis_names(TINY.replace(positions=positions))
  assert "h/layer_0/ln_1/bias" in gpt2 and "h/layer_0/ln_1/bias" not in modern  # RMSNorm: a scale only
  assert modern["h/layer_0/mlp/gate/kernel"] == ("embed", "mlp")  # SwiGLU's third projection
  assert modern["h/layer_0/attn/q_norm/scale"] == modern["h/layer_0/attn/k_norm/scale"] == ("kv",)
  assert modern["lm_head/kernel"] == ("embed", "vocab")
  assert all(len(n) for n in modern.values())


def test_softcapped_logits_stay_within_the_cap():
  cfg = TINY.replace(logits_softcap=0.5)
  params = jax.tree.map(lambda x: np.asarray(x) * 50, _init(cfg))  # logits far beyond the cap without it
  logits = np.asarray(compiled_apply(GPT(cfg), {"params": params}, _tokens(cfg)))
  assert float(np.abs(logits).max()) <= 0.5 and float(np.abs(logits).max()) > 0.4


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["einsum", "xla", "modern"])
def test_causality(attention):
  cfg = TINY.replace(**MODERN) if attention == "modern" else TINY.replace(attention=attention)
  params = _init(cfg)
  tokens = np.asarray(_tokens(cfg, B=1, T=10))
  logits = np.asarray(compiled_apply(GPT(cfg), {"params": params}, tokens))
  for t in range(9):
    changed = tokens.copy()
    changed[0, t + 1 :] = (tokens[0, t + 1 :] + 7) % cfg.vocab_size
    other = np.asarray(compiled_apply(GPT(cfg), {"params": params}, changed))
    np.testing.assert_allclose(other[0, : t + 1], logits[0, : t + 1], atol=1e-6)
    assert not np.allclose(other[0, t + 1], logits[0, t + 1])  # and the future does change

  if cfg.positions != "learned":
    return  # the gradients below flow through the position table

  # Gradients: logit at position t does not depend on the input at positions > t (through the
  # position embedding added there).
  def logit_sum_at(wpe, t):
    p = {**params, "wpe": wpe}
    return GPT(cfg).apply({"params": p}, tokens)[0, t].sum()

  grad = jax.jit(jax.grad(logit_sum_at), static_argnums=1)  # one program a position, not op by op
  for t in (0, 4, 8):
    g = np.asarray(grad(params["wpe"], t))
    assert np.all(g[t + 1 :] == 0), f"position {t} sees the future"
    assert np.any(g[: t + 1] != 0)


def test_attention_implementations_agree():
  params = _init(TINY)
  tokens = _tokens(TINY)
  ref = compiled_apply(GPT(TINY.replace(attention="einsum")), {"params": params}, tokens)
  xla = compiled_apply(GPT(TINY.replace(attention="xla")), {"params": params}, tokens)
  np.testing.assert_allclose(xla, ref, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("remat", ["none", "dots", "full"])
def test_scan_and_unrolled_agree(remat):
  params = _init(TINY)
  tokens = _tokens(TINY)
  unrolled = compiled_apply(GPT(TINY), {"params": params}, tokens)
  scanned_cfg = TINY.replace(scan_layers=True, remat_policy=remat)
  scanned_params = {**params, "h": layers.stack_layers(params["h"], TINY.num_layers)}
  scanned = compiled_apply(GPT(scanned_cfg), {"params": scanned_params}, tokens)
  np.testing.assert_allclose(scanned, unrolled, atol=1e-5)
  # The scanned init has the same structure as the stacked params, and unstacking inverts.
  assert jax.tree.structure(_init(scanned_cfg)) == jax.tree.structure(scanned_params)
  back = layers.unstack_layers(scanned_params["h"], TINY.num_layers)
  chex.assert_trees_all_equal(back, params["h"])
  # Gradients agree too (remat changes what is stored, not what is computed).
  loss = lambda cfg: lambda p: GPT(cfg).apply({"params": p}, tokens).mean()
  g_unrolled = jax.jit(jax.grad(loss(TINY)))(params)
  g_scanned = jax.jit(jax.grad(loss(scanned_cfg)))(scanned_params)
  np.testing.assert_allclose(
    layers.stack_layers(g_unrolled["h"], 2)["layers"]["mlp"]["fc"]["kernel"],
    g_scanned["h"]["layers"]["mlp"]["fc"]["kernel"],
    atol=1e-6,
  )


@pytest.mark.slow
def test_dropout_only_in_training():
  cfg = TINY.replace(dropout_rate=0.3, attention_dropout_rate=0.2, attention="einsum")
  params = _init(cfg)
  tokens = _tokens(cfg)
  model = GPT(cfg)
  eval_a = compiled_apply(model, {"params": params}, tokens)
  eval_b = compiled_apply(model, {"params": params}, tokens, deterministic=True)
  np.testing.assert_array_equal(eval_a, eval_b)
  train_a = compiled_apply(model, {"params": params}, tokens, deterministic=False, rngs={"dropout": jax.random.key(1)})
  train_b = compiled_apply(model, {"params": params}, tokens, deterministic=False, rngs={"dropout": jax.random.key(2)})
  assert not np.allclose(train_a, eval_a) and not np.allclose(train_a, train_b)
  # Same config with zero rates: training mode is the eval function.
  cfg0 = TINY.replace(attention="einsum")
  p0 = _init(cfg0)
  np.testing.assert_allclose(
    compiled_apply(GPT(cfg0), {"params": p0}, tokens, deterministic=False, rngs={"dropout": jax.random.key(1)}),
    compiled_apply(GPT(cfg0), {"params": p0}, tokens),
    atol=1e-6,
  )


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_params_and_logits():
  cfg = TINY.replace(dtype="bfloat16")
  params = _init(cfg)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  logits = compiled_apply(GPT(cfg), {"params": params}, _tokens(cfg))
  assert logits.dtype == jnp.float32
  chex.assert_tree_all_finite(logits)
  ref = compiled_apply(GPT(TINY), {"params": params}, _tokens(cfg))
  np.testing.assert_allclose(logits, ref, atol=0.1)


@pytest.mark.parametrize(
  "changes,message",
  [
    (dict(d_model=30, num_heads=4), "block.d_model=30 is not divisible by block.num_heads=4"),
    (dict(attention="flash"), "unknown block.attention implementation 'flash'; choose one of einsum, xla, cudnn"),
    (dict(attention_mechanism="alibi"), "unknown block.attention_mechanism 'alibi'; choose one of dot_product, synth"),
    (dict(attention_dropout_rate=0.1), "attention_dropout_rate=0.1 needs block.attention='einsum'"),
    (dict(remat_policy="some"), "unknown remat_policy 'some'"),
    (dict(dtype="float12"), "unknown dtype 'float12'"),
    (dict(vocab_size=0), "vocab_size must be positive"),
    (dict(layer_norm_epsilon=0.0), "layer_norm_epsilon must be positive"),
    (dict(positions="alibi"), "unknown positions 'alibi'; choose one of learned, sinusoidal, rope, none"),
    (dict(norm="batch_norm"), "unknown block.norm 'batch_norm'; choose one of layer_norm, rms_norm"),
    (dict(activation="reglu"), "unknown block.activation 'reglu'; choose one of gelu_tanh, gelu, gelu_erf, relu"),
    (dict(num_heads=4, num_kv_heads=3), "block.num_heads=4 is not a multiple of block.num_kv_heads=3"),
    (dict(rotary=layers.RotaryConfig(scaling="ntk")), "unknown block.rotary.scaling 'ntk'; choose one of none, linear"),
    (
      dict(rotary=layers.RotaryConfig(scaling="yarn", factor=4.0)),
      "scaling='yarn' needs block.rotary.original_max_len",
    ),
    (dict(branch_norms="sandwich"), "unknown block.branch_norms 'sandwich'; choose one of pre, pre_post, post"),
    (dict(parallel=True, pre_layer_norm=False), "block.parallel=True needs block.pre_layer_norm=True"),
    (dict(sliding_window=-1), "block.sliding_window must be >= 0"),
    (dict(sliding_window=4, global_layers=(5,)), r"global_layers=\(5,\) names layers a 2-layer model lacks"),
    (dict(positions="rope", d_model=36, num_heads=4), "9 of its 9 channels .* must be even"),
    (dict(positions="rope", attention_mechanism="synthesizer_dense"), "has no keys to rotate: rotary positions need"),
    (dict(qk_norm=True, attention_mechanism="synthesizer_random"), "has no keys to normalise: block.qk_norm needs"),
    (dict(logits_softcap=-1.0), "logits_softcap must be >= 0"),
  ],
)
def test_bad_configs(changes, message):
  with pytest.raises(ConfigError, match=message):
    TINY.replace(**changes).check()


def test_unknown_preset():
  with pytest.raises(ConfigError, match="unknown GPT preset 'gpt3'"):
    preset("gpt3")


def test_sequence_longer_than_context():
  params = _init(TINY)
  with pytest.raises(ConfigError, match="17 tokens is longer than max_len=16"):
    jax.eval_shape(GPT(TINY).apply, {"params": params}, jnp.zeros((1, 17), jnp.int32))


def test_segment_positions_restart_and_skip_padding():
  valid = np.array([[1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 1, 1]], bool)
  segments = np.array([[0, 0, 0, 1, 1, 2], [0, 0, 0, 0, 1, 1]])
  positions = jax.jit(layers.segment_positions)  # one program each, not op by op
  np.testing.assert_array_equal(positions(None, segments), [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]])
  np.testing.assert_array_equal(positions(valid, segments), [[0, 1, 2, 0, 1, 0], [0, 0, 1, 1, 0, 1]])
  np.testing.assert_array_equal(positions(valid, None), [[0, 1, 2, 3, 4, 5], [0, 0, 1, 1, 2, 3]])
  mask = jax.jit(layers.self_attention_mask, static_argnames="causal")(None, segments[:1], causal=True)[0]
  np.testing.assert_array_equal(mask[4], [0, 0, 0, 1, 1, 0])  # its own document, up to itself
  np.testing.assert_array_equal(mask[5], [0, 0, 0, 0, 0, 1])


@pytest.mark.parametrize(
  "attention,mechanism",
  [("einsum", "dot_product"), ("xla", "dot_product"), ("xla", "synthesizer_dense"), ("xla", "synthesizer_random")],
)
@pytest.mark.slow
def test_a_documents_logits_do_not_depend_on_the_documents_before_it(attention, mechanism):
  """Packed rows (tasks.lm document_ids): a document sees only itself, from position 0, whatever
  came before it in the row, exactly as if it began the row."""
  from transformer.tasks.lm import document_ids

  cfg = GPTConfig().replace(
    vocab_size=50, max_len=32, num_layers=2, num_heads=2, d_model=32, attention=attention, attention_mechanism=mechanism
  )
  params = _init(cfg)
  eot, doc = 49, [7, 3, 3, 9, 12, 4]
  rows = [[eot, 5, 6, 7, eot, *doc], [eot, 1, 2, 3, 8, 8, 8, 8, 1, 0, eot, *doc], [eot, *doc]]
  model = GPT(cfg)
  tails = []
  for row in rows:
    tokens = jnp.array([row])
    logits = compiled_apply(model, {"params": params}, tokens, segments_BxT=document_ids(tokens, eot))
    tails.append(np.asarray(logits[0, -len(doc) - 1 :]))
  np.testing.assert_allclose(tails[0], tails[2], atol=1e-5)
  np.testing.assert_allclose(tails[1], tails[2], atol=1e-5)
  # Without segments the earlier document is read: the logits differ.
  joined = compiled_apply(model, {"params": params}, jnp.array([rows[0]]))
  assert np.abs(np.asarray(joined[0, -len(doc) - 1 :]) - tails[2]).max() > 1e-3


@pytest.mark.parametrize(
  "changes",
  [{}, {"positions": "rope", "norm": "rms_norm", "attention": "einsum"}, {"norm": "none", "num_layers": 1}],
)
def test_last_only_gives_the_last_positions_logits_and_gradients(changes):
  """last_only computes the last block at the last position alone: the same logits and gradients."""
  cfg = TINY.replace(**changes).check()
  params, tokens = _init(cfg), _tokens(cfg, B=3, T=7)
  model = GPT(cfg)
  full = lambda p: model.apply({"params": p}, tokens)[:, -1:]
  last = lambda p: model.apply({"params": p}, tokens, last_only=True)
  loss = lambda f: lambda p: jnp.sum(jax.nn.log_softmax(f(p))[..., 3])
  both = jax.jit(lambda p: [(f(p), jax.grad(loss(f))(p)) for f in (last, full)])  # one program, not op by op
  (logits, grads), (full_logits, full_grads) = both(params)
  np.testing.assert_allclose(logits, full_logits, rtol=1e-6, atol=1e-6)
  chex.assert_trees_all_close(grads, full_grads, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="last_only needs unrolled layers"):
    jax.eval_shape(lambda: GPT(cfg.replace(scan_layers=True)).init(jax.random.key(0), tokens, last_only=True))
