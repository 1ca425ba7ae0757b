"""Sampling text from a GPT: a KV-cache sampler compiled once, for batches of prompts.

    >>> sampling = Sampling(temperature=0.8, top_p=0.95)
    >>> new_ids = generate(model, params, [tok.encode("ROMEO:"), tok.encode("To be")],
    ...                    max_new_tokens=100, sampling=sampling, seed=0, stop_id=tok.eot_id)

How `generate` works:
  1. The prompts are left-padded to one length P (rounded up, so few shapes compile) and marked
     valid/padding; padding gets no position and is never attended to (`GPT(valid_BxT=...)`), so a
     prompt's result does not depend on the prompts around it.
  2. One forward pass over the prompts fills a KV cache (prefill).
  3. A `lax.while_loop` then feeds back one token per step (one compiled program, no Python per
     token) until every sequence has emitted `stop_id` or `max_new_tokens` are made. The cache
     grows in a few phases up to P + max_new_tokens slots (`decode_lengths`): each step attends
     over the slots of its phase, not over every slot that will ever be written.
  On a CPU a large enough batch is split into one part per core, each decoded by its own thread
  (`cpu_parts`); the tokens are those of the whole batch.

Sampling (HF's order): logits / temperature -> keep the top_k -> keep the nucleus (the fewest
tokens whose probability reaches top_p) -> draw. **temperature=0 means greedy** (argmax; top_k and
top_p are then irrelevant). Draws for row b at step i use the key fold_in(fold_in(seed, i), b): a
prompt gives the same sample alone or in a batch, in the same row.

Lengths: every prompt plus max_new_tokens must fit in the context (the learned position table),
or `generate` raises; with `sliding_window=True` longer generations instead re-run the model over
the last context_length tokens for each new one (`generate_sliding`: correct but slow, no cache).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Iterable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from transformer.errors import ConfigError, TokenizerError
from transformer.generation.common import (batch_rows, check_token_lists, cpu_threads, empty_cache, grow_cache,
                                           on_threads, pad_rows, put_on_mesh, round_up, until_stop)
from transformer.models import gpt

PROMPT_BUCKET = 16  # prompts are padded to a multiple of this: few compiled shapes
DECODE_PHASE = 32  # the fewest new tokens a phase of the decode loop makes (see `decode_lengths`)
MAX_DECODE_PHASES = 4  # each phase compiles its own loop body


@dataclasses.dataclass(frozen=True)
class Sampling:
  temperature: float = 1.0  # 0: greedy (argmax)
  top_k: int = 0  # keep the k most likely tokens; 0: all
  top_p: float = 1.0  # keep the fewest tokens whose probability sums to >= top_p; 1: all

  def check(self) -> "Sampling":
    if not self.temperature >= 0:
      raise ConfigError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
    if self.top_k < 0:
      raise ConfigError(f"top_k must be >= 0 (0 means no limit), got {self.top_k}")
    if not 0 < self.top_p <= 1:
      raise ConfigError(f"top_p must be in (0, 1] (1 means no limit), got {self.top_p}")
    return self


def filter_logits(logits_BxV: jax.Array, sampling: Sampling) -> jax.Array:
  """logits / temperature with the tokens top_k and top_p exclude set to -inf (temperature > 0)."""
  logits_BxV = logits_BxV.astype(jnp.float32) / sampling.temperature
  if sampling.top_k and sampling.top_k < logits_BxV.shape[-1]:
    kth_Bx1 = jax.lax.top_k(logits_BxV, sampling.top_k)[0][:, -1:]
    logits_BxV = jnp.where(logits_BxV < kth_Bx1, -jnp.inf, logits_BxV)
  if sampling.top_p < 1:
    sorted_BxV = -jnp.sort(-logits_BxV, axis=-1)  # descending
    probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
    # Keep a token if the tokens more likely than it hold less than top_p: the first always stays.
    keep_B = jnp.sum(jnp.cumsum(probs_BxV, axis=-1) - probs_BxV < sampling.top_p, axis=-1)
    threshold_Bx1 = jnp.take_along_axis(sorted_BxV, keep_B[:, None] - 1, axis=-1)
    logits_BxV = jnp.where(logits_BxV < threshold_Bx1, -jnp.inf, logits_BxV)
  return logits_BxV


def argmax(x_BxV: jax.Array, vocab_major: bool = False) -> jax.Array:
  """jnp.argmax over the last axis (the first index of the maximum), fast on XLA:CPU too.

  For several rows it is a max and then a min over the indices that reach it, for a large vocabulary
  by blocks (`argmax_block`): XLA:CPU's argmax (a variadic reduce) was 3-5x slower there, a third of
  a decoding step at a 50k vocabulary. For one row jnp.argmax fuses well with the head's
  matrix-vector product and the max+min does not.
  `vocab_major`: x_BxV is the transpose of a V x B array (GPT.vocab_major_logits); on a CPU the
  reductions then run down its columns, the two transposes cancelling."""
  if x_BxV.shape[0] == 1:
    return jnp.argmax(x_BxV, axis=-1).astype(jnp.int32)
  if vocab_major:
    return jax.lax.platform_dependent(x_BxV.T, cpu=lambda x_VxB: _first_max_index(x_VxB, axis=0),
                                      default=lambda x_VxB: _first_max_index(x_VxB.T, axis=1))
  return _first_max_index(x_BxV, axis=1)


def _first_max_index(x: jax.Array, axis: int) -> jax.Array:
  V = x.shape[axis]
  # Indices as float32 (exact below 2^24) keep both reductions floating-point maxima and minima,
  # which XLA:CPU vectorises down columns; int32 otherwise.
  dtype = jnp.float32 if V < 2**24 else jnp.int32
  C = argmax_block(V)
  if C is None:
    return _first_index(x == jnp.max(x, axis=axis, keepdims=True), axis, dtype).reshape(-1)
  # In blocks of C entries: the blocks' maxima (the one pass over x), the first block that holds the
  # maximum, then the first entry of that block that equals it. The maximum over all of x and then
  # the first index that holds it took two more passes (a select, a reduction) over x: at cpu-small's
  # batch 32, 6 MB and ~0.3 ms of a ~5.5 ms decoding step.
  blocks, entries = axis, axis + 1  # V x B -> N x C x B; B x V -> B x N x C
  x = x.reshape(x.shape[:axis] + (V // C, C) + x.shape[axis + 1:])
  max_blocks = jnp.max(x, axis=entries, keepdims=True)
  max_all = jnp.max(max_blocks, axis=blocks, keepdims=True)
  block = _first_index(max_blocks == max_all, blocks, dtype)
  entry = _first_index(jnp.take_along_axis(x, block, axis=blocks) == max_all, entries, dtype)
  return (block * C + entry).reshape(-1)


def _first_index(hits: jax.Array, axis: int, dtype) -> jax.Array:
  """The first index along `axis` that is True (the last index where none is), kept as a size-1 axis."""
  n = hits.shape[axis]
  index = jnp.min(jnp.where(hits, jax.lax.broadcasted_iota(dtype, hits.shape, axis), n - 1), axis=axis, keepdims=True)
  return index.astype(jnp.int32)


# From this vocabulary size, the tied head's product and the argmax over its logits are most of a
# decoding step: `argmax` reduces in blocks, and a batch split over a CPU's cores gets larger parts (`cpu_parts`).
LARGE_VOCAB = 4096


def argmax_block(V: int) -> int | None:
  """The block size of `argmax` over V entries (None: no blocks): for a large vocabulary, the divisor
  of V nearest sqrt(V) that leaves at least 16 blocks of at least 16 (GPT-2's 50,257 = 1,733 x 29:
  blocks of 29); none for a V with no such divisor, e.g. a prime."""
  if V < LARGE_VOCAB:
    return None
  divisors = [c for c in range(16, V // 16 + 1) if V % c == 0]
  return min(divisors, key=lambda c: abs(math.log(c / math.sqrt(V))), default=None)


def sample_logits(logits_BxV: jax.Array, rng: jax.Array, sampling: Sampling, vocab_major: bool = False,
                  first_row: jax.Array | int = 0) -> jax.Array:
  """One token per row; row b draws with the key fold_in(rng, first_row + b) (`first_row`: where
  these rows start in the whole batch). `vocab_major`: see `argmax`."""
  if sampling.temperature == 0:
    return argmax(logits_BxV, vocab_major)
  logits_BxV = filter_logits(logits_BxV, sampling)
  rows_B = first_row + jnp.arange(logits_BxV.shape[0])
  u_B = jax.vmap(lambda b: jax.random.uniform(jax.random.fold_in(rng, b)))(rows_B)
  return inverse_cdf(logits_BxV, u_B)


SAMPLE_BLOCK = 256  # entries of the vocabulary per block of `inverse_cdf`'s first level


def inverse_cdf(logits_BxV: jax.Array, u_B: jax.Array, block: int = SAMPLE_BLOCK) -> jax.Array:
  """A draw from softmax(logits) per row, given one uniform number u in [0, 1) per row: the first
  token whose cumulative probability exceeds u. One random number a row, where Gumbel noise (jax's
  `categorical`) needs one per vocabulary entry: on a CPU, threefry's bits for 32 x 50,257 entries
  took ~5 ms, most of a decoding step.

  In two levels, so that no cumulative sum runs over the whole vocabulary: the weights exp(logits -
  max) summed in blocks of `block` entries, the block where the cumulative weight passes u * total,
  then the entry inside it. A token of weight 0 (excluded by top-k or top-p) is never drawn, also
  where float rounding puts u * total on a block's or an entry's edge."""
  B, V = logits_BxV.shape
  C = min(block, V)
  N = -(-V // C)
  w_BxV = jnp.exp(logits_BxV - jnp.max(logits_BxV, axis=-1, keepdims=True))  # -inf -> 0; the max -> 1
  w_BxNxC = jnp.pad(w_BxV, ((0, 0), (0, N * C - V))).reshape(B, N, C)
  block_BxN = w_BxNxC.sum(axis=-1)
  cum_BxN = jnp.cumsum(block_BxN, axis=-1)
  target_B = u_B * cum_BxN[:, -1]
  # The first block whose cumulative weight exceeds the target has weight > 0; rounding may put the
  # count past the last such block (or the target below the first entry): hence the clip.
  j_B = _clip_to_nonzero(jnp.sum(cum_BxN <= target_B[:, None], axis=-1), block_BxN)
  take = lambda x, i: jnp.take_along_axis(x, i[:, None], axis=1)[:, 0]
  w_BxC = jnp.take_along_axis(w_BxNxC, j_B[:, None, None], axis=1)[:, 0]
  rest_B = target_B - (take(cum_BxN, j_B) - take(block_BxN, j_B))
  k_B = _clip_to_nonzero(jnp.sum(jnp.cumsum(w_BxC, axis=-1) <= rest_B[:, None], axis=-1), w_BxC)
  return (j_B * C + k_B).astype(jnp.int32)


def _clip_to_nonzero(index_B: jax.Array, weights_BxN: jax.Array) -> jax.Array:
  """index_B clipped to the span between each row's first and last entry of positive weight."""
  positive_BxN = weights_BxN > 0
  N = weights_BxN.shape[-1]
  first_B = jnp.argmax(positive_BxN, axis=-1)
  last_B = N - 1 - jnp.argmax(positive_BxN[:, ::-1], axis=-1)
  return jnp.clip(index_B, first_B, last_B)


def _vocab_major(model, batch_size: int) -> bool:
  """Whether the model's decoding step hands over vocabulary-major logits (GPT.vocab_major_logits);
  a model without that method (the LSTM) hands over rows."""
  return hasattr(model, "vocab_major_logits") and model.vocab_major_logits(batch_size)


def init_cache(model, batch_size: int, length: int):
  """An empty GPT KV cache for `batch_size` sequences of `length` tokens."""
  return empty_cache(lambda: model.init(jax.random.key(0), jnp.zeros((batch_size, length), jnp.int32), decode=True))


def decode_lengths(prompt_len: int, max_new_tokens: int, phase_tokens: int = DECODE_PHASE) -> list[int]:
  """The cache lengths the decode loop grows through, the last P + max_new_tokens. A step attends over
  every slot of the cache (its shape is static), so one cache of the final length makes the early
  steps read slots that hold nothing yet. Up to MAX_DECODE_PHASES phases of at least `phase_tokens`
  tokens: main-job shape (32 + 96 tokens) attends over 64, 96, 128 slots instead of 128 throughout."""
  phases = max(1, min(MAX_DECODE_PHASES, max_new_tokens // phase_tokens))
  return [prompt_len + -(-max_new_tokens * j // phases) for j in range(1, phases + 1)]


# Streaming: the compiled program calls `_stream` on the host with each step's tokens; it forwards
# them to the callback of the `generate` call running now. (A fixed function, so that streaming
# calls share one compiled program; one streaming `generate` at a time per process.)
_stream_target: list[Callable] = []


def _stream(step, tokens_B):
  _stream_target[0](int(step), np.asarray(tokens_B))


def sample_padded(params, prompt_BxP, valid_BxP, rng, first_row=0, *, model, max_new_tokens: int,
                  sampling: Sampling, stop_id: int | None = None, rules: tuple = (), stream: bool = False,
                  decode_phase: int = DECODE_PHASE):
  """The sampler (`jitted_sampler` compiles it): left-padded prompts (B, P) -> new tokens
  (B, max_new_tokens). `first_row`: the index of these prompts' first row in the whole batch, which
  a part of a split batch draws its random numbers by (`sample_logits`). `decode_phase`: see
  `decode_lengths`.

  After a sequence emits `stop_id` its remaining entries are `stop_id`. With `stream`, each step's
  tokens go to the host as they are made (see `generate`'s `on_token`)."""
  B, P = prompt_BxP.shape
  N = max_new_tokens
  with nn.logical_axis_rules(rules):
    def forward(cache, tokens_BxT, valid_BxT):
      logits_BxTxV, variables = model.apply({"params": params, "cache": cache}, tokens_BxT, valid_BxT=valid_BxT,
                                            decode=True, mutable=["cache"])
      return logits_BxTxV[:, -1], variables["cache"]

    vocab_major = _vocab_major(model, B)

    def emit(i, logits_BxV, done_B, tokens_BxN):
      token_B = sample_logits(logits_BxV, jax.random.fold_in(rng, i), sampling, vocab_major, first_row)
      if stop_id is not None:
        token_B = jnp.where(done_B, stop_id, token_B)
        done_B = done_B | (token_B == stop_id)
      if stream:
        io_callback(_stream, None, i, token_B, ordered=True)
      return token_B, done_B, tokens_BxN.at[:, i].set(token_B)

    lengths = decode_lengths(P, N, decode_phase)
    logits_BxV, cache = forward(init_cache(model, B, lengths[0]), prompt_BxP, valid_BxP)
    token_B, done_B, tokens_BxN = emit(0, logits_BxV, jnp.zeros((B,), bool), jnp.zeros((B, N), jnp.int32))

    def step(carry):
      i, cache, token_B, done_B, tokens_BxN = carry
      logits_BxV, cache = forward(cache, token_B[:, None], jnp.ones((B, 1), bool))
      return i + 1, cache, *emit(i, logits_BxV, done_B, tokens_BxN)

    carry = (jnp.int32(1), cache, token_B, done_B, tokens_BxN)
    for length in lengths:  # step i writes slot P + i - 1: a cache of `length` slots takes i <= length - P
      carry = (carry[0], grow_cache(carry[1], jax.eval_shape(lambda: init_cache(model, B, length))), *carry[2:])
      keep_going = lambda carry, end=min(length - P + 1, N): (carry[0] < end) & ~jnp.all(carry[3])
      carry = jax.lax.while_loop(keep_going, step, carry)
  return carry[-1]


# Compiled once per (model, lengths, sampling, ...): `generate` keeps the shapes to a few buckets.
STATIC_ARGNAMES = ("model", "max_new_tokens", "sampling", "stop_id", "rules", "stream", "decode_phase")
# XLA:CPU's options for the sampler program (on accelerators it compiles without them): 512-bit
# vectors. A decoding step of a small model is many small elementwise kernels (LayerNorm, GELU's
# tanh), and main-job-sized generation is ~6% faster with them on a 2-core Zen 5 (LLVM prefers 256 by
# default). Products stay in YNNPACK, XLA:CPU's default, also the tied head's: Eigen's dots (as
# `xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_REDUCE`) once ran its vocabulary-major
# product faster, but under jax 0.12 on a 2-core Zen 3 they made cpu-small's generation 0.60x as
# fast at batch 4, ~0.9x at 8 and 1.0x at 16 and 32, GPT-2's 0.96x at batch 8.
CPU_OPTIONS = {"xla_cpu_prefer_vector_width": 512}


@functools.cache
def _compiled(options: tuple[tuple[str, object], ...]):
  return jax.jit(sample_padded, static_argnames=STATIC_ARGNAMES, compiler_options=dict(options) or None)


def compiler_options(platform: str) -> dict:
  """The XLA options of the sampler program on `platform` (see above)."""
  return CPU_OPTIONS if platform == "cpu" else {}


def jitted_sampler(mesh=None):
  """`sample_padded` under jax.jit with the compiler options of the platform of `mesh` (default:
  of the first device)."""
  platform = (mesh.devices.flat[0] if mesh is not None else jax.devices()[0]).platform
  return _compiled(tuple(sorted(compiler_options(platform).items())))


# The fewest prompts a part of a batch split over a CPU's cores gets (`cpu_parts`): MIN_PART_ROWS;
# with a vocabulary of LARGE_VOCAB or more, LARGE_VOCAB_PART_ROWS; with an output head read from
# memory at every step (`gpt.streamed_head`), STREAMED_HEAD_PART_ROWS.
MIN_PART_ROWS = 4
LARGE_VOCAB_PART_ROWS = 16
STREAMED_HEAD_PART_ROWS = 32


def cpu_parts(model, batch_size: int, threads: int) -> int:
  """Into how many parts `generate` splits a batch of `batch_size` prompts, each part decoded by its
  own thread: one per thread of `common.cpu_threads` (one per core on a CPU device), each of at
  least MIN_PART_ROWS prompts (more with a large vocabulary or head, see above).

  Measured on a 2-core Zen 5 (greedy unless said, tokens identical, both forms timed alternately in
  one process):
  main job (d 128, vocabulary 85) batch 8 / 16 / 32 1.8x / 1.2-1.5x / 1.6x, batch 32 at temperature
  0.8 1.7x; d 256 with vocabulary 85 at batch 8 / 32 1.4x / 1.5x; d 128 with vocabulary 4,096
  (a 2 MB head) at batch 32 1.5x. Smaller parts lose: two of 2 prompts 0.7-0.9x, four parts on two
  cores 0.7x. With a large vocabulary, parts under 16 prompts compute the tied head from their own
  copy of the transposed embedding (`gpt._decode_head`): cpu-small's batch 16 in two parts 0.67x,
  GPT-2's batch 8 0.75x. A head larger than the cache is read from memory by each part: cpu-small's
  (51 MB) batch 32 in two parts 1.0-1.1x on the Zen 5, 0.85-0.91x on a 2-core Zen 4, its batch 64
  1.07x on the Zen 4; GPT-2 124M's batch 32 1.0x on the Zen 5."""
  cfg = model.config
  rows = MIN_PART_ROWS
  if cfg.vocab_size >= LARGE_VOCAB:
    rows = LARGE_VOCAB_PART_ROWS
  if gpt.streamed_head(cfg.vocab_size, cfg.d_model, cfg.dtype):
    rows = STREAMED_HEAD_PART_ROWS
  return max(1, min(threads, batch_size // rows))


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int) -> list[list[int]]:
  return check_token_lists(prompts, vocab_size, "prompt", "start it with the end-of-text id (tokenizer.eot_id), "
                           "which is how GPT-2 begins a document")


def generate(model, params, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
             sampling: Sampling = Sampling(), seed: int | jax.Array = 0, stop_id: int | None = None,
             mesh=None, rules: tuple = (), sliding_window: bool = False,
             on_token: Callable[[int, np.ndarray], None] | None = None,
             decode_phase: int = DECODE_PHASE) -> list[list[int]]:
  """New token ids for each prompt (at most `max_new_tokens`, without `stop_id` and what follows).

  With `mesh` (and the logical axis `rules` training used), the batch and the KV cache are sharded
  like training's activations; `params` keep whatever shardings they have (e.g. from a checkpoint).
  `on_token(step, tokens_B)` streams each step's tokens, in prompt order. On a CPU without a mesh of
  several devices, a batch of enough prompts is split into parts decoded at once, one per core
  (`cpu_parts`); the tokens, sampled ones too, are those of the whole batch.

  `decode_phase`: the fewest new tokens per phase of the decode loop (`decode_lengths`). Each phase
  compiles its own loop body (here ~0.3 s each at the main job's and cpu-small's shapes), so for one
  call the compile can cost more than the phases save; max_new_tokens or more makes one phase."""
  cfg = model.config
  prompts = check_prompts(prompts, cfg.vocab_size)
  sampling = sampling.check()
  if max_new_tokens < 1:
    raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
  if decode_phase < 1:
    raise ConfigError(f"decode_phase must be >= 1 (max_new_tokens or more: one phase), got {decode_phase}")
  rng = jax.random.key(seed) if isinstance(seed, int) else seed
  longest = max(len(p) for p in prompts)
  if longest + max_new_tokens > cfg.context_length:
    if sliding_window:
      return [generate_sliding(model, params, p, max_new_tokens=max_new_tokens, sampling=sampling,
                               rng=jax.random.fold_in(rng, b), stop_id=stop_id) for b, p in enumerate(prompts)]
    which = max(range(len(prompts)), key=lambda b: len(prompts[b]))
    tokens = f"{longest} token{'s' * (longest > 1)}"
    raise ConfigError(f"prompt {which} ({tokens}) + max_new_tokens={max_new_tokens} is longer than the "
                      f"model's context of {cfg.context_length} tokens; shorten the prompt, lower max_new_tokens "
                      f"to {max(cfg.context_length - longest, 0)}, or use the sliding window "
                      f"(sliding_window=True / --sliding_window), which is much slower")

  # On a CPU device, its cores may each decode a part of the batch (streaming keeps one part).
  parts = cpu_parts(model, len(prompts), cpu_threads(mesh)) if on_token is None else 1
  # Shapes: prompt length rounded up (without leaving the context), batch up to a multiple of the
  # data-parallel size and of the parts.
  P = min(round_up(longest, PROMPT_BUCKET), cfg.context_length - max_new_tokens)
  prompt_BxP, valid_BxP = pad_rows(prompts, round_up(batch_rows(len(prompts), mesh, rules), parts), P, left=True)
  kwargs = dict(model=model, max_new_tokens=max_new_tokens, sampling=sampling, stop_id=stop_id,
                rules=tuple(rules) if mesh is not None else (), stream=on_token is not None,
                decode_phase=min(decode_phase, max_new_tokens))  # one compiled program for any one-phase value
  rows = len(prompt_BxP) // parts
  sampler = jitted_sampler(mesh)

  def decode(part: int) -> np.ndarray:
    first = part * rows
    part_BxP, part_valid_BxP = prompt_BxP[first:first + rows], valid_BxP[first:first + rows]
    if mesh is None:
      tokens_BxN = sampler(params, part_BxP, part_valid_BxP, rng, first, **kwargs)
    else:
      with jax.set_mesh(mesh):
        tokens_BxN = sampler(params, *put_on_mesh(mesh, rules, part_BxP, part_valid_BxP), rng, first, **kwargs)
    return np.asarray(tokens_BxN)  # waits for the last callback too

  if on_token is not None:
    _stream_target[:] = [lambda i, tokens_B: on_token(i, tokens_B[:len(prompts)])]
  try:
    tokens_BxN = np.concatenate(on_threads(decode, range(parts), parts))
  finally:
    _stream_target.clear()
  return [until_stop(row, stop_id) for row in tokens_BxN[:len(prompts)]]


def generate_sliding(model, params, prompt: list[int], *, max_new_tokens: int, sampling: Sampling = Sampling(),
                     rng=None, stop_id: int | None = None) -> list[int]:
  """One prompt, any length: a full forward pass over the last `context_length` tokens per new token
  (one compiled function over a fixed-size buffer, no cache). Slow; for text longer than the context."""
  context = model.config.context_length
  prompt = check_prompts([prompt], model.config.vocab_size)[0]
  rng = jax.random.key(0) if rng is None else rng

  @jax.jit
  def next_token(buffer_1xC, length, rng):
    logits_1xCxV = model.apply({"params": params}, buffer_1xC)
    logits_1xV = jax.lax.dynamic_index_in_dim(logits_1xCxV, length - 1, axis=1, keepdims=False)
    return sample_logits(logits_1xV, rng, sampling)[0]

  tokens = list(prompt)
  for i in range(max_new_tokens):
    window = tokens[-context:]
    buffer = np.zeros((1, context), np.int32)
    buffer[0, :len(window)] = window
    token = int(next_token(jnp.asarray(buffer), len(window), jax.random.fold_in(rng, i)))
    if token == stop_id:
      break
    tokens.append(token)
  return tokens[len(prompt):]


class _TextStream:
  """Writes one sequence's text to `out` as its tokens come, holding back incomplete characters
  (a byte-level BPE token can end in the middle of a UTF-8 sequence)."""

  def __init__(self, tokenizer, out, stop_id: int | None):
    self.tokenizer, self.out, self.stop_id = tokenizer, out, stop_id
    self.ids: list[int] = []
    self.written = 0
    self.stopped = False

  def __call__(self, step: int, tokens_B: np.ndarray) -> None:
    token = int(tokens_B[0])
    self.stopped = self.stopped or token == self.stop_id
    if self.stopped:
      return
    self.ids.append(token)
    text = self.tokenizer.decode(self.ids)
    if not text.endswith("\ufffd"):
      self.out.write(text[self.written:])
      self.out.flush()
      self.written = len(text)


def complete(model, params, tokenizer, texts: Sequence[str], *, max_new_tokens: int,
             sampling: Sampling = Sampling(), seed: int = 0, num_samples: int = 1, stream=None,
             allow_special: bool | Iterable[str] = False, **generate_options) -> list[str]:
  """Text continuations: `num_samples` per prompt, prompt-major. Generation stops at end-of-text;
  an empty prompt starts from end-of-text (a fresh document, as GPT-2 was trained). A special token
  written in a prompt (e.g. "<|endoftext|>") is refused unless `allow_special` (True, or a set of
  names) lets it be encoded as that token, as `Tokenizer.encode` does.

  stream: a text file (e.g. sys.stdout) to write the completions to as their tokens come; they are
  then made one at a time (sample j of a prompt with seed `seed + j`) instead of as one batch."""
  if num_samples < 1:
    raise ConfigError(f"num_samples must be >= 1, got {num_samples}")
  prompts = []
  for i, text in enumerate(texts):
    try:
      prompts.append(tokenizer.encode(text, allow_special=allow_special) or [tokenizer.eot_id])
    except TokenizerError as e:
      raise TokenizerError(f"prompt {i + 1}: {e}") from None
  options = dict(max_new_tokens=max_new_tokens, sampling=sampling, stop_id=tokenizer.eot_id, **generate_options)
  if stream is None:
    rows = [p for p in prompts for _ in range(num_samples)]
    return [tokenizer.decode(ids) for ids in generate(model, params, rows, seed=seed, **options)]
  completions = []
  for text, prompt in zip(texts, prompts):
    for j in range(num_samples):
      stream.write(text)
      streamer = _TextStream(tokenizer, stream, tokenizer.eot_id)
      [ids] = generate(model, params, [prompt], seed=seed + j, on_token=streamer, **options)
      completions.append(tokenizer.decode(ids))
      stream.write(completions[-1][streamer.written:] + "\n")  # what was held back (or not streamed)
      stream.flush()
  return completions
