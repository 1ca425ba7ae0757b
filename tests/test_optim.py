"""The optimizer (transformer.optim): schedules and the weight-decay mask."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import optim
from transformer.config import OptimizerConfig
from transformer.errors import ConfigError
from transformer.models.gpt import GPT, GPTConfig

from conftest import compiled_init


def _opt(**kw) -> OptimizerConfig:
  return dataclasses.replace(OptimizerConfig(), **kw)


def test_schedule_warmup_then_cosine():
  lr = optim.learning_rate(_opt(lr=1.0, warmup_steps=10, min_lr_ratio=0.1), num_train_steps=110)
  assert float(lr(0)) == 0.0 and np.isclose(float(lr(5)), 0.5) and np.isclose(float(lr(10)), 1.0)
  assert np.isclose(float(lr(60)), 0.55, atol=1e-3) and np.isclose(float(lr(110)), 0.1, atol=1e-6)
  inv = optim.learning_rate(_opt(lr=1.0, warmup_steps=100, schedule="inverse_sqrt"), 1000)
  assert np.isclose(float(inv(99)), 1.0) and np.isclose(float(inv(399)), 0.5)
  with pytest.raises(ConfigError, match="--config.optimizer.schedule='step' is unknown"):
    optim.learning_rate(_opt(schedule="step"), 10)


def test_linear_decay_and_warmup_stable_decay_reach_their_floor_at_the_last_step():
  linear = optim.learning_rate(_opt(lr=1.0, warmup_steps=10, schedule="linear", min_lr_ratio=0.0), 110)
  assert np.isclose(float(linear(10)), 1.0) and np.isclose(float(linear(60)), 0.5) and float(linear(110)) == 0.0
  # WSD: warmup 10, stable to step 88, then linear to 0 over the last 20% of the steps (22).
  wsd = optim.learning_rate(_opt(lr=1.0, warmup_steps=10, schedule="wsd", decay_fraction=0.2, min_lr_ratio=0.0), 110)
  assert [float(wsd(s)) for s in (5, 10, 50, 88)] == [0.5, 1.0, 1.0, 1.0]
  assert np.isclose(float(wsd(99)), 0.5) and float(wsd(110)) == 0.0
  with pytest.raises(ConfigError, match="decay_fraction must be in"):
    optim.learning_rate(_opt(schedule="wsd", decay_fraction=0.0), 10)


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
  cfg = GPTConfig().replace(vocab_size=11, max_len=8, num_layers=2, num_heads=2, d_model=8, tie_embeddings=False)
  for scan in (False, True):
    model = GPT(cfg.replace(scan_layers=scan, activation="swiglu"))
    # The parameters' shapes and axis names, traced without compiling anything.
    boxed = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    names = jax.tree.map(lambda x: x.names, boxed["params"], is_leaf=lambda x: isinstance(x, nn.Partitioned))
    dims = jax.tree.map(optim.muon_dimensions, names, is_leaf=lambda x: isinstance(x, tuple))
    block = dims["h"]["layers"] if scan else dims["h"]["layer_0"]
    shift = int(scan)  # a scanned stack's leading layers axis is a batch of matrices
    assert block["attn"]["qkv"]["kernel"] == (shift, (2 + shift, 3 + shift))  # embed -> heads x kv; q/k/v apart
    assert block["attn"]["out"]["kernel"] == ((shift, 1 + shift), 2 + shift)  # heads x kv -> embed
    assert block["mlp"]["fc"]["kernel"] == block["mlp"]["gate"]["kernel"] == (shift, 1 + shift)
    assert block["mlp"]["proj"]["kernel"] == (shift, 1 + shift)
    for adamw in (dims["wte"]["embedding"], dims["wpe"], dims["lm_head"]["kernel"], block["ln_1"]["scale"]):
      assert adamw is None
    assert block["attn"]["qkv"]["bias"] is None and block["mlp"]["fc"]["bias"] is None
  # A step moves every parameter; the matrices' updates are orthogonalised (equal singular values).
  tx = optim.make_optimizer(
    _opt(name="muon", lr=0.1, muon_lr=0.1, warmup_steps=0, schedule="constant"), 10, None, names
  )

  @jax.jit  # init, random gradients and the update in one program (not op by op)
  def first_update():
    params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
    grads = jax.tree.map(lambda x: jax.random.normal(jax.random.key(1), x.shape), params)
    return tx.update(grads, tx.init(params), params)[0]

  updates = first_update()
  assert all(np.any(np.asarray(u) != 0) for u in jax.tree.leaves(updates))
  singular = np.linalg.svd(np.asarray(updates["h"]["layers"]["mlp"]["fc"]["kernel"][0]), compute_uv=False)
  assert singular.max() / singular.min() < 2.0, singular  # Newton-Schulz: roughly orthogonal
  with pytest.raises(ConfigError, match="optimizer.name='lion' is unknown; choose one of adamw, muon"):
    optim.make_optimizer(_opt(name="lion"), 10)


@pytest.mark.slow
def test_weight_decay_mask():
  params = compiled_init(
    GPT(GPTConfig().replace(vocab_size=11, max_len=8, num_layers=1, num_heads=1, d_model=8)), np.zeros((1, 4), np.int32)
  )
  mask = optim.decay_mask(params, _opt())
  assert mask["h"]["layer_0"]["attn"]["qkv"]["kernel"] and mask["h"]["layer_0"]["mlp"]["fc"]["kernel"]
  assert not mask["h"]["layer_0"]["attn"]["qkv"]["bias"] and not mask["h"]["layer_0"]["ln_1"]["scale"]
  assert not mask["wte"]["embedding"] and not mask["wpe"] and not mask["ln_f"]["bias"]
  assert optim.decay_mask(params, _opt(decay_embeddings=True))["wte"]["embedding"]
  # And decay really is masked: with zero gradients only decayed leaves move.
  tx = optim.make_optimizer(_opt(lr=0.1, warmup_steps=0, schedule="constant", weight_decay=0.5), 10)
  first_update = jax.jit(lambda p: tx.update(jax.tree.map(jnp.zeros_like, p), tx.init(p), p)[0])  # one program
  updates = jax.tree.map(np.asarray, first_update(params))
  assert np.any(updates["h"]["layer_0"]["mlp"]["fc"]["kernel"] != 0)
  assert np.all(updates["wte"]["embedding"] == 0) and np.all(updates["ln_f"]["scale"] == 0)
