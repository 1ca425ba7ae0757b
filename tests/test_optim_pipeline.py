import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import base
from transformer import data, optim, tasks, train
from transformer.data import pipeline
from transformer.data.sources import DataError
from transformer.layers import ConfigError
from transformer.models.gpt import GPT, GPTConfig


def _opt(**kw):
  c = base.base_config().optimizer
  c.update(kw)
  return c


def test_schedule_warmup_then_cosine():
  lr = optim.learning_rate(_opt(lr=1.0, warmup_steps=10, min_lr_ratio=0.1), num_train_steps=110)
  assert float(lr(0)) == 0.0 and np.isclose(float(lr(5)), 0.5) and np.isclose(float(lr(10)), 1.0)
  assert np.isclose(float(lr(60)), 0.55, atol=1e-3) and np.isclose(float(lr(110)), 0.1, atol=1e-6)
  inv = optim.learning_rate(_opt(lr=1.0, warmup_steps=100, schedule="inverse_sqrt"), 1000)
  assert np.isclose(float(inv(99)), 1.0) and np.isclose(float(inv(399)), 0.5)
  with pytest.raises(ConfigError, match="unknown optimizer.schedule 'linear'"):
    optim.learning_rate(_opt(schedule="linear"), 10)


def test_weight_decay_mask():
  params = nn.unbox(GPT(GPTConfig(vocab_size=11, context_length=8, num_layers=1, num_heads=1, d_model=8)).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
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


def test_gradient_accumulation_equals_one_big_batch():
  cfg = GPTConfig(vocab_size=23, context_length=16, num_layers=1, num_heads=2, d_model=16)
  model = GPT(cfg)
  tx = optim.make_optimizer(_opt(lr=1e-2, warmup_steps=0, schedule="constant"), 10)
  params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"])
  state = train.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                           rng=jax.random.key_data(jax.random.key(1)))
  batch = jax.random.randint(jax.random.key(2), (8, 9), 0, 23)
  loss_fn = functools.partial(tasks.lm_loss, model)
  step = lambda accum: jax.jit(functools.partial(train.train_step, loss_fn=loss_fn, tx=tx, schedule=lambda s: 0.0,
                                                 accumulation_steps=accum))
  s1, m1 = step(1)(state, batch)
  s4, m4 = step(4)(state, batch)
  np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=1e-5)
  np.testing.assert_allclose(m4["grad_norm"], m1["grad_norm"], rtol=1e-4)
  np.testing.assert_allclose(s4.params["wte"]["embedding"], s1.params["wte"]["embedding"], atol=1e-6)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, shakespeare_dir):
  out = tmp_path_factory.mktemp("prep") / "sh"
  data.prepare(data.named_source("shakespeare"), out, data.PrepareOptions(tokenizer="char"), progress=False)
  return data.load_prepared(out)


@pytest.mark.parametrize("sampling", ["windows", "packed"])
def test_pipeline_is_deterministic_resumable_and_process_sharded(prepared, sampling):
  make = lambda **kw: pipeline.lm_train_dataset(prepared, seq_len=32, global_batch=8, seed=3, sampling=sampling, **kw)
  ds = make()
  it = iter(ds.to_iter_dataset())
  batches = [next(it) for _ in range(5)]
  assert batches[0].shape == (8, 33) and batches[0].dtype == np.int32
  np.testing.assert_array_equal(batches[1], make()[1])  # the same for a seed
  assert not np.array_equal(batches[1], pipeline.lm_train_dataset(prepared, seq_len=32, global_batch=8, seed=4,
                                                                  sampling=sampling)[1])
  # Resume from a saved position.
  it2 = iter(make().to_iter_dataset())
  next(it2)
  next(it2)
  state = it2.get_state()
  it3 = iter(make().to_iter_dataset())
  it3.set_state(state)
  np.testing.assert_array_equal(next(it3), batches[2])
  # Two processes each read their half of every global batch.
  halves = [make(process_index=p, process_count=2)[3] for p in range(2)]
  np.testing.assert_array_equal(np.concatenate(halves), batches[3])
  # Examples are real windows of the split: consecutive tokens.
  tokens = np.asarray(prepared.tokens("train"))
  row = batches[4][0]
  starts = np.flatnonzero(tokens[: len(tokens) - 32] == row[0])
  assert any(np.array_equal(tokens[s:s + 33], row) for s in starts)


def test_packed_covers_every_chunk_once_per_epoch(prepared):
  L = 4096
  tokens = np.asarray(prepared.tokens("train"), dtype=np.int32)
  n_chunks = (len(tokens) - 1) // L
  chunk_of = {tokens[c * L:c * L + L + 1].tobytes(): c for c in range(n_chunks)}
  ds = pipeline.lm_train_dataset(prepared, seq_len=L, global_batch=1, seed=0, sampling="packed")
  first_epoch = [chunk_of[ds[i][0].tobytes()] for i in range(n_chunks)]
  assert sorted(first_epoch) == list(range(n_chunks)) and first_epoch != sorted(first_epoch)
  second_epoch = [chunk_of[ds[n_chunks + i][0].tobytes()] for i in range(n_chunks)]
  assert sorted(second_epoch) == list(range(n_chunks))


def test_pipeline_errors(prepared):
  with pytest.raises(DataError, match="unknown data.sampling 'random'"):
    pipeline.lm_train_dataset(prepared, seq_len=8, global_batch=2, seed=0, sampling="random")
  with pytest.raises(DataError, match="fewer than one example of seq_len\\+1"):
    pipeline.lm_train_dataset(prepared, seq_len=10**9, global_batch=2, seed=0)
  eval_batches = pipeline.lm_eval_batches(prepared, seq_len=16, batch_size=4, num_batches=3)
  assert eval_batches.shape == (3, 4, 17)
  np.testing.assert_array_equal(eval_batches, pipeline.lm_eval_batches(prepared, seq_len=16, batch_size=4, num_batches=3))
