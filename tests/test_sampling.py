"""The KV-cache sampler (transformer.generation.sampling): exactness against full re-forward, padding
independence, the sampling distribution, top-k/top-p, stopping, errors, shardings."""

import json
import os
import subprocess
import sys
import threading

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO
from transformer.errors import ConfigError
from transformer.generation import sampling as sampler
from transformer.generation.sampling import Sampling
from transformer.models.gpt import GPT, STREAMED_HEAD_BYTES, GPTConfig, streamed_head

CFG = GPTConfig(vocab_size=96, context_length=48, num_layers=2, num_heads=4, d_model=32, tie_embeddings=False)
PROMPTS = [[5, 17, 3, 80, 41, 2, 9], [60], list(range(10, 31)), [33, 34]]


def _params(cfg=CFG, scale=10.0, seed=0):
  """Random weights, scaled up so that the next-token distributions are far from uniform and
  greedy paths are varied (at init scale every logit is ~0 and decoding just repeats)."""
  params = nn.unbox(GPT(cfg).init(jax.random.key(seed), jnp.zeros((1, 8), jnp.int32))["params"])
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x if "ln" in jax.tree_util.keystr(path) else x * scale, params)


@pytest.fixture(scope="module")
def params():
  return _params()


def _greedy_by_full_forward(cfg, params, prompt, n):
  """The reference: re-run the whole sequence for every new token, no cache. (Into a buffer of
  context_length, one compile: causality makes the zeros after the sequence irrelevant.)"""
  forward = jax.jit(lambda buffer_1xC, last: GPT(cfg).apply({"params": params}, buffer_1xC)[0, last])
  tokens = list(prompt)
  for _ in range(n):
    buffer_1xC = np.zeros((1, cfg.context_length), np.int32)
    buffer_1xC[0, :len(tokens)] = tokens
    tokens.append(int(jnp.argmax(forward(buffer_1xC, len(tokens) - 1))))
  return tokens[len(prompt):]


@pytest.mark.parametrize("changes", [{}, {"attention": "einsum"}, {"scan_layers": True}])
def test_greedy_with_cache_equals_full_reforward(changes, params):
  cfg = CFG.replace(**changes)
  if cfg.scan_layers:
    from transformer.layers import stack_layers
    params = {**params, "h": stack_layers(params["h"], cfg.num_layers)}
  got = sampler.generate(GPT(cfg), params, PROMPTS, max_new_tokens=20, sampling=Sampling(temperature=0))
  want = [_greedy_by_full_forward(cfg, params, p, 20) for p in PROMPTS]
  assert got == want
  assert len({tuple(g) for g in got}) == len(PROMPTS) and all(len(set(g)) > 3 for g in got)  # not degenerate


# 4 prompts, 1, and 20 (vocabulary-major from gpt.VOCAB_MAJOR_MIN_BATCH = 16 sequences); 20 with a
# large vocabulary (the argmax in blocks); 1 and 4 with a head of 16 MiB + 128 bytes (2**17 + 1 x 32
# floats: streamed, so transposed as for a few sequences at batch 1, and vocabulary-major from
# gpt.STREAMED_VOCAB_MAJOR_MIN_BATCH = 2).
@pytest.mark.parametrize("prompts,vocab", [(PROMPTS, 96), (PROMPTS[:1], 96), (PROMPTS * 5, 96), (PROMPTS * 5, 8192),
                                           (PROMPTS[:1], 2**17 + 1), (PROMPTS, 2**17 + 1)],
                         ids=["batch", "one", "vocab_major", "vocab_major_large", "one_streamed_head",
                              "vocab_major_streamed_head"])
def test_greedy_through_the_tied_head_equals_full_reforward(prompts, vocab):
  """A tied head decodes one sequence through the embedding's rows (through the embedding
  transposed once per call if the head is read from memory at every step), a few through the
  transposed embedding, many into vocabulary-major logits that the argmax reads in place (on a CPU;
  gpt._decode_head): each gives the reference's tokens."""
  cfg = CFG.replace(tie_embeddings=True, vocab_size=vocab)
  streamed = streamed_head(cfg.vocab_size, cfg.d_model, cfg.dtype)
  assert streamed == (vocab > 2**17)
  vocab_major = len(prompts) >= (2 if streamed else 16)
  assert GPT(cfg).vocab_major_logits(len(prompts)) == vocab_major
  assert GPT(cfg).vocab_major_logits(2) == streamed
  assert sampler.compiler_options("cpu") == sampler.CPU_OPTIONS and sampler.compiler_options("gpu") == {}
  params = _params(cfg, scale=20.0, seed=1)  # the head reads the embedding: larger weights to vary the paths
  got = sampler.generate(GPT(cfg), params, prompts, max_new_tokens=20, sampling=Sampling(temperature=0))
  assert got == [_greedy_by_full_forward(cfg, params, p, 20) for p in prompts]
  assert all(len(set(g)) > 3 for g in got)  # not degenerate


def test_one_sequence_reads_a_head_larger_than_the_cache_through_its_transposed_copy():
  """gpt._decode_head at batch 1 on a CPU: a head of 16 MiB keeps the embedding's rows; one entry more
  (streamed from memory at every step) is read through a D x V copy of the embedding."""
  for vocab, copied in ((2**17, False), (2**17 + 1, True)):
    model = GPT(CFG.replace(tie_embeddings=True, vocab_size=vocab))
    params = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]))
    step = lambda p, c, t: model.apply({"params": p, "cache": c}, t, decode=True, mutable=["cache"])
    text = jax.jit(step).lower(params, sampler.init_cache(model, 1, 8), jnp.zeros((1, 1), jnp.int32)).as_text()
    assert (f"tensor<{CFG.d_model}x{vocab}xf32>" in text) == copied


def _vocab_major(x_BxV):
  """x as the tied head hands vocabulary-major logits over: the transpose of a V x B array."""
  return jnp.asarray(np.asarray(x_BxV).T.copy()).T


# V = 300 and the prime 4099: one maximum over all entries; 50,257 and 8,192: in blocks of 29 and 128.
@pytest.mark.parametrize("vocab", [300, 4099, 50257, 8192])
@pytest.mark.parametrize("vocab_major", [False, True])
@pytest.mark.parametrize("batch", [1, 3, 20])
def test_argmax_is_the_first_index_of_the_maximum(batch, vocab_major, vocab):
  """sampling.argmax in each of its forms is jnp.argmax: ties go to the first index."""
  assert sampler.argmax_block(vocab) == {300: None, 4099: None, 50257: 29, 8192: 128}[vocab]
  x_BxV = jnp.round(jax.random.normal(jax.random.key(batch), (batch, vocab)) * (2 if vocab < 1000 else 1.5))
  x_BxV = _vocab_major(x_BxV) if vocab_major else x_BxV
  got = jax.jit(lambda x: sampler.argmax(x, vocab_major))(x_BxV)
  np.testing.assert_array_equal(got, jnp.argmax(x_BxV, axis=-1))
  assert (jnp.sum(x_BxV == x_BxV.max(-1, keepdims=True), -1) > 1).any() or batch == 1  # ties were there


@pytest.mark.parametrize("vocab_major", [False, True])
def test_argmax_in_blocks_takes_the_first_maximum_across_and_within_blocks(vocab_major):
  """GPT-2's vocabulary, reduced in blocks of 29: the first block holding the maximum, then the first
  entry of that block that equals it, wherever the maxima lie."""
  V = 50257
  x_BxV = np.zeros((7, V), np.float32)
  x_BxV[1, V - 1] = 1  # the last entry, alone
  x_BxV[2, [29 * 5 + 3, 29 * 900]] = 1  # two blocks: the first one's
  x_BxV[3, [29 * 7 + 20, 29 * 7 + 10]] = 1  # one block, two entries: the first
  x_BxV[4] = -np.inf; x_BxV[4, 12345] = -3.0  # one finite entry
  x_BxV[5, [0, V - 1]] = 2  # the first and the last
  x_BxV[6] = np.arange(V) % 29 == 28  # the last entry of every block
  x_BxV = _vocab_major(x_BxV) if vocab_major else jnp.asarray(x_BxV)
  got = jax.jit(lambda x: sampler.argmax(x, vocab_major))(x_BxV)
  np.testing.assert_array_equal(got, [0, V - 1, 29 * 5 + 3, 29 * 7 + 10, 12345, 0, 28])


def test_decode_grows_its_cache_in_phases_that_end_at_prompt_plus_new_tokens():
  assert sampler.decode_lengths(32, 96) == [64, 96, 128]
  assert sampler.decode_lengths(32, 128) == [64, 96, 128, 160]
  assert sampler.decode_lengths(16, 1000) == [266, 516, 766, 1016]  # at most MAX_DECODE_PHASES
  assert sampler.decode_lengths(16, 40) == [56] and sampler.decode_lengths(16, 1) == [17]
  assert sampler.decode_lengths(32, 20, phase_tokens=6) == [39, 46, 52]  # ceil(20 j / 3) new tokens


@pytest.mark.parametrize("changes", [{}, {"scan_layers": True}])
def test_greedy_through_a_cache_grown_in_phases_equals_full_reforward(changes, params):
  """Four phases of 5 new tokens (cache of 37, 42, 47, 52 slots) give the tokens of the reference, for
  prompts of different lengths in one left-padded batch, with the cache's layers stacked or not."""
  cfg = CFG.replace(context_length=64, **changes)
  params = _params(CFG.replace(context_length=64))
  if cfg.scan_layers:
    from transformer.layers import stack_layers
    params = {**params, "h": stack_layers(params["h"], cfg.num_layers)}
  got = sampler.generate(GPT(cfg), params, PROMPTS, max_new_tokens=20, sampling=Sampling(temperature=0),
                         decode_phase=5)
  assert got == [_greedy_by_full_forward(cfg, params, p, 20) for p in PROMPTS]


def test_padding_does_not_change_logits(params):
  model = GPT(CFG)
  prompt = [5, 17, 3, 80, 41]
  alone_TxV = model.apply({"params": params}, jnp.array([prompt]))[0]
  padded_1xT = jnp.array([[0, 0, 0] + prompt])
  valid_1xT = jnp.array([[False] * 3 + [True] * 5])
  padded_TxV = model.apply({"params": params}, padded_1xT, valid_BxT=valid_1xT)[0]
  np.testing.assert_allclose(padded_TxV[3:], alone_TxV, atol=2e-5, rtol=1e-5)
  assert np.isfinite(np.asarray(padded_TxV)).all()


@pytest.mark.parametrize("sampling", [Sampling(temperature=0), Sampling(temperature=0.8, top_p=0.9),
                                      Sampling(temperature=1.2, top_k=5)])
def test_prompt_result_same_alone_and_in_a_padded_batch(sampling, params):
  model = GPT(CFG)
  short = [60, 2]
  alone = sampler.generate(model, params, [short], max_new_tokens=16, sampling=sampling, seed=7)
  # In row 0 of a batch whose other prompts are much longer: `short` is padded by 30+ slots.
  batch = sampler.generate(model, params, [short, list(range(1, 33)), [9] * 20], max_new_tokens=16,
                          sampling=sampling, seed=7)
  assert batch[0] == alone[0]


def _chi_square(counts_V, probs_V):
  """Pearson's statistic over the tokens expected >= 5 times (the rest pooled into one cell)."""
  n = counts_V.sum()
  expected_V = probs_V * n
  big = expected_V >= 5
  observed = np.append(counts_V[big], counts_V[~big].sum())
  expected = np.append(expected_V[big], expected_V[~big].sum())
  keep = expected > 0
  return float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()), int(keep.sum()) - 1


def test_samples_follow_softmax_of_logits_over_temperature(params):
  model = GPT(CFG)
  prompt = PROMPTS[0]
  logits_V = np.asarray(model.apply({"params": params}, jnp.array([prompt]))[0, -1], np.float64)
  n, temperature = 20000, 0.7
  first = sampler.generate(model, params, [prompt] * n, max_new_tokens=1,
                          sampling=Sampling(temperature=temperature), seed=0)
  counts_V = np.bincount([f[0] for f in first], minlength=CFG.vocab_size)

  def probs(t):
    p = np.exp((logits_V - logits_V.max()) / t)
    return p / p.sum()

  stat, dof = _chi_square(counts_V, probs(temperature))
  assert dof > 10  # the distribution is spread over many tokens: the test has power
  assert stat < dof + 5 * np.sqrt(2 * dof), (stat, dof)  # about 5 standard deviations
  # The same statistic rejects a wrong temperature: the test can fail.
  for wrong in (temperature * 0.8, temperature * 1.25):
    wrong_stat, wrong_dof = _chi_square(counts_V, probs(wrong))
    assert wrong_stat > wrong_dof + 10 * np.sqrt(2 * wrong_dof), (wrong, wrong_stat)


@pytest.mark.parametrize("block", [8, 256])
def test_inverse_cdf_draws_the_token_whose_cumulative_probability_passes_u(block):
  """sampling.inverse_cdf against float64 cumulative probabilities: over 7 blocks of 8 entries (the
  last one padded) and one block of 256, the first token whose cumulative probability exceeds u; never
  an excluded (-inf) token, also at u = 0 and at the largest float32 below 1."""
  V = 50
  logits_BxV = np.array(jax.random.normal(jax.random.key(0), (3, V)) * 2, np.float32)
  logits_BxV[0, :9] = -np.inf  # the first block and one more entry excluded
  logits_BxV[1, 20:] = -np.inf  # the last blocks excluded
  logits_BxV[2, ::3] = -np.inf  # excluded entries inside every block
  u_M = np.concatenate([(np.arange(2000) + 0.5) / 2000, [0.0, np.nextafter(np.float32(1), np.float32(0))]])
  draw = jax.jit(lambda l, u: jax.vmap(lambda u: sampler.inverse_cdf(l, jnp.full((3,), u), block=block))(u))
  got_MxB = np.asarray(draw(jnp.asarray(logits_BxV), jnp.asarray(u_M, jnp.float32)))
  for b in range(3):
    p_V = np.exp(logits_BxV[b].astype(np.float64) - logits_BxV[b].max())
    cum_V = np.cumsum(p_V / p_V.sum())
    want_M = np.minimum(np.searchsorted(cum_V, u_M, side="right"), np.flatnonzero(p_V)[-1])
    near_edge_M = np.abs(cum_V[want_M] - u_M) < 1e-5
    assert ((got_MxB[:, b] == want_M) | near_edge_M).all()
    assert np.isfinite(logits_BxV[b, got_MxB[:, b]]).all()
    assert got_MxB[-2, b] == np.flatnonzero(p_V)[0]  # u = 0: the first token that can be drawn
  assert len(set(got_MxB[:, 2].tolist())) > 20  # draws spread over the row's tokens


def _nucleus_reference(logits_V, top_p):
  """The tokens top-p keeps, computed plainly: most likely first, until the mass reaches top_p."""
  probs_V = np.exp(logits_V - logits_V.max())
  probs_V /= probs_V.sum()
  kept, mass = set(), 0.0
  for token in np.argsort(-probs_V, kind="stable"):
    kept.add(int(token))
    mass += probs_V[token]
    if mass >= top_p:
      return kept
  return kept


def test_filter_logits_matches_plain_top_k_and_top_p():
  logits_BxV = np.asarray(jax.random.normal(jax.random.key(0), (64, 50)) * 3, np.float32)
  for top_k in (1, 5, 49):
    kept_BxV = np.isfinite(sampler.filter_logits(jnp.asarray(logits_BxV), Sampling(top_k=top_k)))
    for row, kept in zip(logits_BxV, kept_BxV):
      assert set(np.flatnonzero(kept)) == set(np.argsort(-row)[:top_k])
  for top_p in (0.05, 0.5, 0.9, 0.999):
    kept_BxV = np.isfinite(sampler.filter_logits(jnp.asarray(logits_BxV), Sampling(top_p=top_p)))
    for row, kept in zip(logits_BxV, kept_BxV):
      assert set(np.flatnonzero(kept)) == _nucleus_reference(row.astype(np.float64), top_p)


@pytest.mark.parametrize("sampling", [Sampling(temperature=1.5, top_k=3), Sampling(temperature=1.5, top_p=0.6),
                                      Sampling(temperature=1.5, top_k=8, top_p=0.5)])
def test_top_k_and_top_p_never_emit_excluded_tokens(sampling, params):
  model = GPT(CFG)
  prompt = PROMPTS[0]
  logits_V = np.asarray(model.apply({"params": params}, jnp.array([prompt]))[0, -1], np.float64)
  allowed = set(range(CFG.vocab_size))
  if sampling.top_k:
    allowed &= set(np.argsort(-logits_V)[:sampling.top_k].tolist())
  if sampling.top_p < 1:
    scaled = logits_V / sampling.temperature
    if sampling.top_k:
      scaled = np.where(np.isin(np.arange(CFG.vocab_size), list(allowed)), scaled, -np.inf)
    allowed &= _nucleus_reference(scaled, sampling.top_p)
  first = sampler.generate(model, params, [prompt] * 3000, max_new_tokens=1, sampling=sampling, seed=1)
  seen = {f[0] for f in first}
  assert seen <= allowed
  assert len(seen) == len(allowed) or len(allowed) > 3  # the filter does not collapse to greedy
  assert len(seen) > 1


def test_temperature_zero_is_greedy_and_negative_is_rejected(params):
  model = GPT(CFG)
  greedy = sampler.generate(model, params, PROMPTS, max_new_tokens=5, sampling=Sampling(temperature=0), seed=1)
  again = sampler.generate(model, params, PROMPTS, max_new_tokens=5, sampling=Sampling(temperature=0, top_k=2),
                          seed=99)
  assert greedy == again
  with pytest.raises(ConfigError, match="temperature must be >= 0"):
    sampler.generate(model, params, PROMPTS, max_new_tokens=5, sampling=Sampling(temperature=-1))
  for bad, match in [(Sampling(top_p=0), "top_p must be in"), (Sampling(top_k=-1), "top_k must be >= 0")]:
    with pytest.raises(ConfigError, match=match):
      sampler.generate(model, params, PROMPTS, max_new_tokens=5, sampling=bad)


def test_seeded_sampling_is_reproducible_and_seed_dependent(params):
  model = GPT(CFG)
  run = lambda seed: sampler.generate(model, params, PROMPTS, max_new_tokens=12, sampling=Sampling(), seed=seed)
  assert run(3) == run(3)
  assert run(3) != run(4)


def test_each_sequence_stops_at_its_stop_token(params):
  model = GPT(CFG)
  free = sampler.generate(model, params, PROMPTS, max_new_tokens=20, sampling=Sampling(temperature=0))
  stop = free[0][5]  # a token row 0 emits at step 5
  stopped = sampler.generate(model, params, PROMPTS, max_new_tokens=20, sampling=Sampling(temperature=0),
                            stop_id=stop)
  for f, s in zip(free, stopped):
    assert s == (f[:f.index(stop)] if stop in f else f)
  assert len(stopped[0]) <= 5 and any(len(s) == 20 for s in stopped)


def test_streaming_calls_back_every_step_in_order(params, monkeypatch):
  """Every row in each call back, in prompt order: a streaming batch is never split (`cpu_parts`)."""
  monkeypatch.setattr(sampler, "cpu_parts", lambda *args: 2)
  model = GPT(CFG)
  seen = []
  out = sampler.generate(model, params, PROMPTS[:2], max_new_tokens=6, sampling=Sampling(temperature=0),
                        on_token=lambda step, tokens_B: seen.append((step, tokens_B.tolist())))
  assert [s for s, _ in seen] == list(range(6))
  assert [list(col) for col in zip(*[t for _, t in seen])] == out


@pytest.mark.parametrize("sampling", [Sampling(temperature=0), Sampling(temperature=0.9, top_k=20)])
def test_a_batch_split_over_cpu_cores_makes_the_tokens_of_the_whole_batch(sampling, params, monkeypatch):
  """On a CPU, `generate` decodes parts of a batch on threads of their own (`cpu_parts`): 7 prompts
  in 3 parts (padded to 9: 3 calls of one program for 3 rows) make the tokens of one call over all
  of them, sampled ones too (a row draws by its index in the whole batch), each stopping on its own."""
  model = GPT(CFG)
  prompts = PROMPTS + [[7, 8, 9], [1] * 12, [90]]
  run = lambda stop=None: sampler.generate(model, params, prompts, max_new_tokens=12, sampling=sampling, seed=3,
                                           stop_id=stop)
  monkeypatch.setattr(sampler, "cpu_parts", lambda *args: 1)
  stop = run()[0][4]  # a token row 0 makes at step 4
  whole = run(stop)
  calls = []
  compiled = sampler.jitted_sampler

  def recording_sampler(mesh=None):
    def call(params, prompt_BxP, valid_BxP, rng, first_row, **kwargs):
      calls.append((first_row, len(prompt_BxP), threading.get_ident()))
      return compiled(mesh)(params, prompt_BxP, valid_BxP, rng, first_row, **kwargs)
    return call

  monkeypatch.setattr(sampler, "jitted_sampler", recording_sampler)
  monkeypatch.setattr(sampler, "cpu_parts", lambda *args: 3)
  assert run(stop) == whole
  assert sorted((first, rows) for first, rows, _ in calls) == [(0, 3), (3, 3), (6, 3)]
  assert len({thread for _, _, thread in calls}) > 1
  assert len({tuple(w) for w in whole}) == len(prompts) and {len(w) < 12 for w in whole} == {True, False}


def test_cpu_parts_one_per_thread_each_of_enough_prompts():
  small_vocab, large_vocab = GPT(CFG), GPT(CFG.replace(vocab_size=sampler.LARGE_VOCAB))
  assert [sampler.cpu_parts(small_vocab, b, 2) for b in (1, 4, 7, 8, 9, 32)] == [1, 1, 1, 2, 2, 2]
  # A large vocabulary's parts keep the vocabulary-major head (16 rows or more); a head larger than
  # the cache, which each part reads from memory, gets 32 or more.
  assert [sampler.cpu_parts(large_vocab, b, 2) for b in (8, 16, 31, 32)] == [1, 1, 1, 2]
  in_cache = CFG.replace(vocab_size=STREAMED_HEAD_BYTES // (4 * CFG.d_model))  # a head of exactly 16 MiB
  assert [sampler.cpu_parts(GPT(in_cache), b, 2) for b in (16, 32)] == [1, 2]
  streamed = GPT(in_cache.replace(vocab_size=in_cache.vocab_size + 1))
  assert [sampler.cpu_parts(streamed, b, 2) for b in (16, 32, 63, 64)] == [1, 1, 1, 2]
  assert [sampler.cpu_parts(small_vocab, b, 16) for b in (8, 32, 128)] == [2, 8, 16]
  assert sampler.cpu_parts(small_vocab, 32, 1) == 1


def test_decoders_run_on_one_thread_per_core_of_a_cpu_device(monkeypatch):
  from transformer import sharding
  from transformer.generation import common
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
  assert common.cpu_threads(None) == common.cpu_threads(sharding.make_mesh((1, 1, 1))) == 3
  assert common.on_threads(lambda x: x * x, [], 3) == []
  assert common.on_threads(lambda x: x * x, list(range(6)), 3) == [0, 1, 4, 9, 16, 25]  # in order


def test_bad_inputs_give_one_clear_error(params):
  model = GPT(CFG)
  cases = [
      (dict(prompts=[[]]), "prompt 0 is empty; start it with the end-of-text id"),
      (dict(prompts=[[1], [200]]), r"prompt 1 has token id 200 outside the model's vocabulary \[0, 96\)"),
      (dict(prompts=[list(range(40))], max_new_tokens=9),
       "prompt 0 \\(40 tokens\\) \\+ max_new_tokens=9 is longer than the model's context of 48 tokens.*"
       "lower max_new_tokens to 8.*sliding_window"),
      (dict(prompts=[[1]], max_new_tokens=0), "max_new_tokens must be >= 1"),
      (dict(prompts=[[1]], decode_phase=0), r"decode_phase must be >= 1 \(max_new_tokens or more: one phase\)"),
      (dict(prompts="hello"), "prompts must be a non-empty list of token-id lists"),
  ]
  for kwargs, match in cases:
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ConfigError, match=match):
      sampler.generate(model, params, kwargs.pop("prompts"), **kwargs)


def test_sliding_window_goes_past_the_context(params):
  model = GPT(CFG)
  long_prompt = list(range(1, 41))
  [out] = sampler.generate(model, params, [long_prompt], max_new_tokens=20, sampling=Sampling(temperature=0),
                          sliding_window=True)
  assert len(out) == 20
  # Its first 8 tokens still fit the context: the cache sampler gives the same ones.
  [cached] = sampler.generate(model, params, [long_prompt], max_new_tokens=8, sampling=Sampling(temperature=0))
  assert out[:8] == cached


class SampleLogitsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_and_no_jit_draw_the_same_tokens(self):
    logits_BxV = jax.random.normal(jax.random.key(0), (4, 96)) * 3
    for how in (Sampling(temperature=0), Sampling(temperature=0.7, top_k=5), Sampling(top_p=0.8)):
      tokens_B = self.variant(lambda x, key, how=how: sampler.sample_logits(x, key, how))(logits_BxV, jax.random.key(3))
      chex.assert_shape(tokens_B, (4,))
      reference = jax.jit(lambda x, key, how=how: sampler.sample_logits(x, key, how))(logits_BxV, jax.random.key(3))
      np.testing.assert_array_equal(tokens_B, reference)


def test_prompts_of_one_length_bucket_compile_once(params, monkeypatch):
  """Prompt lengths are padded to a bucket: batches of 1 to 16 tokens share one compiled sampler."""
  traced = jax.jit(chex.assert_max_traces(sampler.sample_padded, n=1), static_argnames=sampler.STATIC_ARGNAMES)
  monkeypatch.setattr(sampler, "jitted_sampler", lambda *args: traced)
  for prompts in ([[5, 6, 7], list(range(1, 10))], [list(range(20, 36)), [4]], [[8] * 12, [9] * 2]):
    out = sampler.generate(GPT(CFG), params, prompts, max_new_tokens=4, sampling=Sampling(temperature=0))
    assert [len(o) for o in out] == [4, 4]


_SHARDED = r"""
import json, sys
sys.path.insert(0, {repo!r}); sys.path.insert(0, {tests!r})
import jax, flax.linen as nn
from test_sampling import CFG, PROMPTS, _params
from transformer import sharding
from transformer.generation import sampling as sampler
from transformer.models.gpt import GPT
mesh = sharding.make_mesh((2, 2, 2))
rules = sharding.DEFAULT_RULES
params = _params()
with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
  boxed = jax.eval_shape(lambda: GPT(CFG).init(jax.random.key(0), jax.numpy.zeros((1, 8), "int32"))["params"])
shardings = sharding.logical_shardings(mesh, boxed, rules)
params = jax.device_put(params, shardings)
assert len(params["wte"]["embedding"].sharding.device_set) == 8
from transformer.generation import common
assert common.cpu_threads(mesh) == 1  # a mesh of several devices splits the batch over them instead
out = {{}}
for name, sampling in [("greedy", sampler.Sampling(temperature=0)), ("sampled", sampler.Sampling(top_p=0.9))]:
  out[name] = sampler.generate(GPT(CFG), params, PROMPTS, max_new_tokens=12, sampling=sampling, seed=5,
                              mesh=mesh, rules=rules)
print(json.dumps(out))
"""


def test_sharded_generation_on_8_devices_matches_one_device(params):
  """Params sharded like training (data 2 x fsdp 2 x tensor 2), batch and cache split: same tokens."""
  code = _SHARDED.format(repo=str(REPO), tests=str(REPO / "tests"))
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                        env={**__import__("os").environ, "JAX_NUM_CPU_DEVICES": "8"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  sharded = json.loads(proc.stdout.strip().splitlines()[-1])
  model = GPT(CFG)
  assert sharded["greedy"] == sampler.generate(model, params, PROMPTS, max_new_tokens=12,
                                              sampling=Sampling(temperature=0), seed=5)
  assert sharded["sampled"] == sampler.generate(model, params, PROMPTS, max_new_tokens=12,
                                               sampling=Sampling(top_p=0.9), seed=5)
