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
     token) until every sequence has emitted `stop_id` or `max_new_tokens` are made (with the
     accelerators' kernels, a loop of max_new_tokens steps, the tokens after a stop masked: no
     host round trip a token; `sample_padded`'s `fixed_trips`). The cache
     grows in a few phases up to P + max_new_tokens slots (`decode_lengths`): each step attends
     over the slots of its phase, not over every slot that will ever be written.
  With the CPU's kernels a large enough batch is split into one part per core, each decoded by its
  own thread (`split_parts`); the tokens are those of the whole batch.

Sampling (HF's order): logits / temperature -> keep the top_k -> keep the nucleus (the fewest
tokens whose probability reaches top_p) -> draw. **temperature=0 means greedy** (argmax; top_k and
top_p are then irrelevant). Draws for row b at step i use the key fold_in(fold_in(seed, i), b): a
prompt gives the same sample alone or in a batch, in the same row.

Lengths: every prompt plus max_new_tokens must fit in the context (the learned position table),
or `generate` raises; with `sliding_window=True` longer generations instead re-run the model over
the last max_len tokens for each new one (`generate_sliding`: correct but slow, no cache).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from transformer import kernels, models
from transformer.errors import ConfigError, TokenizerError
from transformer.generation.common import (
  batch_rows,
  check_token_lists,
  empty_cache,
  grow_cache,
  pad_rows,
  put_on_mesh,
  round_up,
  until_stop,
)
from transformer.kernels import decode_head, decode_threads

PROMPT_BUCKET = 16  # prompts are padded to a multiple of this: few compiled shapes
DECODE_PHASE = 32  # the fewest new tokens a phase of the decode loop makes (see `decode_lengths`)
MAX_DECODE_PHASES = 4  # each phase compiles its own loop body


@dataclasses.dataclass(frozen=True)
class Sampling:
  temperature: float = 1.0  # 0: greedy (argmax)
  top_k: int = 0  # keep the k most likely tokens; 0: all
  top_p: float = 1.0  # keep the fewest tokens whose probability sums to >= top_p; 1: all

  def check(self) -> Sampling:
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


def sample_logits(
  logits_BxV: jax.Array,
  rng: jax.Array,
  sampling: Sampling,
  forms: str = "reference",
  vocab_major: bool = False,
  first_row: jax.Array | int = 0,
) -> jax.Array:
  """One token per row; row b draws with the key fold_in(rng, first_row + b) (`first_row`: where
  these rows start in the whole batch). `forms` (kernels.forms of config.model.kernels) picks the
  argmax's and the draw's faster forms (transformer.kernels.argmax, .draw); `vocab_major`: the logits
  are the transpose of a V x B array (transformer.kernels.decode_head)."""
  if sampling.temperature == 0:
    fast = kernels.form("argmax", forms)
    return fast(logits_BxV, vocab_major) if fast else jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  logits_BxV = filter_logits(logits_BxV, sampling)
  rows_B = first_row + jnp.arange(logits_BxV.shape[0])
  u_B = jax.vmap(lambda b: jax.random.uniform(jax.random.fold_in(rng, b)))(rows_B)
  return (kernels.form("draw", forms) or inverse_cdf)(logits_BxV, u_B)


def inverse_cdf(logits_BxV: jax.Array, u_B: jax.Array) -> jax.Array:
  """A draw from softmax(logits) per row, given one uniform number u in [0, 1) per row: the first
  token whose cumulative probability exceeds u. A token of weight 0 (excluded by top-k or top-p) is
  never drawn: where float rounding puts u * total at the end, the last token of weight > 0 is."""
  w_BxV = jnp.exp(logits_BxV - jnp.max(logits_BxV, axis=-1, keepdims=True))  # -inf -> 0; the max -> 1
  cum_BxV = jnp.cumsum(w_BxV, axis=-1)
  index_B = jnp.sum(cum_BxV <= u_B[:, None] * cum_BxV[:, -1:], axis=-1)
  last_B = w_BxV.shape[-1] - 1 - jnp.argmax(w_BxV[:, ::-1] > 0, axis=-1)
  return jnp.minimum(index_B, last_B).astype(jnp.int32)


def init_cache(model, batch_size: int, length: int):
  """An empty GPT KV cache for `batch_size` sequences of `length` tokens."""
  return empty_cache(lambda: model.init(jax.random.key(0), jnp.zeros((batch_size, length), jnp.int32), decode=True))


def decode_lengths(prompt_len: int, max_new_tokens: int, phase_tokens: int = DECODE_PHASE) -> list[int]:
  """The cache lengths the decode loop grows through, the last P + max_new_tokens. A step attends over
  every slot of the cache (its shape is static), so one cache of the final length makes the early
  steps read slots that hold nothing yet. Up to MAX_DECODE_PHASES phases of at least `phase_tokens`
  tokens: e.g. 32 prompt + 96 new tokens in three phases attend over 64, 96, then 128 slots, not 128 throughout."""
  phases = max(1, min(MAX_DECODE_PHASES, max_new_tokens // phase_tokens))
  return [prompt_len + -(-max_new_tokens * j // phases) for j in range(1, phases + 1)]


class Relay:
  """How a streaming sampler's tokens reach the host: the compiled program calls the relay with each
  step's tokens, and it hands them to `on_token` of the streaming `generate` call running now. One
  relay per compiled sampler (`relay_of`), so that streaming calls share that program; its lock keeps
  them one at a time."""

  def __init__(self):
    self._lock = threading.Lock()
    self._on_token: Callable[[int, np.ndarray], None] | None = None

  def __call__(self, step, tokens_B) -> None:
    self._on_token(int(step), np.asarray(tokens_B))

  @contextlib.contextmanager
  def to(self, on_token: Callable[[int, np.ndarray], None]):
    with self._lock:
      self._on_token = on_token
      try:
        yield self
      finally:
        self._on_token = None


class DecodeState(NamedTuple):
  """The decode loop's state between steps (a pytree: the loops carry it)."""

  step: jax.Array  # the index of the token the next step makes
  cache: Any  # the KV cache ("cache" collection), grown phase by phase
  token_B: jax.Array  # each row's last token, the next step's input
  done_B: jax.Array  # which rows have emitted stop_id
  tokens_BxN: jax.Array  # the new tokens so far (stop_id after a row's stop)


def _next_logits(model, params, cache, tokens_BxT, valid_BxT):
  """The next token's logits after `tokens_BxT`, and the cache with them written."""
  logits_BxTxV, variables = model.apply(
    {"params": params, "cache": cache}, tokens_BxT, valid_BxT=valid_BxT, decode=True, mutable=["cache"]
  )
  return logits_BxTxV[:, -1], variables["cache"]


def sample_padded(
  params,
  prompt_BxP,
  valid_BxP,
  rng,
  first_row=0,
  *,
  model,
  max_new_tokens: int,
  sampling: Sampling,
  stop_id: int | None = None,
  rules: tuple = (),
  stream: Relay | None = None,
  decode_phase: int = DECODE_PHASE,
  fixed_trips: bool | None = None,
):
  """The sampler (`jitted_sampler` compiles it): left-padded prompts (B, P) -> new tokens
  (B, max_new_tokens). `first_row`: the index of these prompts' first row in the whole batch, which
  a part of a split batch draws its random numbers by (`sample_logits`). `decode_phase`: see
  `decode_lengths`.

  After a sequence emits `stop_id` its remaining entries are `stop_id`. With a `stream` relay, each
  step's tokens go to the host as they are made (see `generate`'s `on_token`).

  The loop stops when every sequence has emitted `stop_id`; with `fixed_trips` (default: the
  accelerators' forms) it runs all max_new_tokens steps instead, the tokens after a stop masked to
  `stop_id` as before: the same tokens, and a loop whose trip count the compiler knows, which on an
  accelerator runs step after step without copying the stop condition to the host each token."""
  B, P = prompt_BxP.shape
  N = max_new_tokens
  forms = _forms(model)
  vocab_major = (
    bool(kernels.form("tied_head_decode", forms)) and _tied(model) and decode_head.vocab_major(B, *_head(model))
  )

  forward = functools.partial(_next_logits, model, params)

  def emit(i, logits_BxV, done_B, tokens_BxN):
    """Token i of every row drawn from its logits (stop_id for rows already stopped), streamed if asked."""
    token_B = sample_logits(logits_BxV, jax.random.fold_in(rng, i), sampling, forms, vocab_major, first_row)
    if stop_id is not None:
      token_B = jnp.where(done_B, stop_id, token_B)
      done_B = done_B | (token_B == stop_id)
    if stream is not None:
      io_callback(stream, None, i, token_B, ordered=True)
    return token_B, done_B, tokens_BxN.at[:, i].set(token_B)

  def step(state: DecodeState) -> DecodeState:
    logits_BxV, cache = forward(state.cache, state.token_B[:, None], jnp.ones((B, 1), bool))
    return DecodeState(state.step + 1, cache, *emit(state.step, logits_BxV, state.done_B, state.tokens_BxN))

  with nn.logical_axis_rules(rules):
    lengths = decode_lengths(P, N, decode_phase)
    # The prompt: one forward pass fills the first phase's cache and gives token 0.
    logits_BxV, cache = forward(init_cache(model, B, lengths[0]), prompt_BxP, valid_BxP)
    first = emit(0, logits_BxV, jnp.zeros((B,), bool), jnp.zeros((B, N), jnp.int32))
    state = DecodeState(jnp.int32(1), cache, *first)
    fixed_trips = forms == "accelerator" if fixed_trips is None else fixed_trips
    state = _decode_phases(step, state, lengths, P, N, lambda length: init_cache(model, B, length), fixed_trips)
  return state.tokens_BxN


def _decode_phases(step, state: DecodeState, lengths, P: int, N: int, cache_of, fixed_trips: bool) -> DecodeState:
  """Tokens 1 .. N - 1 by `step`, phase by phase (`decode_lengths`): each phase grows the cache to its
  length (`cache_of(length)`: a cache of that many slots) and runs the steps whose slots it holds,
  a fixed trip count or stopping once every row has stopped."""
  start = 1
  for length in lengths:  # step i writes slot P + i - 1: a cache of `length` slots takes i <= length - P
    state = state._replace(cache=grow_cache(state.cache, jax.eval_shape(lambda length=length: cache_of(length))))
    end = min(length - P + 1, N)
    if fixed_trips:
      state = jax.lax.fori_loop(start, max(start, end), lambda _, s: step(s), state)
    else:
      keep_going = lambda s, end=end: (s.step < end) & ~jnp.all(s.done_B)
      state = jax.lax.while_loop(keep_going, step, state)
    start = max(start, end)
  return state


# Compiled once per (model, lengths, sampling, ...): `generate` keeps the shapes to a few buckets.
STATIC_ARGNAMES = ("model", "max_new_tokens", "sampling", "stop_id", "rules", "stream", "decode_phase", "fixed_trips")


@functools.cache
def _compiled(options: tuple[tuple[str, object], ...]):
  return jax.jit(sample_padded, static_argnames=STATIC_ARGNAMES, compiler_options=dict(options) or None)


def _options(model) -> tuple[tuple[str, object], ...]:
  """XLA's options for the model's sampler: with the CPU's kernels, XLA:CPU's (decode_threads.CPU_OPTIONS)."""
  return tuple(sorted((decode_threads.CPU_OPTIONS if _forms(model) == "cpu" else {}).items()))


def jitted_sampler(model):
  """`sample_padded` under jax.jit, with XLA's options for the model's forms (`_options`)."""
  return _compiled(_options(model))


@functools.cache
def _relay(options: tuple[tuple[str, object], ...]) -> Relay:
  return Relay()


def relay_of(model) -> Relay:
  """The streaming relay of the model's compiled sampler (one per compiled program)."""
  return _relay(_options(model))


def _forms(model) -> str:
  """The forms of the model's config.model.kernels, decided for this program (kernels.resolve)."""
  return kernels.resolve(model.config.kernels)


def _tied(model) -> bool:
  """Whether the model's decoding step takes the tied head (a GPT's, transformer.kernels.decode_head)."""
  return model.config.family == "gpt" and model.config.tie_embeddings


def _head(model) -> tuple[int, int, str]:
  """(vocabulary size, width, compute dtype) of the model's output head."""
  fields = models.body_fields(model.config)
  return model.config.vocab_size, fields.d_model, fields.dtype


def split_parts(model, batch_size: int, mesh) -> int:
  """Into how many parts `generate` splits a batch, each decoded by its own thread: with the CPU's
  kernels on one CPU device, one per core (transformer.kernels.decode_threads); else 1."""
  threads = decode_threads.threads(_forms(model), mesh)
  return 1 if threads == 1 else decode_threads.parts(*_head(model), batch_size, threads)


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int) -> list[list[int]]:
  return check_token_lists(
    prompts,
    vocab_size,
    "prompt",
    "start it with the end-of-text id (tokenizer.eot_id), which is how GPT-2 begins a document",
  )


def generate(
  model,
  params,
  prompts: Sequence[Sequence[int]],
  *,
  max_new_tokens: int,
  sampling: Sampling = Sampling(),
  seed: int | jax.Array = 0,
  stop_id: int | None = None,
  mesh=None,
  rules: tuple = (),
  sliding_window: bool = False,
  on_token: Callable[[int, np.ndarray], None] | None = None,
  decode_phase: int = DECODE_PHASE,
  fixed_trips: bool | None = None,
) -> list[list[int]]:
  """New token ids for each prompt (at most `max_new_tokens`, without `stop_id` and what follows).

  With `mesh` (and the logical axis `rules` training used), the batch and the KV cache are sharded
  like training's activations; `params` keep whatever shardings they have (e.g. from a checkpoint).
  `on_token(step, tokens_B)` streams each step's tokens, in prompt order. On a CPU without a mesh of
  several devices, a batch of enough prompts is split into parts decoded at once, one per core
  (`split_parts`); the tokens, sampled ones too, are those of the whole batch.

  `decode_phase`: the fewest new tokens per phase of the decode loop (`decode_lengths`). Each phase
  compiles its own loop body, so for one call the compile can cost more than the phases save;
  max_new_tokens or more makes one phase. `fixed_trips`: the loop's form (`sample_padded`; default:
  the model's kernels decide), the same tokens either way."""
  prompts, sampling = _checked(model, prompts, max_new_tokens, sampling, decode_phase)
  rng = jax.random.key(seed) if isinstance(seed, int) else seed
  if max(map(len, prompts)) + max_new_tokens > model.config.max_len:
    return _beyond_the_context(model, params, prompts, max_new_tokens, sampling, rng, stop_id, sliding_window)
  options = dict(
    model=model,
    max_new_tokens=max_new_tokens,
    sampling=sampling,
    stop_id=stop_id,
    rules=tuple(rules) if mesh is not None else (),
    decode_phase=min(decode_phase, max_new_tokens),  # one compiled program for any one-phase value
    fixed_trips=fixed_trips,
  )
  if on_token is None:  # on a CPU device, its cores may each decode a part of the batch
    tokens_BxN = _decode(params, prompts, rng, mesh, split_parts(model, len(prompts), mesh), **options)
  else:  # one part, whose tokens go to on_token as they are made
    with relay_of(model).to(lambda i, tokens_B: on_token(i, tokens_B[: len(prompts)])) as relay:
      tokens_BxN = _decode(params, prompts, rng, mesh, 1, stream=relay, **options)
  return [until_stop(row, stop_id) for row in tokens_BxN[: len(prompts)]]


def _checked(model, prompts, max_new_tokens: int, sampling: Sampling, decode_phase: int):
  """(the prompts, the sampling), checked: every bad value is one ConfigError naming it."""
  prompts = check_prompts(prompts, model.config.vocab_size)
  if max_new_tokens < 1:
    raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
  if decode_phase < 1:
    raise ConfigError(f"decode_phase must be >= 1 (max_new_tokens or more: one phase), got {decode_phase}")
  return prompts, sampling.check()


def _beyond_the_context(model, params, prompts, max_new_tokens, sampling, rng, stop_id, sliding_window):
  """Prompts that with max_new_tokens do not fit the context: the sliding window's tokens (one
  prompt at a time), or the error naming the longest prompt and what would fit."""
  if sliding_window:
    return [
      generate_sliding(
        model,
        params,
        p,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        rng=jax.random.fold_in(rng, b),
        stop_id=stop_id,
      )
      for b, p in enumerate(prompts)
    ]
  which = max(range(len(prompts)), key=lambda b: len(prompts[b]))
  longest, context = len(prompts[which]), model.config.max_len
  raise ConfigError(
    f"prompt {which} ({longest} token{'s' * (longest > 1)}) + max_new_tokens={max_new_tokens} is longer "
    f"than the model's context of {context} tokens; "
    + (
      f"shorten the prompt, lower max_new_tokens to {context - longest}, "
      if longest < context
      else f"shorten the prompt to fewer than {context} tokens, "
    )
    + "or use the sliding window (sliding_window=True / --sliding_window), which is much slower"
  )


def _decode(params, prompts, rng, mesh, parts: int, **options) -> np.ndarray:
  """The new tokens of the prompts, left-padded into one batch (B x max_new_tokens), decoded in
  `parts` parts at once, one per thread. Shapes: the prompt length rounded up (without leaving the
  context), the batch up to a multiple of the data-parallel size and of the parts."""
  model, max_new_tokens, rules = options["model"], options["max_new_tokens"], options["rules"]
  P = min(round_up(max(map(len, prompts)), PROMPT_BUCKET), model.config.max_len - max_new_tokens)
  prompt_BxP, valid_BxP = pad_rows(prompts, round_up(batch_rows(len(prompts), mesh, rules), parts), P, left=True)
  rows, sampler = len(prompt_BxP) // parts, jitted_sampler(model)

  def decode(part: int) -> np.ndarray:
    first = part * rows
    part_BxP, part_valid_BxP = prompt_BxP[first : first + rows], valid_BxP[first : first + rows]
    if mesh is None:
      return np.asarray(sampler(params, part_BxP, part_valid_BxP, rng, first, **options))
    with jax.set_mesh(mesh):  # np.asarray waits for the last streamed step too
      return np.asarray(sampler(params, *put_on_mesh(mesh, rules, part_BxP, part_valid_BxP), rng, first, **options))

  return np.concatenate(decode_threads.on_threads(decode, range(parts), parts))


def generate_sliding(
  model,
  params,
  prompt: list[int],
  *,
  max_new_tokens: int,
  sampling: Sampling = Sampling(),
  rng=None,
  stop_id: int | None = None,
) -> list[int]:
  """One prompt, any length: a full forward pass over the last `max_len` tokens per new token
  (one compiled function over a fixed-size buffer, no cache). Slow; for text longer than the context."""
  context = model.config.max_len
  prompt = check_prompts([prompt], model.config.vocab_size)[0]
  rng = jax.random.key(0) if rng is None else rng

  @jax.jit
  def next_token(buffer_1xC, length, rng):
    logits_1xCxV = model.apply({"params": params}, buffer_1xC)
    logits_1xV = jax.lax.dynamic_index_in_dim(logits_1xCxV, length - 1, axis=1, keepdims=False)
    return sample_logits(logits_1xV, rng, sampling, _forms(model))[0]

  tokens = list(prompt)
  for i in range(max_new_tokens):
    window = tokens[-context:]
    buffer = np.zeros((1, context), np.int32)
    buffer[0, : len(window)] = window
    token = int(next_token(jnp.asarray(buffer), len(window), jax.random.fold_in(rng, i)))
    if token == stop_id:
      break
    tokens.append(token)
  return tokens[len(prompt) :]


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
      self.out.write(text[self.written :])
      self.out.flush()
      self.written = len(text)


def complete(
  model,
  params,
  tokenizer,
  texts: Sequence[str],
  *,
  max_new_tokens: int,
  sampling: Sampling = Sampling(),
  seed: int = 0,
  num_samples: int = 1,
  stream=None,
  allow_special: bool | Iterable[str] = False,
  **generate_options,
) -> list[str]:
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
      stream.write(completions[-1][streamer.written :] + "\n")  # what was held back (or not streamed)
      stream.flush()
  return completions
