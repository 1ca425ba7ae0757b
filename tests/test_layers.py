"""The shared layers (transformer.layers): positions, masks, attention, the decode-mode cache
positions; the model tests (test_gpt, test_seq2seq) cover blocks and stacks through the models."""

import functools

import chex
import flax.linen as nn
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer import layers

from conftest import compiled_apply, compiled_init


def test_sinusoidal_positions_formula():
  pe = layers.sinusoidal_positions(50, 16)
  chex.assert_shape(pe, (50, 16))
  pos, i = 7, 3
  assert np.isclose(pe[pos, 2 * i], np.sin(pos / 10000 ** (2 * i / 16)))
  assert np.isclose(pe[pos, 2 * i + 1], np.cos(pos / 10000 ** (2 * i / 16)))


def test_causal_mask():
  mask = layers.causal_mask(4)
  chex.assert_shape(mask, (1, 4, 4))
  np.testing.assert_array_equal(mask[0], np.tril(np.ones((4, 4), bool)))
  np.testing.assert_array_equal(layers.causal_mask(2, 5)[0], [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def _qkv(B=2, T=5, S=7, H=3, K=8, seed=0):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(kq, (B, T, H, K)), jax.random.normal(kk, (B, S, H, K)), jax.random.normal(kv, (B, S, H, K)))


# layers.attend and layers.mix as compiled programs (eagerly, each op compiles on its own)
_attend = jax.jit(layers.attend, static_argnums=(4, 5))
_mix = jax.jit(layers.mix)


class AttendTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_implementations_agree_and_masked_keys_do_not_count(self):
    q, k, v = _qkv()
    mask_BxTxS = np.arange(7) < np.ones((2, 5, 1), int) * 4
    out = {  # the fast forms' XLA kernel against the reference's einsum
      impl: self.variant(lambda q, k, v, m, impl=impl: layers.attend(q, k, v, m, impl, "cpu"))(q, k, v, mask_BxTxS)
      for impl in ("einsum", "xla")
    }
    chex.assert_shape(out["einsum"], (2, 5, 3, 8))
    chex.assert_tree_all_finite(out)
    np.testing.assert_allclose(out["xla"], out["einsum"], atol=1e-5)
    # The masked keys carry no weight: changing their values changes nothing.
    k, v = np.array(k), np.array(v)
    k[:, 4:], v[:, 4:] = 9.0, -9.0
    changed = _attend(q, k, v, mask_BxTxS, "einsum")
    np.testing.assert_allclose(changed, out["einsum"], atol=1e-6)


@pytest.mark.parametrize("implementation", ["einsum", "xla"])
def test_no_mask_means_causal(implementation):
  """mask None (what a GPT passes when nothing but causality masks) = the causal mask, for every
  implementation (the fused ones take it as is_causal and skip the masked half)."""
  q, k, v = _qkv(T=7, S=7)
  causal = np.tril(np.ones((1, 7, 7), bool))
  np.testing.assert_array_equal(layers.causal_mask(7), causal)
  explicit = _attend(q, k, v, causal, "einsum")
  for forms in ("reference", "cpu", "accelerator"):
    np.testing.assert_allclose(_attend(q, k, v, None, implementation, forms), explicit, atol=1e-5)
  scores_BxHxTxS = np.einsum("bthk,bshk->bhts", q, k)
  np.testing.assert_allclose(_mix(scores_BxHxTxS, v, None), _mix(scores_BxHxTxS, v, causal))


def test_cache_positions_count_real_tokens_only():
  """Left-padded prompts in decode mode: padding takes no position and no query sees it."""
  module = layers.CachePositions()
  valid_BxT = np.array([[False, False, True, True], [True, True, True, True]])
  variables = jax.jit(module.init)(jax.random.key(0), np.ones((2, 6), bool))  # a cache of 6 slots
  (positions_BxT, mask_BxTxS, slots_BxS), variables = compiled_apply(module, variables, valid_BxT, mutable=["cache"])
  np.testing.assert_array_equal(positions_BxT, [[0, 0, 0, 1], [0, 1, 2, 3]])
  chex.assert_shape(mask_BxTxS, (2, 4, 6))
  np.testing.assert_array_equal(mask_BxTxS[0, 3], [False, False, True, True, False, False])
  np.testing.assert_array_equal(slots_BxS[:, :4], positions_BxT)  # each slot keeps its token's position
  # The next token: position = real tokens so far, and it sees every real slot and itself.
  (positions_BxT, mask_BxTxS, slots_BxS), _ = compiled_apply(
    module, variables, np.ones((2, 1), bool), mutable=["cache"]
  )
  np.testing.assert_array_equal(positions_BxT, [[2], [4]])
  np.testing.assert_array_equal(mask_BxTxS[0, 0], [False, False, True, True, True, False])
  np.testing.assert_array_equal(slots_BxS[:, 4], [2, 4])


def test_projection_keeps_its_kernel_shape_and_axis_names():
  proj = layers.Projection((3, 4), ("embed", "heads", "kv"))
  boxed = jax.eval_shape(proj.init, jax.random.key(0), jnp.ones((2, 5)))["params"]
  assert boxed["kernel"].names == ("embed", "heads", "kv")
  chex.assert_shape(nn.unbox(boxed)["kernel"], (5, 3, 4))
  chex.assert_shape(jax.eval_shape(proj.apply, {"params": nn.unbox(boxed)}, jnp.ones((2, 5))), (2, 3, 4))


# --- Synthesizer attention (Tay et al. 2020), through the models that use it -----------------

SYNTHESIZERS = ("synthesizer_dense", "synthesizer_random", "synthesizer_fixed_random")


def test_the_mlp_saves_its_activations_input_and_output_not_the_tanh(capsys):
  """The GELU's backward pass recomputes it from its input (layers.MLP); autodiff alone would also
  save the tanh GELU's tanh, a third B x T x F tensor."""
  from jax.ad_checkpoint import print_saved_residuals

  mlp, x_BxTxD = layers.MLP(layers.BlockConfig(d_model=8, num_heads=2, d_mlp=32)), jnp.ones((2, 3, 8))
  params = jax.eval_shape(mlp.init, jax.random.key(0), x_BxTxD)  # tracing needs the shapes only
  print_saved_residuals(lambda p, x: mlp.apply(p, x).sum(), params, x_BxTxD)
  saved_BxTxF = [line for line in capsys.readouterr().out.splitlines() if line.startswith("f32[2,3,32]")]
  assert len(saved_BxTxF) == 2 and not any("tanh" in line for line in saved_BxTxF), saved_BxTxF


def _synthesizer_config(mechanism, **changes):
  from transformer.models.gpt import GPTConfig

  return (
    GPTConfig()
    .replace(vocab_size=50, max_len=16, num_layers=2, num_heads=2, d_model=32, attention_mechanism=mechanism, **changes)
    .check()
  )


def _gpt(mechanism, **changes):
  from transformer.models.gpt import GPT

  cfg = _synthesizer_config(mechanism, **changes)
  params = compiled_init(GPT(cfg), np.zeros((1, 8), np.int32))
  # Scale the synthesized scores up so that attention is far from uniform (a real test of masking).
  params = jax.tree_util.tree_map_with_path(
    lambda path, x: x * 8 if "synth" in jax.tree_util.keystr(path) else x, params
  )
  return cfg, GPT(cfg), params


@pytest.mark.parametrize("mechanism", SYNTHESIZERS)
def test_synthesizer_parameters_shapes_and_axis_names(mechanism):
  from transformer.models.gpt import count_params, param_shapes

  cfg = _synthesizer_config(mechanism)
  D, H, L = cfg.block.d_model, cfg.block.num_heads, cfg.max_len
  attn = nn.unbox(param_shapes(cfg))["h"]["layer_0"]["attn"]  # shapes: nothing computed
  if mechanism == "synthesizer_dense":  # A (D x D/H per head) + b1, B (D/H x L per head) + b2
    assert set(attn) == {"v", "synth_hidden", "synth_kernel", "synth_bias", "out"}
    chex.assert_shape(
      [attn["synth_hidden"]["kernel"], attn["synth_kernel"], attn["synth_bias"]],
      [(D, H, D // H), (H, D // H, L), (H, L)],
    )
    extra = D * D + D + D * L + H * L
  else:
    assert set(attn) == {"v", "synth_table", "out"}
    chex.assert_shape(attn["synth_table"], (H, L, L))
    extra = H * L * L
  # Against dot-product attention: no query and key projections (2 D x D + 2 D), the synthesizer's own.
  per_layer = extra - (2 * D * D + 2 * D)
  assert count_params(cfg) == count_params(cfg.replace(attention_mechanism="dot_product")) + cfg.num_layers * per_layer
  boxed = param_shapes(cfg)["h"]["layer_0"]["attn"]
  names = {k: v.names for k, v in flax.traverse_util.flatten_dict(boxed, sep="/").items()}
  assert all("heads" in n for k, n in names.items() if "synth" in k)  # split over the tensor axis with the heads


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", SYNTHESIZERS)
def test_synthesizer_is_causal_padding_invariant_and_cached_decoding_equals_the_full_forward(mechanism):
  cfg, model, params = _gpt(mechanism)
  tokens_1xT = np.random.default_rng(1).integers(0, 50, (1, 10), np.int32)
  logits = np.asarray(compiled_apply(model, {"params": params}, tokens_1xT))
  changed_1xT = tokens_1xT.copy()
  changed_1xT[:, 6:] = 3
  changed = np.asarray(compiled_apply(model, {"params": params}, changed_1xT))
  np.testing.assert_allclose(changed[:, :6], logits[:, :6], atol=1e-5)  # causal
  assert np.abs(changed[:, 6:] - logits[:, 6:]).max() > 1e-3
  # Left padding takes no position and no attention: the real tokens' logits do not change.
  padded = np.concatenate([np.full((1, 3), 7, np.int32), tokens_1xT], axis=1)
  valid = np.arange(13)[None] >= 3
  np.testing.assert_allclose(
    np.asarray(compiled_apply(model, {"params": params}, padded, valid_BxT=valid))[:, 3:], logits, atol=1e-5
  )
  # Cached decoding (a padded prompt, then one token at a time) equals the full forward.
  init = jax.jit(lambda t, v: model.init(jax.random.key(0), t, valid_BxT=v, decode=True))
  cache = init(padded, valid)["cache"]  # sizes a 13-slot cache
  step_logits = []
  for t in range(13):
    out, mutated = compiled_apply(
      model,
      {"params": params, "cache": cache},
      padded[:, t : t + 1],
      valid_BxT=valid[:, t : t + 1],
      decode=True,
      mutable=["cache"],
    )
    cache = mutated["cache"]
    step_logits.append(np.asarray(out[:, 0]))
  np.testing.assert_allclose(np.stack(step_logits, 1)[:, 3:], logits, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", SYNTHESIZERS)
def test_synthesizer_gradients_are_finite_and_fixed_random_gets_none(mechanism):
  cfg, model, params = _gpt(mechanism, scan_layers=True, remat_policy="full")
  params = compiled_init(model, np.zeros((1, 8), np.int32))
  tokens = np.random.default_rng(1).integers(0, 50, (2, 12), np.int32)
  loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(
    model.apply({"params": p}, tokens[:, :-1]), tokens[:, 1:]
  ).mean()
  grads = jax.tree.map(np.asarray, jax.jit(jax.grad(loss))(params))  # one program
  assert all(bool(np.isfinite(g).all()) for g in jax.tree.leaves(grads))
  attn = grads["h"]["layers"]["attn"]
  if mechanism == "synthesizer_fixed_random":
    assert not np.any(attn["synth_table"])
  else:
    assert all(np.abs(np.asarray(g)).max() > 0 for g in jax.tree.leaves(attn))


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["synthesizer_dense", "synthesizer_random"])
def test_synthesizer_in_the_encoder_decoder(mechanism):
  from transformer.models.seq2seq import Seq2SeqConfig, Transformer

  cfg = (
    Seq2SeqConfig()
    .replace(vocab_size=40, max_len=12, num_layers=1, num_heads=2, d_model=16, d_mlp=32, attention_mechanism=mechanism)
    .check()
  )
  model = Transformer(cfg)
  src = np.random.default_rng(1).integers(1, 40, (2, 6), np.int32)
  tgt = np.random.default_rng(2).integers(1, 40, (2, 5), np.int32)
  valid = np.array([[True] * 4 + [False] * 2, [True] * 6])
  params = compiled_init(model, src, tgt, source_valid_BxS=valid)
  assert "synth_hidden" in params["encoder"]["layer_0"]["attn"] or "synth_table" in params["encoder"]["layer_0"]["attn"]
  assert set(params["decoder"]["layer_0"]["cross_attn"]) == {"q", "kv", "out"}  # cross-attention: dot-product
  full = np.asarray(compiled_apply(model, {"params": params}, src, tgt, source_valid_BxS=valid))
  alone = compiled_apply(model, {"params": params}, src[:1, :4], tgt[:1])[0]
  np.testing.assert_allclose(full[0], alone, atol=1e-5)
  changed_tgt = tgt.copy()
  changed_tgt[:, 3] = 9
  changed = compiled_apply(model, {"params": params}, src, changed_tgt, source_valid_BxS=valid)
  np.testing.assert_allclose(changed[:, :3], full[:, :3], atol=1e-5)  # the decoder is causal
  # The decoder through its cache, one token at a time, equals the full forward.
  from transformer.generation import beam_search

  cache = beam_search.init_cache(model, 2, 6, 5)
  encoded = compiled_apply(model, {"params": params}, src, source_valid_BxS=valid, method="encode")
  steps = []
  decode_step = jax.jit(beam_search.decode_step, static_argnums=0)  # one program a step kind, not op by op
  for t in range(5):
    logits, cache = decode_step(model, params, cache, encoded if t == 0 else None, tgt[:, t], valid)
    steps.append(np.asarray(logits))
  np.testing.assert_allclose(np.stack(steps, 1), full, atol=1e-4)


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_the_norm_is_flaxs_to_the_bit_and_records_its_scale_when_read(kind):
  """layers.Norm computes as Flax's LayerNorm / RMSNorm (the same numbers; a run that reads nothing
  compiles as it did), and a read run records TransformerLens's `scale` and `normalized`."""
  cfg = layers.BlockConfig(d_model=16, num_heads=2, norm=kind)
  rng = np.random.default_rng(0)
  x = (rng.standard_normal((2, 3, 16)) * 3 + 1).astype(np.float32)
  params = jax.eval_shape(layers.norm(cfg).init, jax.random.key(1), x)  # the shapes, then values of our own
  params = jax.tree.map(lambda p: 1 + rng.standard_normal(p.shape).astype(np.float32), params)
  flax_norm = nn.RMSNorm(epsilon=cfg.layer_norm_epsilon) if kind == "rms_norm" else nn.LayerNorm(epsilon=1e-5)
  flax_y = compiled_apply(flax_norm, params, x)
  np.testing.assert_array_equal(compiled_apply(layers.norm(cfg), params, x), flax_y)
  y, state = compiled_apply(layers.norm(cfg), params, x, mutable=["activations"])
  scale, normalized = state["activations"]["scale"], state["activations"]["normalized"]
  assert scale.shape == (2, 3, 1)
  np.testing.assert_allclose(
    normalized * scale + (0 if kind == "rms_norm" else x.mean(-1, keepdims=True)), x, atol=1e-5
  )
  np.testing.assert_allclose(y, flax_y, atol=1e-6)
