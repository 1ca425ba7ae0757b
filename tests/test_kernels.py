"""transformer/kernels: every faster form equals the reference it stands in for, in values and
gradients, and `config.model.kernels` picks the forms (reference, cpu, accelerator) at one place each."""

import functools
import os
import re
import threading

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized

from transformer import kernels, layers
from transformer.errors import ConfigError
from transformer.generation import sampling as sampler
from transformer.generation.sampling import Sampling
from transformer.kernels import argmax, attention, decode_head, decode_threads, draw, lm_loss, projection
from transformer.models import seq2seq
from transformer.models.gpt import GPT, GPTConfig, next_token_nll

from conftest import compiled_init

FORMS = ("reference", "cpu", "accelerator")


def test_kernels_values_and_what_auto_means_here():
  assert kernels.resolve("auto") == kernels.for_platform(jax.default_backend())  # cpu here, accelerator on a chip
  assert kernels.for_platform("cpu") == "cpu"
  assert kernels.resolve("auto", "gpu") == kernels.for_platform("tpu") == "accelerator"
  assert [kernels.resolve(k) for k in FORMS] == list(FORMS)
  with pytest.raises(ConfigError, match="unknown kernels 'fast'; choose one of auto, reference, cpu, accelerator"):
    kernels.resolve("fast")
  with pytest.raises(ConfigError, match="unknown kernels"):
    GPTConfig().replace(vocab_size=10, kernels="fast").check()


def test_the_start_up_line_names_the_forms_and_how_to_run_the_reference():
  line = kernels.describe("auto", "cpu")
  assert line.startswith("kernels: cpu (auto on cpu: causal attention by blocks") and "\n" not in line
  assert line.endswith("--config.model.kernels=reference runs transformer/layers/ as written")
  assert kernels.describe("auto", "gpu").startswith("kernels: accelerator (auto on gpu: ")
  assert kernels.describe("reference") == f"kernels: reference (config.model.kernels: {kernels.FORMS['reference']})"


def test_the_forms_are_decided_once_per_model(monkeypatch):
  """A model resolves config.model.kernels once, where it is built, and hands the decided forms to
  its layers: no op asks again (jax.default_backend() is read once)."""
  calls = []
  resolve = kernels.resolve
  monkeypatch.setattr(kernels, "resolve", lambda *args: calls.append(args) or resolve(*args))
  cfg = CFG.replace(num_layers=3, positions="rope", qk_norm=True)
  params = jax.eval_shape(GPT(cfg).init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))  # traced: nothing run
  jax.eval_shape(GPT(cfg).apply, params, jnp.zeros((2, 8), jnp.int32))
  assert calls == [("auto",), ("auto",)]  # one for init, one for apply; none per layer or op


def test_an_edit_of_the_reference_runs_with_kernels_reference(monkeypatch):
  """What a researcher who edits transformer/layers/ sees: with kernels=reference the edited attention runs
  (here `mix` made to return zeros), with the CPU's forms causal self-attention takes
  kernels.attention instead, which the edit does not touch."""
  cfg = CFG.replace(num_layers=1)
  tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (1, 8), np.int32)
  params = {"params": compiled_init(GPT(cfg), tokens)}
  # Each run traced anew (a fresh jax.jit), so that it reads transformer/layers/ as it is at that moment.
  run = lambda form: jax.jit(lambda p, t: GPT(cfg.replace(kernels=form)).apply(p, t))(params, tokens)
  logits = {form: run(form) for form in ("reference", "cpu")}
  mix = layers.attention.mix  # transformer/layers/attention.py, as a researcher would edit it
  monkeypatch.setattr(layers.attention, "mix", lambda *args, **kw: jnp.zeros_like(mix(*args, **kw)))
  edited = {form: run(form) for form in ("reference", "cpu")}
  assert not np.array_equal(edited["reference"], logits["reference"])
  np.testing.assert_array_equal(edited["cpu"], logits["cpu"])


# --- projection --------------------------------------------------------------------------------

# x, kernel, contracted dims: the fused qkv (kernel in < out), the MLP's fc (<) and proj (>), the
# attention's output (two contracted dims, =), a proj-like kernel over tokens in one dim (>).
PROJECTIONS = [
  ((2, 5, 8), (8, 3, 2, 4), 1),
  ((2, 5, 8), (8, 32), 1),
  ((2, 5, 32), (32, 8), 1),
  ((2, 5, 2, 4), (2, 4, 8), 2),
  ((10, 24), (24, 6), 1),
]


@functools.partial(jax.jit, static_argnums=3)
def _tensordot_and_vjp(x, kernel, cotangent, contract):
  value, vjp = jax.vjp(lambda x, k: jnp.tensordot(x, k, contract), x, kernel)
  return value, vjp(cotangent)


class ProjectionTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*PROJECTIONS)
  def test_values_and_gradients_equal_autodiff_of_tensordot(self, x_shape, kernel_shape, contract):
    rng = np.random.default_rng(0)
    x, kernel = rng.standard_normal(x_shape, np.float32), rng.standard_normal(kernel_shape, np.float32)
    cotangent = rng.standard_normal(np.tensordot(x, kernel, contract).shape, np.float32)
    ours = self.variant(lambda x, k: jax.vjp(lambda x, k: projection.project(x, k, contract), x, k)[1](cotangent))
    value, reference = _tensordot_and_vjp(x, kernel, cotangent, contract)  # one program
    np.testing.assert_allclose(
      self.variant(lambda x, k: projection.project(x, k, contract))(x, kernel), value, rtol=1e-5, atol=1e-5
    )
    for got, want in zip(ours(x, kernel), reference, strict=True):
      chex.assert_equal_shape([got, want])
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_projection_kernel_gradients_are_the_products_xla_cpu_runs_in_its_library():
  """Autodiff's kernel gradient contracts the token dims that lead both operands, a product XLA:CPU
  runs in its slow fallback (a plain `dot` in the optimised HLO) instead of its library (YNNPACK, a
  custom fusion like the forward products); kernels.projection's gradients take only library products."""
  if jax.default_backend() != "cpu":
    pytest.skip("a property of XLA:CPU's programs")
  x = jax.random.normal(jax.random.key(0), (4, 64, 32))
  fc, proj = jax.random.normal(jax.random.key(1), (32, 128)), jax.random.normal(jax.random.key(2), (128, 32))

  def plain_dots(project):
    loss = lambda fc, proj, x: jnp.sum(project(jax.nn.gelu(project(x, fc, 1)), proj, 1) ** 2)
    hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(fc, proj, x).compile().as_text()
    entry = hlo[hlo.index("ENTRY") :]
    if "kind=kCustom" not in entry:
      pytest.skip("this XLA:CPU runs no product in a library fusion")
    return len(re.findall(r" dot\(", entry))

  assert plain_dots(lambda x, k, c: jnp.tensordot(x, k, c)) > 0  # what kernels.projection exists for
  assert plain_dots(projection.project) == 0


# --- attention ---------------------------------------------------------------------------------


def _qkv(B=2, T=5, S=7, H=3, K=8, seed=0):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(kq, (B, T, H, K)), jax.random.normal(kk, (B, S, H, K)), jax.random.normal(kv, (B, S, H, K)))


@pytest.mark.slow
@pytest.mark.parametrize("T", [attention.BLOCK // 2, 2 * attention.BLOCK + 37])
@pytest.mark.parametrize("form", ["cpu", "accelerator"])
def test_causal_attention_by_blocks_is_causal_attention(T, form):
  """Causal self-attention by blocks of queries, each over the keys up to its last query (no score
  above the diagonal's blocks is computed), with its own backward pass (cpu) or XLA's kernel and
  autodiff (accelerator): the result and its gradients are those of the full masked T x T
  computation, also when T is not a multiple of the block or under one block (and the CPU's in
  bfloat16 too)."""
  q, k, v = _qkv(B=2, T=T, S=T, H=2, K=8)
  cotangent = jax.random.normal(jax.random.key(3), q.shape)
  full = jax.jit(lambda q, k, v: layers.attend(q, k, v, layers.causal_mask(T), "einsum"))
  blocked = jax.jit(
    attention.causal_cpu if form == "cpu" else (lambda q, k, v: attention.causal_by_blocks(q, k, v, "xla"))
  )
  out_full, vjp_full = jax.vjp(full, q, k, v)
  out_blocked, vjp_blocked = jax.vjp(blocked, q, k, v)
  np.testing.assert_allclose(out_blocked, out_full, atol=1e-5)
  for grad_blocked, grad_full in zip(vjp_blocked(cotangent), vjp_full(cotangent)):
    np.testing.assert_allclose(grad_blocked, grad_full, atol=1e-4)
  # The future does not leak: changing the last token's key and value changes only its own output.
  changed = blocked(q, k.at[:, -1].set(5.0), v.at[:, -1].set(-5.0))
  np.testing.assert_allclose(changed[:, :-1], out_blocked[:, :-1], atol=1e-6)
  assert not np.allclose(changed[:, -1], out_blocked[:, -1])
  if form != "cpu":
    return
  np.testing.assert_allclose(attention.causal_cpu(q, k, v), out_blocked, atol=1e-6)  # and op by op, uncompiled
  # bfloat16 in, bfloat16 out and gradients (the backward pass written here), close to float32's.
  bf16 = lambda x: x.astype(jnp.bfloat16)
  out_bf16, vjp_bf16 = jax.vjp(blocked, bf16(q), bf16(k), bf16(v))
  assert out_bf16.dtype == jnp.bfloat16
  np.testing.assert_allclose(out_bf16.astype(jnp.float32), out_full, atol=5e-2)
  for grad_bf16, grad_full in zip(vjp_bf16(bf16(cotangent)), vjp_full(cotangent)):
    assert grad_bf16.dtype == jnp.bfloat16
    np.testing.assert_allclose(grad_bf16.astype(jnp.float32), grad_full, atol=1e-1)


@pytest.mark.slow
def test_attend_dispatches_causal_self_attention_by_kernels():
  """layers.attend with no mask: the "cpu" forms run kernels.attention.causal_cpu (its gradients to
  the bit), "accelerator" causal_by_blocks, "reference" the einsum of layers/attention.py whatever the
  implementation; all agree to rounding."""
  q, k, v = _qkv(B=2, T=2 * attention.BLOCK, S=2 * attention.BLOCK, H=2, K=8)
  cotangent = jax.random.normal(jax.random.key(3), q.shape)
  grads = lambda f: jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * cotangent), argnums=(0, 1, 2)))(q, k, v)
  by_form = {form: grads(lambda q, k, v, form=form: layers.attend(q, k, v, None, "xla", form)) for form in FORMS}
  reference = grads(lambda q, k, v: layers.mix(layers.dot_product_scores(None, None, q, k, None), v, None))
  for got, want in zip(by_form["reference"], reference):
    np.testing.assert_array_equal(got, want)
  for got, want in zip(by_form["cpu"], grads(attention.causal_cpu)):
    np.testing.assert_array_equal(got, want)
  for got, want in zip(by_form["accelerator"], grads(lambda q, k, v: attention.causal_by_blocks(q, k, v, "xla"))):
    np.testing.assert_array_equal(got, want)
  for form in ("cpu", "accelerator"):
    for got, want in zip(by_form[form], by_form["reference"]):
      np.testing.assert_allclose(got, want, atol=1e-4)
  assert any(not np.array_equal(a, b) for a, b in zip(by_form["cpu"], by_form["reference"]))  # other paths


@pytest.mark.slow
@pytest.mark.parametrize("B, G", [(1, 2), (3, 2), (1, 1), (3, 1)])
def test_one_token_over_a_kv_cache_equals_the_reference(B, G):
  """kernels.attention.one_token_cpu (multiply-and-sum for one sequence, einsums for several) =
  layers.attend_cached's reference, over a cache whose last slots are masked; with G kv heads for the
  H = 2 query heads (G = 1: multi-query attention, the cache read as it is, not repeated)."""
  S, H, K = 9, 2, 4
  q, k, v = _qkv(B=B, T=1, S=S, H=H, K=K, seed=4)
  k, v = k[:, :, :G], v[:, :, :G]
  k_BxHxKxS, v_BxHxSxK = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
  mask_Bx1xS = jnp.broadcast_to(jnp.arange(S) < 6, (B, 1, S))
  want = layers.attend_cached(q, k_BxHxKxS, v_BxHxSxK, mask_Bx1xS, "reference")
  got = jax.jit(attention.one_token_cpu)(q, k_BxHxKxS, v_BxHxSxK, mask_Bx1xS)
  chex.assert_shape(got, (B, 1, H, K))
  np.testing.assert_allclose(got, want, atol=1e-6)
  np.testing.assert_allclose(layers.attend_cached(q, k_BxHxKxS, v_BxHxSxK, mask_Bx1xS, "cpu"), got, atol=1e-6)


# --- the decoding step's tied head, argmax and draw --------------------------------------------

CFG = GPTConfig().replace(vocab_size=96, max_len=48, num_layers=2, num_heads=4, d_model=32, tie_embeddings=False)
PROMPTS = [[5, 17, 3, 80, 41, 2, 9], [60], list(range(10, 31)), [33, 34]]


def _params(cfg, scale=10.0, seed=0):
  """Random weights, scaled up so that greedy paths are varied (as tests/test_sampling.py's)."""
  params = compiled_init(GPT(cfg), np.zeros((1, 8), np.int32), seed=seed)
  return jax.tree_util.tree_map_with_path(
    lambda path, x: x if "ln" in jax.tree_util.keystr(path) else jnp.asarray(np.asarray(x) * scale), params
  )


@pytest.mark.parametrize(
  "B,V",
  [(1, 96), (4, 96), (20, 96), (1, 2**17 + 1), (4, 2**17 + 1)],
  ids=["one", "few", "vocab_major", "one_streamed", "vocab_major_streamed"],
)
def test_tied_head_forms_equal_the_embeddings_attend(B, V):
  """kernels.decode_head.tied_head_cpu in each of its forms (the embedding's rows; a D x V copy;
  vocabulary-major from VOCAB_MAJOR_MIN_BATCH rows, or from 2 with a head of more than
  STREAMED_HEAD_BYTES) = x @ embeddingᵀ."""
  D = 32
  assert decode_head.streamed_head(V, D, "float32") == (V > 2**17)
  assert decode_head.vocab_major(B, V, D, "float32") == (B >= (2 if V > 2**17 else 16))
  embedding_VxD = jax.random.normal(jax.random.key(0), (V, D))
  x_Bx1xD = jax.random.normal(jax.random.key(1), (B, 1, D))
  got = jax.jit(decode_head.tied_head_cpu)(embedding_VxD, x_Bx1xD)
  np.testing.assert_allclose(got, jnp.einsum("btd,vd->btv", x_Bx1xD, embedding_VxD), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
  "prompts,vocab",
  [
    (PROMPTS, 96),
    (PROMPTS[:1], 96),
    (PROMPTS * 5, 96),
    (PROMPTS * 5, 8192),
    (PROMPTS[:1], 2**17 + 1),
    (PROMPTS, 2**17 + 1),
  ],
  ids=["batch", "one", "vocab_major", "vocab_major_large", "one_streamed_head", "vocab_major_streamed_head"],
)
@pytest.mark.slow
def test_greedy_decoding_with_the_cpu_kernels_makes_the_reference_tokens(prompts, vocab):
  """The whole sampler with the CPU's forms (the tied head in each form, the blocked and
  vocabulary-major argmax, the matrix-vector attention, XLA:CPU's options) makes the reference's tokens."""
  cfg = CFG.replace(tie_embeddings=True, vocab_size=vocab)
  params = _params(cfg, scale=20.0, seed=1)  # the head reads the embedding: larger weights to vary the paths
  run = lambda form: sampler.generate(
    GPT(cfg.replace(kernels=form)), params, prompts, max_new_tokens=20, sampling=Sampling(temperature=0)
  )
  got = run("cpu")
  assert got == run("reference")
  assert all(len(set(g)) > 3 for g in got)  # not degenerate


def test_one_sequence_reads_a_head_larger_than_the_cache_through_its_transposed_copy():
  """At batch 1, a head of 16 MiB keeps the embedding's rows; one entry more (streamed from memory at
  every step) is read through a D x V copy of the embedding, made once before the decoding loop (XLA
  laid a D x V transpose out as the embedding's own bytes and copied those into rows: two copies)."""
  D = CFG.block.d_model
  for vocab, copied in ((2**17, False), (2**17 + 1, True)):
    model = GPT(CFG.replace(tie_embeddings=True, vocab_size=vocab, kernels="cpu"))
    params = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]))

    def steps(params, cache, tokens_Bx1):
      def step(i, carry):
        logits_Bx1xV, variables = model.apply(
          {"params": params, "cache": carry[0]}, carry[1], decode=True, mutable=["cache"]
        )
        return variables["cache"], jnp.argmax(logits_Bx1xV, axis=-1).astype(jnp.int32)

      return jax.lax.fori_loop(0, 2, step, (cache, tokens_Bx1))

    lowered = jax.jit(steps).lower(params, sampler.init_cache(model, 1, 8), jnp.zeros((1, 1), jnp.int32))
    assert (f"tensor<{D}x{vocab}xf32>" in lowered.as_text()) == copied
  program = lowered.compile().as_text().split("ENTRY")[1]  # the streamed head's decoding loop (the last)
  assert len(re.findall(rf"= f32\[{D},(?:1,)?{vocab}\]\S* (?:fusion|copy)\(", program)) == 1


def _vocab_major(x_BxV):
  """x as the tied head hands vocabulary-major logits over: the transpose of a V x B array."""
  return np.asarray(x_BxV).T.copy().T


# V = 300 and the prime 4099: one maximum over all entries; 50,257 and 8,192: in blocks of 29 and 128.
@pytest.mark.parametrize("vocab", [300, 4099, 50257, 8192])
@pytest.mark.parametrize("vocab_major", [False, True])
@pytest.mark.parametrize("batch", [1, 3, 20])
def test_argmax_is_the_first_index_of_the_maximum(batch, vocab_major, vocab):
  """kernels.argmax in each of its forms is jnp.argmax: ties go to the first index."""
  assert argmax.block_size(vocab) == {300: None, 4099: None, 50257: 29, 8192: 128}[vocab]
  normal_BxV = np.random.default_rng(batch).standard_normal((batch, vocab), np.float32)
  x_BxV = np.round(normal_BxV * (2 if vocab < 1000 else 1.5))
  x_BxV = _vocab_major(x_BxV) if vocab_major else x_BxV
  got = jax.jit(lambda x: argmax.argmax(x, vocab_major))(x_BxV)
  np.testing.assert_array_equal(got, np.argmax(x_BxV, axis=-1))  # NumPy's argmax: the first index too
  assert (np.sum(x_BxV == x_BxV.max(-1, keepdims=True), -1) > 1).any() or batch == 1  # ties were there


@pytest.mark.parametrize("vocab_major", [False, True])
def test_argmax_in_blocks_takes_the_first_maximum_across_and_within_blocks(vocab_major):
  """GPT-2's vocabulary, reduced in blocks of 29: the first block holding the maximum, then the first
  entry of that block that equals it, wherever the maxima lie."""
  V = 50257
  x_BxV = np.zeros((7, V), np.float32)
  x_BxV[1, V - 1] = 1  # the last entry, alone
  x_BxV[2, [29 * 5 + 3, 29 * 900]] = 1  # two blocks: the first one's
  x_BxV[3, [29 * 7 + 20, 29 * 7 + 10]] = 1  # one block, two entries: the first
  x_BxV[4] = -np.inf
  x_BxV[4, 12345] = -3.0  # one finite entry
  x_BxV[5, [0, V - 1]] = 2  # the first and the last
  x_BxV[6] = np.arange(V) % 29 == 28  # the last entry of every block
  x_BxV = _vocab_major(x_BxV) if vocab_major else x_BxV
  got = jax.jit(lambda x: argmax.argmax(x, vocab_major))(x_BxV)
  np.testing.assert_array_equal(got, [0, V - 1, 29 * 5 + 3, 29 * 7 + 10, 12345, 0, 28])


@pytest.mark.parametrize("block", [8, 256])
def test_two_level_inverse_cdf_draws_the_reference_token(block):
  """kernels.draw.inverse_cdf against float64 cumulative probabilities and against the reference
  (sampling.inverse_cdf, one cumulative sum): over 7 blocks of 8 entries (the last one padded) and
  one block of 256, the first token whose cumulative probability exceeds u; never an excluded (-inf)
  token, also at u = 0 and at the largest float32 below 1."""
  V = 50
  logits_BxV = np.array(jax.random.normal(jax.random.key(0), (3, V)) * 2, np.float32)
  logits_BxV[0, :9] = -np.inf  # the first block and one more entry excluded
  logits_BxV[1, 20:] = -np.inf  # the last blocks excluded
  logits_BxV[2, ::3] = -np.inf  # excluded entries inside every block
  u_M = np.concatenate([(np.arange(2000) + 0.5) / 2000, [0.0, np.nextafter(np.float32(1), np.float32(0))]])
  each_u = lambda f: jax.jit(lambda l, u: jax.vmap(lambda u: f(l, jnp.full((3,), u)))(u))
  got_MxB = np.asarray(each_u(lambda l, u: draw.inverse_cdf(l, u, block=block))(logits_BxV, jnp.float32(u_M)))
  reference_MxB = np.asarray(each_u(sampler.inverse_cdf)(logits_BxV, jnp.float32(u_M)))
  for b in range(3):
    p_V = np.exp(logits_BxV[b].astype(np.float64) - logits_BxV[b].max())
    cum_V = np.cumsum(p_V / p_V.sum())
    want_M = np.minimum(np.searchsorted(cum_V, u_M, side="right"), np.flatnonzero(p_V)[-1])
    near_edge_M = np.abs(cum_V[want_M] - u_M) < 1e-5
    for drawn_M in (got_MxB[:, b], reference_MxB[:, b]):
      assert ((drawn_M == want_M) | near_edge_M).all()
      assert np.isfinite(logits_BxV[b, drawn_M]).all()
      assert drawn_M[-2] == np.flatnonzero(p_V)[0]  # u = 0: the first token that can be drawn
    assert (got_MxB[:, b] == reference_MxB[:, b]).mean() > 0.99
  assert len(set(got_MxB[:, 2].tolist())) > 20  # draws spread over the row's tokens


@pytest.mark.slow
class SampleLogitsTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_every_form_draws_the_reference_tokens(self):
    """sampling.sample_logits with each kernels form, jitted or not: the same tokens."""
    logits_BxV = jax.random.normal(jax.random.key(0), (4, 5000)) * 3
    for how in (Sampling(temperature=0), Sampling(temperature=0.7, top_k=5), Sampling(top_p=0.8), Sampling()):
      reference = jax.jit(lambda x, key, how=how: sampler.sample_logits(x, key, how, "reference"))(
        logits_BxV, jax.random.key(3)
      )
      for form in ("cpu", "accelerator"):
        tokens_B = self.variant(lambda x, key, how=how, form=form: sampler.sample_logits(x, key, how, form))(
          logits_BxV, jax.random.key(3)
        )
        chex.assert_shape(tokens_B, (4,))
        np.testing.assert_array_equal(tokens_B, reference)


# --- decoding on threads -----------------------------------------------------------------------


def test_parts_one_per_thread_each_of_enough_prompts():
  D = CFG.block.d_model
  parts = lambda vocab, b, threads: decode_threads.parts(vocab, D, "float32", b, threads)
  small_vocab, large_vocab = CFG.vocab_size, argmax.LARGE_VOCAB
  assert [parts(small_vocab, b, 2) for b in (1, 4, 7, 8, 9, 32)] == [1, 1, 1, 2, 2, 2]
  # A large vocabulary's parts keep the vocabulary-major head (16 rows or more); a head larger than
  # the cache, which each part reads from memory, gets 32 or more.
  assert [parts(large_vocab, b, 2) for b in (8, 16, 31, 32)] == [1, 1, 1, 2]
  in_cache = decode_head.STREAMED_HEAD_BYTES // (4 * D)  # exactly 16 MiB
  assert [parts(in_cache, b, 2) for b in (16, 32)] == [1, 2]
  assert [parts(in_cache + 1, b, 2) for b in (16, 32, 63, 64)] == [1, 1, 1, 2]
  assert [parts(small_vocab, b, 16) for b in (8, 32, 128)] == [2, 8, 16]
  assert parts(small_vocab, 32, 1) == 1


def test_decoders_run_on_one_thread_per_core_of_a_cpu_device(monkeypatch):
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
  assert decode_threads.cpu_threads(jax.devices("cpu")[:1]) == 3  # the CPU's, also where a chip is the default
  assert decode_threads.on_threads(lambda x: x * x, [], 3) == []
  assert decode_threads.on_threads(lambda x: x * x, list(range(6)), 3) == [0, 1, 4, 9, 16, 25]  # in order
  # Only the CPU's kernels split a batch; the reference decodes it in one call.
  assert sampler.split_parts(GPT(CFG.replace(kernels="cpu")), 32, None) == 3
  assert sampler.split_parts(GPT(CFG.replace(kernels="reference")), 32, None) == 1
  reference = sampler.jitted_sampler(GPT(CFG.replace(kernels="reference")))
  assert sampler.jitted_sampler(GPT(CFG.replace(kernels="cpu"))) is not reference  # XLA:CPU's options


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [Sampling(temperature=0), Sampling(temperature=0.9, top_k=20)])
def test_a_batch_split_over_cpu_cores_makes_the_tokens_of_the_whole_batch(sampling, monkeypatch):
  """`generate` with the CPU's kernels decodes parts of a batch on threads of their own
  (`split_parts`): 7 prompts in 3 parts (padded to 9: 3 calls of one program for 3 rows) make the
  tokens of the reference's one call over all of them, sampled ones too (a row draws by its index in
  the whole batch), each stopping on its own."""
  params = _params(CFG)
  prompts = PROMPTS + [[7, 8, 9], [1] * 12, [90]]
  run = lambda form, stop=None: sampler.generate(
    GPT(CFG.replace(kernels=form)), params, prompts, max_new_tokens=12, sampling=sampling, seed=3, stop_id=stop
  )
  stop = run("reference")[0][4]  # a token row 0 makes at step 4
  whole = run("reference", stop)
  calls = []
  compiled = sampler.jitted_sampler

  def recording_sampler(model):
    def call(params, prompt_BxP, valid_BxP, rng, first_row, **kwargs):
      calls.append((first_row, len(prompt_BxP), threading.get_ident()))
      return compiled(model)(params, prompt_BxP, valid_BxP, rng, first_row, **kwargs)

    return call

  monkeypatch.setattr(sampler, "jitted_sampler", recording_sampler)
  monkeypatch.setattr(decode_threads, "parts", lambda *args: 3)
  assert run("cpu", stop) == whole
  assert sorted((first, rows) for first, rows, _ in calls) == [(0, 3), (3, 3), (6, 3)]
  assert len({thread for _, _, thread in calls}) > 1
  assert len({tuple(w) for w in whole}) == len(prompts) and {len(w) < 12 for w in whole} == {True, False}


# --- the LM loss -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("form", FORMS)
def test_next_token_nll_and_its_gradient_equal_optax(dtype, form):
  """The LM loss in each form (the accelerators': kernels.lm_loss, softmax - one-hot in one pass) =
  autodiff of optax's cross-entropy on the float32 logits; the gradient comes back in the logits' dtype."""
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  logits = (4 * jax.random.normal(k1, (3, 5, 97))).astype(dtype)
  targets, weights = jax.random.randint(k2, (3, 5), 0, 97), jax.random.normal(k3, (3, 5))
  reference = lambda x: (
    optax.softmax_cross_entropy_with_integer_labels(x.astype(jnp.float32), targets) * weights
  ).sum()
  ours = lambda x: (next_token_nll(x, targets, form) * weights).sum()
  np.testing.assert_allclose(ours(logits), reference(logits), rtol=1e-6)
  grad = jax.grad(ours)(logits)
  assert grad.dtype == logits.dtype
  np.testing.assert_allclose(
    np.asarray(grad, np.float32), np.asarray(jax.grad(reference)(logits), np.float32), atol=1e-6
  )
  direct = jax.grad(lambda x: (lm_loss.next_token_nll(x, targets) * weights).sum())(logits)
  np.testing.assert_allclose(np.asarray(direct, np.float32), np.asarray(grad, np.float32), atol=1e-6)


# --- whole models ------------------------------------------------------------------------------


@pytest.mark.slow
class WholeModelTest(chex.TestCase):
  # Compiled only: each kernel runs eagerly in its own test above (ProjectionTest, SampleLogitsTest); a
  # whole GPT's forward and backward, op by op in three forms, is hundreds of compiles and ~15 s.
  @chex.variants(with_jit=True)
  def test_gpt_logits_and_gradients_are_the_references_in_every_form(self):
    """A GPT with T = 2 blocks + 5 tokens (every dispatch point: projections, causal attention by
    blocks, the loss): the same logits and parameter gradients whatever config.model.kernels says."""
    cfg = GPTConfig().replace(vocab_size=50, max_len=160, num_layers=2, num_heads=2, d_model=16)
    tokens = jax.random.randint(jax.random.key(0), (2, 2 * attention.BLOCK + 5), 0, 50)
    params = nn.unbox(GPT(cfg).init(jax.random.key(1), tokens[:, :8])["params"])

    def loss_and_grads(form):
      model = GPT(cfg.replace(kernels=form))
      loss = lambda p: next_token_nll(model.apply({"params": p}, tokens[:, :-1]), tokens[:, 1:], form).mean()
      return self.variant(jax.value_and_grad(loss))(params)

    reference = loss_and_grads("reference")
    chex.assert_tree_all_finite(reference)
    for form in ("cpu", "accelerator"):
      chex.assert_trees_all_close(loss_and_grads(form), reference, atol=2e-5, rtol=1e-4)

  def test_translation_is_the_references_in_every_form(self):
    """The encoder-decoder (projections, its head, cross-attention) decodes the same greedy tokens."""
    from transformer.generation import beam_search

    cfg = seq2seq.Seq2SeqConfig().replace(
      vocab_size=40, max_len=24, num_layers=2, num_heads=2, d_model=16, d_mlp=32, dropout_rate=0.0
    )
    source = jnp.ones((1, 6), jnp.int32)
    params = nn.unbox(seq2seq.Transformer(cfg).init(jax.random.key(0), source, source)["params"])
    params = jax.tree.map(lambda x: x * 4, params)
    sources = [[3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [13]]
    run = lambda form: beam_search.translate_ids(
      seq2seq.Transformer(cfg.replace(kernels=form)), params, sources, eos_id=0, beam_size=2, max_len=10
    )
    assert run("cpu") == run("accelerator") == run("reference")


def test_the_accelerators_loss_backward_feeds_bf16_gradients_to_the_head_and_scatters_nothing():
  """The levanter recipe for the cross-entropy's backward on accelerators: the gradient of the logits
  reaches the head's two backward products in bfloat16 (float32 there would force FP32/TF32
  products), and the label term is a one-hot compare, not a scatter into B x T x V (the only
  scatter left is the position table's, of its own size)."""
  import flax.linen as nn

  from transformer.models.gpt import GPT, GPTConfig
  from transformer.tasks.lm import lm_loss

  V = 96
  cfg = GPTConfig().replace(
    vocab_size=V, max_len=16, num_layers=1, num_heads=2, d_model=32, dtype="bfloat16", kernels="accelerator"
  )
  model = GPT(cfg)
  params = nn.unbox(
    jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  )  # a trace needs shapes only
  batch = jax.random.randint(jax.random.key(1), (2, 9), 0, V)
  jaxpr = jax.make_jaxpr(jax.grad(lambda p: lm_loss(model, p, batch, jax.random.key(2), False)[0]))(params).jaxpr
  vocab_products = [
    [str(v.aval.dtype) for v in e.invars]
    for e in jaxpr.eqns
    if e.primitive.name == "dot_general" and any(V in v.aval.shape for v in e.invars)
  ]
  assert len(vocab_products) == 3 and all(dtypes == ["bfloat16", "bfloat16"] for dtypes in vocab_products)
  scatters = [e.invars[0].aval.shape for e in jaxpr.eqns if "scatter" in e.primitive.name]
  assert all(V not in shape for shape in scatters) and scatters == [(16, 32)]
