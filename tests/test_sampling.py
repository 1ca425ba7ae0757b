"""The KV-cache sampler (transformer.generation.sampling): exactness against full re-forward, padding
independence, the sampling distribution, top-k/top-p, stopping, errors, shardings."""

import json
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.errors import ConfigError
from transformer.generation import sampling as sampler
from transformer.generation.sampling import Sampling
from transformer.models.gpt import GPT, GPTConfig

from conftest import REPO, compiled_init

CFG = GPTConfig().replace(vocab_size=96, max_len=48, num_layers=2, num_heads=4, d_model=32, tie_embeddings=False)
PROMPTS = [[5, 17, 3, 80, 41, 2, 9], [60], list(range(10, 31)), [33, 34]]


def _params(cfg=CFG, scale=10.0, seed=0):
  """Random weights, scaled up so that the next-token distributions are far from uniform and
  greedy paths are varied (at init scale every logit is ~0 and decoding just repeats)."""
  params = compiled_init(GPT(cfg), jnp.zeros((1, 8), jnp.int32), seed=seed)
  return jax.tree_util.tree_map_with_path(
    lambda path, x: x if "ln" in jax.tree_util.keystr(path) else jnp.asarray(np.asarray(x) * scale), params
  )


@pytest.fixture(scope="module")
def params():
  return _params()


def _greedy_by_full_forward(cfg, params, prompt, n):
  """The reference: re-run the whole sequence for every new token, no cache. (Into a buffer of
  max_len, one compile: causality makes the zeros after the sequence irrelevant.)"""
  forward = jax.jit(lambda buffer_1xC, last: GPT(cfg).apply({"params": params}, buffer_1xC)[0, last])
  tokens = list(prompt)
  for _ in range(n):
    buffer_1xC = np.zeros((1, cfg.max_len), np.int32)
    buffer_1xC[0, : len(tokens)] = tokens
    tokens.append(int(jnp.argmax(forward(buffer_1xC, len(tokens) - 1))))
  return tokens[len(prompt) :]


# Today's options (transformer.models.gpt), together: what the KV cache must also carry exactly.
MODERN = {"positions": "rope", "norm": "rms_norm", "activation": "swiglu", "qk_norm": True, "logits_softcap": 50.0}


@pytest.mark.slow
@pytest.mark.parametrize(
  "changes",
  [
    {},
    {"attention": "einsum"},
    {"scan_layers": True},
    MODERN,
    {"positions": "none", "activation": "relu2", "norm": "rms_norm"},
    {"positions": "sinusoidal", "scan_layers": True, "qk_norm": True},
  ],
)
def test_greedy_with_cache_equals_full_reforward(changes, params):
  """Prompts of different lengths in one left-padded batch, through the KV cache: each gets the
  tokens that re-reading its whole sequence for every new token gives."""
  cfg = CFG.replace(**changes)
  if {"positions", "norm", "activation", "qk_norm"} & set(changes):  # other parameters
    params = _params(cfg.replace(scan_layers=False))
  if cfg.scan_layers:
    from transformer.layers import stack_layers

    params = {**params, "h": stack_layers(params["h"], cfg.num_layers)}
  got = sampler.generate(GPT(cfg), params, PROMPTS, max_new_tokens=20, sampling=Sampling(temperature=0))
  want = [_greedy_by_full_forward(cfg, params, p, 20) for p in PROMPTS]
  assert got == want
  assert len({tuple(g) for g in got}) == len(PROMPTS) and all(len(set(g)) > 3 for g in got)  # not degenerate


def test_decode_grows_its_cache_in_phases_that_end_at_prompt_plus_new_tokens():
  assert sampler.decode_lengths(32, 96) == [64, 96, 128]
  assert sampler.decode_lengths(32, 128) == [64, 96, 128, 160]
  assert sampler.decode_lengths(16, 1000) == [266, 516, 766, 1016]  # at most MAX_DECODE_PHASES
  assert sampler.decode_lengths(16, 40) == [56] and sampler.decode_lengths(16, 1) == [17]
  assert sampler.decode_lengths(32, 20, phase_tokens=6) == [39, 46, 52]  # ceil(20 j / 3) new tokens


@pytest.mark.slow
@pytest.mark.parametrize("changes", [{}, {"scan_layers": True}])
def test_greedy_through_a_cache_grown_in_phases_equals_full_reforward(changes, params):
  """Four phases of 5 new tokens (cache of 37, 42, 47, 52 slots) give the tokens of the reference, for
  prompts of different lengths in one left-padded batch, with the cache's layers stacked or not."""
  cfg = CFG.replace(max_len=64, **changes)
  params = _params(CFG.replace(max_len=64))
  if cfg.scan_layers:
    from transformer.layers import stack_layers

    params = {**params, "h": stack_layers(params["h"], cfg.num_layers)}
  got = sampler.generate(GPT(cfg), params, PROMPTS, max_new_tokens=20, sampling=Sampling(temperature=0), decode_phase=5)
  assert got == [_greedy_by_full_forward(cfg, params, p, 20) for p in PROMPTS]


@pytest.mark.slow
@pytest.mark.parametrize("changes", [{}, MODERN])
def test_padding_does_not_change_logits(params, changes):
  model = GPT(CFG.replace(**changes))
  params = _params(model.config) if changes else params
  prompt = [5, 17, 3, 80, 41]
  alone_TxV = model.apply({"params": params}, jnp.array([prompt]))[0]
  padded_1xT = jnp.array([[0, 0, 0] + prompt])
  valid_1xT = jnp.array([[False] * 3 + [True] * 5])
  padded_TxV = model.apply({"params": params}, padded_1xT, valid_BxT=valid_1xT)[0]
  np.testing.assert_allclose(padded_TxV[3:], alone_TxV, atol=2e-5, rtol=1e-5)
  assert np.isfinite(np.asarray(padded_TxV)).all()


@pytest.mark.parametrize(
  "sampling", [Sampling(temperature=0), Sampling(temperature=0.8, top_p=0.9), Sampling(temperature=1.2, top_k=5)]
)
@pytest.mark.slow
def test_prompt_result_same_alone_and_in_a_padded_batch(sampling, params):
  model = GPT(CFG)
  short = [60, 2]
  alone = sampler.generate(model, params, [short], max_new_tokens=16, sampling=sampling, seed=7)
  # In row 0 of a batch whose other prompts are much longer: `short` is padded by 30+ slots.
  batch = sampler.generate(
    model, params, [short, list(range(1, 33)), [9] * 20], max_new_tokens=16, sampling=sampling, seed=7
  )
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


@pytest.mark.slow
def test_samples_follow_softmax_of_logits_over_temperature(params):
  model = GPT(CFG)
  prompt = PROMPTS[0]
  logits_V = np.asarray(model.apply({"params": params}, jnp.array([prompt]))[0, -1], np.float64)
  n, temperature = 20000, 0.7
  first = sampler.generate(
    model, params, [prompt] * n, max_new_tokens=1, sampling=Sampling(temperature=temperature), seed=0
  )
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


@pytest.mark.parametrize(
  "sampling",
  [
    Sampling(temperature=1.5, top_k=3),
    Sampling(temperature=1.5, top_p=0.6),
    Sampling(temperature=1.5, top_k=8, top_p=0.5),
  ],
)
@pytest.mark.slow
def test_top_k_and_top_p_never_emit_excluded_tokens(sampling, params):
  model = GPT(CFG)
  prompt = PROMPTS[0]
  logits_V = np.asarray(model.apply({"params": params}, jnp.array([prompt]))[0, -1], np.float64)
  allowed = set(range(CFG.vocab_size))
  if sampling.top_k:
    allowed &= set(np.argsort(-logits_V)[: sampling.top_k].tolist())
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


@pytest.mark.slow
def test_temperature_zero_is_greedy_and_negative_is_rejected(params):
  model = GPT(CFG)
  greedy = sampler.generate(model, params, PROMPTS, max_new_tokens=5, sampling=Sampling(temperature=0), seed=1)
  again = sampler.generate(model, params, PROMPTS, max_new_tokens=5, sampling=Sampling(temperature=0, top_k=2), seed=99)
  assert greedy == again
  with pytest.raises(ConfigError, match="temperature must be >= 0"):
    sampler.generate(model, params, PROMPTS, max_new_tokens=5, sampling=Sampling(temperature=-1))
  for bad, match in [(Sampling(top_p=0), "top_p must be in"), (Sampling(top_k=-1), "top_k must be >= 0")]:
    with pytest.raises(ConfigError, match=match):
      sampler.generate(model, params, PROMPTS, max_new_tokens=5, sampling=bad)


@pytest.mark.slow
def test_seeded_sampling_is_reproducible_and_seed_dependent(params):
  model = GPT(CFG)
  run = lambda seed: sampler.generate(model, params, PROMPTS, max_new_tokens=12, sampling=Sampling(), seed=seed)
  assert run(3) == run(3)
  assert run(3) != run(4)


@pytest.mark.slow
def test_each_sequence_stops_at_its_stop_token(params):
  model = GPT(CFG)
  free = sampler.generate(model, params, PROMPTS, max_new_tokens=20, sampling=Sampling(temperature=0))
  stop = free[0][5]  # a token row 0 emits at step 5
  stopped = sampler.generate(model, params, PROMPTS, max_new_tokens=20, sampling=Sampling(temperature=0), stop_id=stop)
  for f, s in zip(free, stopped):
    assert s == (f[: f.index(stop)] if stop in f else f)
  assert len(stopped[0]) <= 5 and any(len(s) == 20 for s in stopped)


def test_streaming_calls_back_every_step_in_order(params, monkeypatch):
  """Every row in each call back, in prompt order: a streaming batch is never split (`split_parts`)."""
  monkeypatch.setattr(sampler, "split_parts", lambda *args: 2)
  model = GPT(CFG)
  seen = []
  out = sampler.generate(
    model,
    params,
    PROMPTS[:2],
    max_new_tokens=6,
    sampling=Sampling(temperature=0),
    on_token=lambda step, tokens_B: seen.append((step, tokens_B.tolist())),
  )
  assert [s for s, _ in seen] == list(range(6))
  assert [list(col) for col in zip(*[t for _, t in seen])] == out


def test_bad_inputs_give_one_clear_error(params):
  model = GPT(CFG)
  cases = [
    (dict(prompts=[[]]), "prompt 0 is empty; start it with the end-of-text id"),
    (dict(prompts=[[1], [200]]), r"prompt 1 has token id 200 outside the model's vocabulary \[0, 96\)"),
    (
      dict(prompts=[list(range(40))], max_new_tokens=9),
      "prompt 0 \\(40 tokens\\) \\+ max_new_tokens=9 is longer than the model's context of 48 tokens.*"
      "lower max_new_tokens to 8.*sliding_window",
    ),
    (  # a prompt as long as the context: no count of new tokens fits, so none is advised
      dict(prompts=[list(range(48))], max_new_tokens=1),
      "context of 48 tokens; shorten the prompt to fewer than 48 tokens, or use the sliding window",
    ),
    (dict(prompts=[[1]], max_new_tokens=0), "max_new_tokens must be >= 1"),
    (dict(prompts=[[1]], decode_phase=0), r"decode_phase must be >= 1 \(max_new_tokens or more: one phase\)"),
    (dict(prompts="hello"), "prompts must be a non-empty list of token-id lists"),
  ]
  for kwargs, match in cases:
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ConfigError, match=match):
      sampler.generate(model, params, kwargs.pop("prompts"), **kwargs)


@pytest.mark.slow
def test_sliding_window_goes_past_the_context(params):
  model = GPT(CFG)
  long_prompt = list(range(1, 41))
  [out] = sampler.generate(
    model, params, [long_prompt], max_new_tokens=20, sampling=Sampling(temperature=0), sliding_window=True
  )
  assert len(out) == 20
  # Its first 8 tokens still fit the context: the cache sampler gives the same ones.
  [cached] = sampler.generate(model, params, [long_prompt], max_new_tokens=8, sampling=Sampling(temperature=0))
  assert out[:8] == cached


@pytest.mark.slow
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
assert sampler.split_parts(GPT(CFG), 32, mesh) == 1  # a mesh of several devices splits the batch over them
out = {{}}
for name, sampling in [("greedy", sampler.Sampling(temperature=0)), ("sampled", sampler.Sampling(top_p=0.9))]:
  out[name] = sampler.generate(GPT(CFG), params, PROMPTS, max_new_tokens=12, sampling=sampling, seed=5,
                              mesh=mesh, rules=rules)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_sharded_generation_on_8_devices_matches_one_device(params):
  """Params sharded like training (data 2 x fsdp 2 x tensor 2), batch and cache split: same tokens."""
  code = _SHARDED.format(repo=str(REPO), tests=str(REPO / "tests"))
  proc = subprocess.run(
    [sys.executable, "-c", code],
    capture_output=True,
    text=True,
    timeout=300,
    env={**__import__("os").environ, "JAX_NUM_CPU_DEVICES": "8"},
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  sharded = json.loads(proc.stdout.strip().splitlines()[-1])
  model = GPT(CFG)
  assert sharded["greedy"] == sampler.generate(
    model, params, PROMPTS, max_new_tokens=12, sampling=Sampling(temperature=0), seed=5
  )
  assert sharded["sampled"] == sampler.generate(
    model, params, PROMPTS, max_new_tokens=12, sampling=Sampling(top_p=0.9), seed=5
  )


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [Sampling(temperature=0.0), Sampling(temperature=1.0, top_k=20)])
def test_a_fixed_trip_count_loop_makes_the_tokens_the_stopping_loop_makes(sampling, params):
  """The accelerators' decode loop runs all max_new_tokens steps (no stop condition read on the host
  each token), the tokens after <stop> masked: greedy and sampled tokens (the same key) equal the
  stopping loop's, over phases of the cache, with rows that stop early and rows that do not."""
  model = GPT(CFG.replace(kernels="reference"))
  prompt_BxP = jnp.array([[0, 0, 5, 6, 7], [1, 2, 3, 4, 9], [0, 0, 0, 8, 1]], jnp.int32)
  valid_BxP = prompt_BxP > 0
  rng, options = jax.random.key(3), dict(model=model, max_new_tokens=24, sampling=sampling, decode_phase=8)
  free = sampler.sample_padded(params, prompt_BxP, valid_BxP, rng, **options)
  stop_id = int(np.bincount(np.asarray(free)[:, :12].ravel()).argmax())  # a token some rows make early
  tokens = {
    fixed: sampler.jitted_sampler(model)(
      params, prompt_BxP, valid_BxP, rng, stop_id=stop_id, fixed_trips=fixed, **options
    )
    for fixed in (False, True)
  }
  np.testing.assert_array_equal(tokens[True], tokens[False])
  stopped = (np.asarray(tokens[True]) == stop_id).any(axis=1)
  assert stopped.any()  # the stopping loop had rows to stop
  # The stopping loop's condition reduces the rows' done flags to one: the fixed loop's never does.
  all_done = "applies stablehlo.and across dimensions = [0] : (tensor<3xi1>, tensor<i1>) -> tensor<i1>"
  for fixed in (False, True):
    lowered = jax.jit(sampler.sample_padded, static_argnames=sampler.STATIC_ARGNAMES).lower(
      params, prompt_BxP, valid_BxP, rng, stop_id=stop_id, fixed_trips=fixed, **options
    )
    assert (all_done in lowered.as_text()) != fixed
