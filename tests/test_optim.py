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


def _opt(**kw) -> OptimizerConfig:
  return dataclasses.replace(OptimizerConfig(), **kw)


def test_schedule_warmup_then_cosine():
  lr = optim.learning_rate(_opt(lr=1.0, warmup_steps=10, min_lr_ratio=0.1), num_train_steps=110)
  assert float(lr(0)) == 0.0 and np.isclose(float(lr(5)), 0.5) and np.isclose(float(lr(10)), 1.0)
  assert np.isclose(float(lr(60)), 0.55, atol=1e-3) and np.isclose(float(lr(110)), 0.1, atol=1e-6)
  inv = optim.learning_rate(_opt(lr=1.0, warmup_steps=100, schedule="inverse_sqrt"), 1000)
  assert np.isclose(float(inv(99)), 1.0) and np.isclose(float(inv(399)), 0.5)
  with pytest.raises(ConfigError, match="--config.optimizer.schedule='linear' is unknown"):
    optim.learning_rate(_opt(schedule="linear"), 10)


@pytest.mark.slow
def test_weight_decay_mask():
  params = nn.unbox(
    GPT(GPTConfig().replace(vocab_size=11, max_len=8, num_layers=1, num_heads=1, d_model=8)).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32)
    )["params"]
  )
  mask = optim.decay_mask(params, _opt())
  assert mask["h"]["layer_0"]["attn"]["qkv"]["kernel"] and mask["h"]["layer_0"]["mlp"]["fc"]["kernel"]
  assert not mask["h"]["layer_0"]["attn"]["qkv"]["bias"] and not mask["h"]["layer_0"]["ln_1"]["scale"]
  assert not mask["wte"]["embedding"] and not mask["wpe"] and not mask["ln_f"]["bias"]
  assert optim.decay_mask(params, _opt(decay_embeddings=True))["wte"]["embedding"]
  # And decay really is masked: with zero gradients only decayed leaves move.
  tx = optim.make_optimizer(_opt(lr=0.1, warmup_steps=0, schedule="constant", weight_decay=0.5), 10)
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  assert np.any(updates["h"]["layer_0"]["mlp"]["fc"]["kernel"] != 0)
  assert np.all(updates["wte"]["embedding"] == 0) and np.all(updates["ln_f"]["scale"] == 0)
