"""Sparse autoencoders (transformer.models.sae): each activation does what its paper says, and a short
training recovers a planted dictionary of features in superposition."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer import layers
from transformer.data.superposition import Superposition
from transformer.errors import ConfigError
from transformer.models.clt import CLTConfig, CrossLayerTranscoder, clt_loss
from transformer.models.sae import (
  SAE,
  SAEConfig,
  calibrate,
  init_decoder_bias,
  latent_density,
  norm_scale,
  recovery,
  sae_loss,
  scores,
  threshold_from_data,
)

from conftest import compiled_apply, compiled_init


def _sae(activation: str, **changes):
  sae = SAE(SAEConfig(d_in=16, d_sae=64, activation=activation, k=4, **changes).check())
  return sae, compiled_init(sae, np.zeros((2, 16), np.float32))


# The tests' SAE programs compiled once per SAE config and shapes (conftest's, and the loss); the tests'
# own arithmetic is NumPy's.
_apply = lambda sae, params, x, train=False: compiled_apply(sae, {"params": params}, x, train)
_decoder = lambda sae, params: compiled_apply(sae, {"params": params}, method=SAE.decoder)
_loss = jax.jit(sae_loss, static_argnums=0, static_argnames="dead_tokens")
X = np.asarray(jax.random.normal(jax.random.key(1), (32, 16)))


@functools.partial(jax.jit, static_argnums=0, static_argnames="dead_tokens")
def _grad(sae, params, x, dead_tokens=None):
  """The SAE loss's gradient, one compiled program (eagerly, every op would compile on its own)."""
  return jax.grad(lambda p: sae_loss(sae, p, x, dead_tokens=dead_tokens)[0])(params)


def _adam(sae, params, lr: float, steps: int):
  """`steps` of Adam at `lr` on the SAE loss of X, as one compiled program."""
  tx = optax.adam(lr)

  def step(_, carry):
    params, state = carry
    updates, state = tx.update(_grad(sae, params, X), state, params)
    return optax.apply_updates(params, updates), state

  return jax.jit(lambda params: jax.lax.fori_loop(0, steps, step, (params, tx.init(params)))[0])(params)


def test_topk_keeps_exactly_k_latents_a_row():
  sae, params = _sae("topk")
  params = {**params, "b_enc": np.asarray(params["b_enc"]) + 10.0}  # every pre-activation positive
  _, z = _apply(sae, params, X)
  np.testing.assert_array_equal(np.sum(np.asarray(z) > 0, -1), 4)


def test_batchtopk_keeps_k_times_the_batch_and_its_threshold_does_the_same_at_inference():
  sae, params = _sae("batchtopk")
  params = {**params, "b_enc": np.asarray(params["b_enc"]) + 10.0}
  _, z = _apply(sae, params, X, True)
  assert int(np.sum(np.asarray(z) > 0)) == 4 * 32
  assert len(set(np.sum(np.asarray(z) > 0, -1).tolist())) > 1  # k a row on average, not each row
  calibrated = calibrate(sae, params, X)
  _, z_inference = _apply(sae, calibrated, X)
  np.testing.assert_array_equal(np.asarray(z_inference) > 0, np.asarray(z) > 0)
  # Training keeps the same threshold as statistics, a moving average from the first batch's.
  _, _, stats = _loss(sae, params, X)
  np.testing.assert_allclose(stats["threshold"], calibrated["threshold"])
  _, _, again = _loss(sae, {**params, **stats}, X * 2)
  smallest_kept_on_2x = calibrate(sae, params, X * 2)["threshold"]
  np.testing.assert_allclose(again["threshold"], 0.99 * stats["threshold"] + 0.01 * smallest_kept_on_2x, rtol=1e-5)


def test_since_fired_counts_the_tokens_since_each_latent_last_fired():
  sae, params = _sae("topk")
  _, z = _apply(sae, params, X)
  params = {**params, "since_fired": np.full((64,), 100.0, np.float32)}
  _, _, stats = _loss(sae, params, X)
  np.testing.assert_array_equal(stats["since_fired"], np.where(np.asarray(z > 0).any(0), 0.0, 132.0))


def test_jumprelus_threshold_gets_a_gradient_through_its_estimator():
  sae, params = _sae("jumprelu", bandwidth=2.0, initial_threshold=0.5)
  grads = _grad(sae, params, X)
  assert float(np.abs(grads["threshold"]).sum()) > 0
  _, z = _apply(sae, params, X)
  pre = _pre_activations(params)
  np.testing.assert_array_equal(np.asarray(z) > 0, np.asarray(pre) > 0.5)


def test_jumprelus_threshold_is_learned_as_itself_and_never_below_zero():
  # Adam moves a parameter about lr a step: θ itself, not log θ (which from 0.01 would move θ by
  # about 0.01·lr a step), so the L0 penalty can lift it to the pre-activations' scale.
  sae, params = _sae("jumprelu", bandwidth=10.0, initial_threshold=0.01, l0_coefficient=100.0)
  params = _adam(sae, params, lr=0.01, steps=20)
  assert float(np.min(params["threshold"])) > 0.15
  # A raw θ below zero acts as 0 and still receives the estimator's gradient.
  params = {**params, "threshold": np.full((64,), -1.0, np.float32)}
  pre = _pre_activations(params)
  _, z = _apply(sae, params, X)
  np.testing.assert_array_equal(np.asarray(z) > 0, np.asarray(pre) > 0)
  assert float(np.abs(_grad(sae, params, X)["threshold"]).sum()) > 0


def _pre_activations(params):
  p = {name: np.asarray(value) for name, value in params.items()}
  return (X - p["b_dec"]) @ p["W_enc"] + p["b_enc"]


@pytest.mark.parametrize("activation", ["topk", "batchtopk", "jumprelu"])
def test_decoder_rows_are_unit_vectors_after_a_step(activation):
  sae, params = _sae(activation)
  params = _adam(sae, params, lr=0.1, steps=1)
  decoder = _decoder(sae, params)
  np.testing.assert_allclose(np.linalg.norm(np.asarray(decoder), axis=1), 1.0, atol=1e-5)


def test_relu_weighs_its_l1_penalty_by_the_decoder_norms():
  sae, params = _sae("relu", l1_coefficient=1.0)
  doubled = {**params, "W_dec": np.asarray(params["W_dec"]) * 2}
  _, plain, _ = _loss(sae, params, X)
  _, scaled, _ = _loss(sae, doubled, X)
  np.testing.assert_allclose(scaled["l1"], 2 * plain["l1"], rtol=1e-5)


def test_auxk_gives_dead_latents_a_gradient():
  sae, params = _sae("topk")
  dead = np.arange(64) >= 32
  params = {**params, "since_fired": np.where(dead, 1000.0, 0.0).astype(np.float32)}  # half silent 1000 tokens
  with_aux = _grad(sae, params, X, dead_tokens=1000)
  without = _grad(sae, params, X)
  _, z = _apply(sae, params, X)
  never_fired = np.flatnonzero((np.asarray(z) == 0).all(0) & np.asarray(dead))
  assert len(never_fired) > 0
  assert np.abs(np.asarray(without["W_enc"])[:, never_fired]).sum() == 0
  assert np.abs(np.asarray(with_aux["W_enc"])[:, never_fired]).sum() > 0


@pytest.mark.parametrize("dead_tokens", [None, 1000])
def test_topks_cpu_form_equals_the_reference_and_takes_no_dense_encoder_gradient(dead_tokens):
  """kernels.sae_top_k: the loss, its parts, the statistics and every gradient equal the reference's
  (AuxK's too, half the latents dead), and the encoder's gradient is no longer the product of the
  inputs with an N x S matrix (the reference's jaxpr has one such D x S product, the CPU form's none
  outside AuxK's branch)."""
  (sae, params), (sae_cpu, _) = _sae("topk", kernels="reference"), _sae("topk", kernels="cpu")
  params = {**params, "b_dec": np.linspace(-0.5, 0.5, 16, dtype=np.float32), "input_scale": np.float32(1.5)}
  params["since_fired"] = np.where(np.arange(64) >= 32, 1000.0, 0.0).astype(np.float32)
  want, want_parts, want_stats = _loss(sae, params, X, dead_tokens=dead_tokens)
  got, got_parts, got_stats = _loss(sae_cpu, params, X, dead_tokens=dead_tokens)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  chex.assert_trees_all_close((got_parts, got_stats), (want_parts, want_stats), rtol=1e-6)
  want_grads = _grad(sae, params, X, dead_tokens=dead_tokens)
  got_grads = _grad(sae_cpu, params, X, dead_tokens=dead_tokens)
  chex.assert_trees_all_close(got_grads, want_grads, rtol=1e-5, atol=1e-6)

  def encoder_gradient_products(sae):
    jaxpr = jax.make_jaxpr(jax.grad(lambda p: sae_loss(sae, p, X)[0]))(params)
    return sum(
      e.primitive.name == "dot_general" and e.outvars[0].aval.shape in ((16, 64), (64, 16)) for e in jaxpr.eqns
    )

  assert encoder_gradient_products(sae) == 1 and encoder_gradient_products(sae_cpu) == 0


def _train_on_planted(cfg: SAEConfig, source: Superposition, *, scale_inputs: bool, steps: int = 600):
  """Adam 1e-2 on 256 rows a step of `source` (scaled as the sae task scales them, b_dec at their
  geometric median, where `scale_inputs`); the trained SAE and its params."""
  sae = SAE(cfg)
  params = compiled_init(sae, np.zeros((2, cfg.d_in), np.float32))
  if scale_inputs:
    rows = source.batch(99_999, 2048)
    params["input_scale"] = jnp.asarray(norm_scale(rows), jnp.float32)
    params = init_decoder_bias(params, rows * norm_scale(rows), "geometric_median")
    if cfg.activation == "jumprelu" and cfg.initial_density:  # θ₀ from the rows, as the task sets it
      params = threshold_from_data(sae, params, rows, cfg.initial_density)
  tx = optax.adam(1e-2)
  state = tx.init(params)
  fixed = {"input_scale": 0.0, "since_fired": 0.0}  # set, not learned (the task freezes them so)

  @jax.jit
  def step(params, state, x):
    grads = jax.grad(lambda p: sae_loss(sae, p, x)[0])(params)
    grads = {name: grad * fixed.get(name, 1.0) for name, grad in grads.items()}
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for i in range(steps):
    params, state = step(params, state, jnp.asarray(source.batch(i, 256)))
  return sae, params


def test_a_short_training_recovers_a_planted_dictionary():
  """512 rows x 24 features in 12 dimensions, each present 4% of the time: a TopK SAE of 48 latents
  finds the true directions (MCC >= 0.9) in a few hundred steps."""
  source = Superposition(num_features=24, d=12, density=0.04, seed=3)
  sae, params = _train_on_planted(
    SAEConfig(d_in=12, d_sae=48, activation="topk", k=3).check(), source, scale_inputs=False
  )
  decoder = _decoder(sae, params)
  found = recovery(np.asarray(decoder), source.directions_FxD)
  assert found["mcc"] >= 0.9 and found["recovered"] >= 0.9, found
  x = np.asarray(source.batch(10_000, 1024))
  x_hat, z = _apply(sae, params, x)
  s = scores(x, x_hat, z)
  assert s["l0"] <= 3 and s["explained_variance"] > 0.8, s


@pytest.mark.parametrize("initial", [dict(initial_density=1e-3), dict(initial_density=0.0, initial_threshold=0.5)])
def test_jumprelu_started_sparse_recovers_a_planted_dictionary(initial):
  """JumpReLU finds the planted features when it starts sparse, so that a latent learns from the few rows it
  fires on: each latent's θ₀ from the data (firing on 0.1% of the first rows: the default), or a fixed θ₀ 0.5,
  above the initial pre-activations' spread of ~0.1 on inputs scaled to a mean norm of √d_in. From SAELens's
  θ₀ 0.01 every latent fires on half the rows at first and a dense code forms instead (experiments/README.md's
  ground-truth table)."""
  source = Superposition(num_features=24, d=12, density=0.04, seed=3)
  cfg = SAEConfig(d_in=12, d_sae=48, activation="jumprelu", l0_coefficient=3.0, **initial).check()
  sae, params = _train_on_planted(cfg, source, scale_inputs=True)
  found = recovery(np.asarray(_decoder(sae, params)), source.directions_FxD)
  assert found["mcc"] >= 0.9 and found["recovered"] >= 0.9, found
  x = np.asarray(source.batch(10_000, 1024))
  x_hat, z = _apply(sae, params, x)
  s = scores(x, x_hat, z)
  assert s["l0"] <= 1.5 and s["explained_variance"] > 0.9, s  # ~1 feature a row (24 x 0.04)


def test_the_threshold_from_the_data_makes_each_latent_fire_on_that_share_of_the_rows():
  sae = SAE(SAEConfig(d_in=12, d_sae=32, activation="jumprelu").check())
  params = compiled_init(sae, np.zeros((2, 12), np.float32))
  rows = np.random.default_rng(0).normal(size=(4000, 12)).astype(np.float32)
  params = threshold_from_data(sae, params, rows, 0.01)
  _, z = _apply(sae, params, rows)
  np.testing.assert_allclose((np.asarray(z) > 0).mean(0), 0.01, atol=0.003)


def test_bad_configs_are_one_clear_error():
  with pytest.raises(ConfigError, match="activation='gelu' is not one of topk"):
    SAEConfig(d_in=4, activation="gelu").check()
  with pytest.raises(ConfigError, match="k=64 is more than the 32 latents"):
    SAEConfig(d_in=4, expansion=8, k=64).check()
  with pytest.raises(ValueError, match="0 < d < num_features"):
    Superposition(num_features=8, d=8)


def test_the_decoder_bias_starts_at_the_mean_or_the_geometric_median():
  sae, params = _sae("topk")
  x = np.concatenate([np.zeros((20, 16)), np.full((1, 16), 100.0)])  # one outlier
  np.testing.assert_allclose(init_decoder_bias(params, x)["b_dec"], 100 / 21, rtol=1e-5)
  assert float(np.abs(init_decoder_bias(params, x, "geometric_median")["b_dec"]).max()) < 0.1
  np.testing.assert_allclose(norm_scale(np.full((4, 16), 2.0)), 0.5, rtol=1e-6)  # mean norm 8 -> √16
  np.testing.assert_array_equal(latent_density(np.array([[0.0, 1.0], [0.0, 2.0]])), [0.0, 1.0])


# --- Transcoders: a dictionary from one point to another (d_out), with an optional skip path. ---


def test_a_relu_transcoder_holding_an_mlps_weights_is_that_mlp_and_the_skip_path_adds():
  """A ReLU MLP is a ReLU transcoder whose latents are its hidden units: encoder = the MLP's first
  projection, decoder = its second; a skip transcoder adds x W_skip to that."""
  block = layers.BlockConfig(d_model=16, num_heads=2, d_mlp=24, activation="relu")
  mlp = layers.MLP(block)
  mlp_params = compiled_init(mlp, np.zeros((1, 16), np.float32))
  x = np.asarray(jax.random.normal(jax.random.key(2), (5, 16)))
  want = np.asarray(compiled_apply(mlp, {"params": mlp_params}, x))
  for skip in (False, True):
    sae = SAE(SAEConfig(d_in=16, d_sae=24, d_out=16, activation="relu", skip=skip).check())
    params = dict(compiled_init(sae, np.zeros((2, 16), np.float32)))
    assert params["W_dec"].shape == (24, 16) and params["b_dec"].shape == (16,) and ("W_skip" in params) == skip
    params.update(W_enc=mlp_params["fc"]["kernel"], b_enc=mlp_params["fc"]["bias"])
    params.update(W_dec=mlp_params["proj"]["kernel"], b_dec=mlp_params["proj"]["bias"])
    extra = np.zeros((5, 16), np.float32)
    if skip:
      params["W_skip"] = np.eye(16, dtype=np.float32) * 0.5
      extra = 0.5 * x
    y_hat, _ = _apply(sae, params, x)
    np.testing.assert_allclose(y_hat, want + extra, atol=1e-5)
    loss, parts, _ = _loss(sae, params, x, y_NxO=want + extra)
    assert float(parts["mse"]) < 1e-9  # its own output is its target


def test_a_transcoder_learns_another_points_values_and_its_widths_are_checked():
  """TopK with a different output width (d_out 8 from d_in 16): Adam fits y = tanh(x A) far below the
  variance; the loss refuses a missing target, the config a skip without d_out."""
  sae = SAE(SAEConfig(d_in=16, d_sae=64, d_out=8, activation="topk", k=8).check())
  params = compiled_init(sae, np.zeros((2, 16), np.float32))
  A = np.asarray(jax.random.normal(jax.random.key(3), (16, 8))) / 4
  y = np.tanh(X @ A)
  tx = optax.adam(1e-2)
  grad = jax.jit(jax.grad(lambda p: sae_loss(sae, p, X, y_NxO=y)[0]))

  def step(_, carry):
    p, state = carry
    updates, state = tx.update(grad(p), state, p)
    return optax.apply_updates(p, updates), state

  trained = jax.jit(lambda p: jax.lax.fori_loop(0, 300, step, (p, tx.init(p)))[0])(params)
  y_hat, z = _apply(sae, trained, X)
  assert y_hat.shape == (32, 8) and int((np.asarray(z) > 0).sum(-1).max()) <= 8
  assert np.mean((np.asarray(y_hat) - y) ** 2) < 0.1 * np.var(y)
  with pytest.raises(ValueError, match="a transcoder's loss needs its target y_NxO"):
    sae_loss(sae, params, X)
  with pytest.raises(ConfigError, match="skip is a transcoder's linear path from input to output: give d_out"):
    SAEConfig(d_in=16, skip=True).check()


def test_a_cross_layer_transcoders_decoders_reach_only_later_layers():
  """Layer l's latents write layers l, l + 1, ... and none before (W_dec_l: S x (L - l) x d_out); its loss
  is every layer's squared error; JumpReLU's θ learns a layer at a time."""
  cfg = CLTConfig(layers=3, d_in=6, d_out=5, d_sae=8, activation="jumprelu", initial_threshold=0.1).check()
  clt = CrossLayerTranscoder(cfg)
  params = compiled_init(clt, np.zeros((3, 2, 6), np.float32))
  assert [params[f"W_dec_{l}"].shape for l in range(3)] == [(8, 3, 5), (8, 2, 5), (8, 1, 5)]
  z = np.random.default_rng(0).random((3, 4, 8)).astype(np.float32)
  decode = lambda z: np.asarray(compiled_apply(clt, {"params": params}, z, method=CrossLayerTranscoder.decode))
  base = decode(z)
  for layer in range(3):
    moved = decode(np.where(np.arange(3)[:, None, None] == layer, 2 * z, z)) - base
    changed = np.abs(moved).max(axis=(1, 2)) > 1e-6
    np.testing.assert_array_equal(changed, np.arange(3) >= layer)
  x = np.random.default_rng(1).normal(size=(3, 16, 6)).astype(np.float32)
  y = np.random.default_rng(2).normal(size=(3, 16, 5)).astype(np.float32)
  grads = jax.jit(jax.grad(lambda p: clt_loss(clt, p, x, y)[0]))(params)
  assert grads["threshold"].shape == (3, 8) and all(np.abs(grads[f"W_dec_{l}"]).max() > 0 for l in range(3))
  with pytest.raises(ConfigError, match="a cross-layer transcoder is TopK, JumpReLU or ReLU \\+ L1, without a skip"):
    CLTConfig.of(SAEConfig(d_in=6, d_out=5, skip=True), layers=3)
