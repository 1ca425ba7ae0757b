"""Decoding the encoder-decoder Transformer: greedy and beam search, jit-compiled and batched.

Both encode the source once, then feed the decoder one token per `lax.while_loop` iteration through
its KV cache (self-attention) and the cached encoder keys/values (cross-attention).

Beam search keeps `beam_size` live hypotheses per sentence; each step extends every one by every
token, keeps the 2·beam_size best, sends those ending in <eos> to the finished set (scored by
log-probability / GNMT length penalty ((5 + length) / 6)^alpha, as in flax's wmt example; or, with
`penalty="hf"`, / length^alpha, as Hugging Face's `generate(num_beams=..., length_penalty=alpha)`
scores them, length counting the <eos>) when they are among the beam_size best, and the best
beam_size others on. It stops when no live hypothesis can beat the finished ones even at max_len,
or at max_len (Hugging Face's default `early_stopping=False` stops on a guess instead, which can end
a search before a longer, better hypothesis finishes; on tests/fixtures/marian_tiny both give the
same translations). With beam_size = 1 and alpha = 0 it is greedy decoding.

Both decode an `Ensemble` of models (transformer.models.seq2seq) as they decode one `Transformer`.

Both can forbid repeating an n-gram (`no_repeat_ngram=n`, fairseq's --no-repeat-ngram-size and
Hugging Face's no_repeat_ngram_size): a token that would complete an n-gram of tokens the hypothesis
already holds is not chosen. An undertrained model loops ("the voice of the voice of the voice");
this stops the loop, never the <eos>.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from transformer import kernels
from transformer.errors import ConfigError
from transformer.generation.common import (
  batch_rows,
  check_token_lists,
  empty_cache,
  pad_rows,
  put_on_mesh,
  round_up,
  until_stop,
)
from transformer.kernels import decode_threads
from transformer.models.seq2seq import Transformer

NEG_INF = -1.0e7  # scores of impossible hypotheses; finite, so that sums stay ordered


PENALTIES = ("gnmt", "hf")


def length_penalty(length, alpha: float, penalty: str = "gnmt"):
  """What a hypothesis's log-probability is divided by: GNMT's ((5 + length) / 6)^alpha, or ("hf")
  Hugging Face's length^alpha."""
  return length**alpha if penalty == "hf" else ((5.0 + length) / 6.0) ** alpha


def init_cache(model: Transformer, batch: int, source_len: int, target_len: int):
  """An empty decoder cache: target_len self-attention slots, the encoder's keys/values."""
  source, target = jnp.zeros((batch, source_len), jnp.int32), jnp.zeros((batch, target_len), jnp.int32)
  return empty_cache(lambda: model.init(jax.random.key(0), source, target, decode=True))


def decode_step(model: Transformer, params, cache, encoded_BxSxD, tokens_B, source_valid_BxS):
  """(logits_BxV of the next token, the updated cache) for one new token per sequence. Pass
  `encoded_BxSxD` on the first step (its keys/values are cached) and None after."""
  logits_Bx1xV, variables = model.apply(
    {"params": params, "cache": cache},
    encoded_BxSxD,
    tokens_B[:, None],
    source_valid_BxS=source_valid_BxS,
    decode=True,
    mutable=["cache"],
    method="decode_logits",
  )
  return logits_Bx1xV[:, 0], variables["cache"]


def repeated_ngram_mask(tokens_NxL, length, n: int, vocab_size: int):
  """bool_NxV: True for each next token that would complete an n-gram already in tokens_NxL[:, :length]
  (the tokens generated so far; the next one goes at `length`)."""
  N, L = tokens_NxL.shape
  if n > L:
    return jnp.zeros((N, vocab_size), bool)
  start_J = jnp.arange(L - n + 1)  # where an earlier n-gram starts
  last_Nx = jax.lax.dynamic_slice_in_dim(tokens_NxL, jnp.maximum(length - (n - 1), 0), n - 1, axis=1)
  earlier_NxJx = tokens_NxL[:, start_J[:, None] + jnp.arange(n - 1)[None]]
  # the earlier n-gram's first n-1 tokens are the last n-1 generated, and it ended before `length`
  match_NxJ = jnp.all(earlier_NxJx == last_Nx[:, None], axis=-1) & (start_J + n - 1 < length)[None]
  match_NxJ &= length >= n - 1
  return jnp.zeros((N, vocab_size), bool).at[jnp.arange(N)[:, None], tokens_NxL[:, start_J + n - 1]].max(match_NxJ)


def ban_repeated_ngrams(scores_NxV, tokens_NxL, length, n: int, eos_id: int, banned):
  """scores_NxV with `banned` for each token that would complete an n-gram already generated
  (`repeated_ngram_mask`), except <eos>: a translation may always end."""
  banned_NxV = repeated_ngram_mask(tokens_NxL, length, n, scores_NxV.shape[-1]).at[:, eos_id].set(False)
  return jnp.where(banned_NxV, banned, scores_NxV)


def _gather_beams(cache, beam_BxK, old_beams: int):
  """Reorders every per-sequence cache entry (batch*old_beams, ...) to the chosen beams (batch*K, ...)."""
  flat = flax.traverse_util.flatten_dict(cache)
  out = {}
  for path, x in flat.items():
    if path[-1] == "index":  # the next cache slot, shared by all sequences
      out[path] = x
      continue
    axis = 1 if "layers" in path else 0  # scanned layers carry a leading layer axis
    B, K = beam_BxK.shape
    x_BxOx = x.reshape(x.shape[:axis] + (B, old_beams) + x.shape[axis + 1 :])
    idx = beam_BxK.reshape((1,) * axis + (B, K) + (1,) * (x.ndim - axis - 1))
    x = jnp.take_along_axis(x_BxOx, idx, axis=axis + 1)
    out[path] = x.reshape(x.shape[:axis] + (B * K,) + x.shape[axis + 2 :])
  return flax.traverse_util.unflatten_dict(out)


class BeamState(NamedTuple):
  """Beam search's state between steps (a pytree: the loop carries it)."""

  step: jax.Array  # the target position the next step writes
  cache: Any  # the decoder's KV cache, B * K rows
  alive_BxKxL: jax.Array  # the K live hypotheses of each source (eos after their end)
  alive_lp_BxK: jax.Array  # their log-probabilities (NEG_INF: no such hypothesis yet)
  finished_BxKxL: jax.Array  # the K best finished ones so far
  finished_score_BxK: jax.Array  # their length-penalised scores


def _advanced(state: BeamState, lp_NxV, cache, *, alpha: float, penalty: str, eos_id: int) -> BeamState:
  """The beams one token on: the K live hypotheses' continuations by `lp_NxV` (N = B * K rows) kept or
  finished, the cache gathered to the beams kept."""
  i = state.step
  B, K, L = state.alive_BxKxL.shape
  # The 2K best continuations of the K live hypotheses: enough that K of them have not ended.
  V = lp_NxV.shape[-1]
  cand_BxKV = (state.alive_lp_BxK[:, :, None] + lp_NxV.reshape(B, K, V)).reshape(B, K * V)
  top_lp_Bx2K, top_idx_Bx2K = jax.lax.top_k(cand_BxKV, 2 * K)
  beam_Bx2K, token_Bx2K = top_idx_Bx2K // V, top_idx_Bx2K % V
  seq_Bx2KxL = jnp.take_along_axis(state.alive_BxKxL, beam_Bx2K[:, :, None], axis=1)
  seq_Bx2KxL = seq_Bx2KxL.at[:, :, i].set(token_Bx2K)
  ended_Bx2K = token_Bx2K == eos_id
  # Live: the K best that did not end (ending at max_len is forced below).
  alive_lp_BxK, pick_BxK = jax.lax.top_k(jnp.where(ended_Bx2K, NEG_INF, top_lp_Bx2K), K)
  alive_BxKxL = jnp.take_along_axis(seq_Bx2KxL, pick_BxK[:, :, None], axis=1)
  cache = _gather_beams(cache, jnp.take_along_axis(beam_Bx2K, pick_BxK, axis=1), K)
  # Finished: those among the K best that ended now (all K at the last step), merged with earlier
  # ones. Only the K best may finish (fairseq's rule): with beam_size 1 that is greedy decoding.
  ends = (ended_Bx2K | (i == L - 1)) & (jnp.arange(2 * K) < K)[None]
  score_Bx2K = jnp.where(ends, top_lp_Bx2K / length_penalty(i + 1, alpha, penalty), NEG_INF)
  all_score = jnp.concatenate([state.finished_score_BxK, score_Bx2K], axis=1)
  all_seq = jnp.concatenate([state.finished_BxKxL, seq_Bx2KxL], axis=1)
  finished_score_BxK, keep_BxK = jax.lax.top_k(all_score, K)
  finished_BxKxL = jnp.take_along_axis(all_seq, keep_BxK[:, :, None], axis=1)
  return BeamState(i + 1, cache, alive_BxKxL, alive_lp_BxK, finished_BxKxL, finished_score_BxK)


@functools.partial(
  jax.jit,
  static_argnames=(
    "model",
    "beam_size",
    "max_len",
    "alpha",
    "bos_id",
    "eos_id",
    "no_repeat_ngram",
    "penalty",
    "banned_ids",
  ),
)
def beam_search(
  params,
  source_BxS,
  source_valid_BxS,
  *,
  model: Transformer,
  beam_size: int,
  max_len: int,
  alpha: float,
  bos_id: int,
  eos_id: int,
  no_repeat_ngram: int = 0,
  penalty: str = "gnmt",
  banned_ids: tuple[int, ...] = (),
):
  """(tokens_BxKxL, scores_BxK): the beam_size best translations of each source, best first.

  tokens exclude <bos> and are padded with <eos> after the first one; scores are
  log p(tokens) / length_penalty(len incl. <eos>, alpha, penalty). No hypothesis contains
  `banned_ids` (their log-probabilities are set to -inf after the softmax, as transformers'
  `bad_words_ids` does: the other tokens' are not renormalised)."""
  B, S = source_BxS.shape
  K, L = beam_size, max_len
  encoded_BxSxD = model.apply({"params": params}, source_BxS, source_valid_BxS=source_valid_BxS, method="encode")
  repeat = lambda x: jnp.repeat(x, K, axis=0)
  encoded_NxSxD, valid_NxS = jax.tree.map(repeat, encoded_BxSxD), repeat(source_valid_BxS)  # a tuple for an Ensemble

  def next_log_probs(state: BeamState, encoded):
    """Each live hypothesis's next-token log-probabilities (N = B * K rows), with what may not come
    next at -inf, and the cache with its last token written."""
    i = state.step
    last_N = jnp.where(i == 0, bos_id, state.alive_BxKxL[:, :, jnp.maximum(i - 1, 0)]).reshape(B * K)
    logits_NxV, cache = decode_step(model, params, state.cache, encoded, last_N, valid_NxS)
    lp_NxV = jax.nn.log_softmax(logits_NxV).at[:, list(banned_ids)].set(NEG_INF)
    if no_repeat_ngram:
      lp_NxV = ban_repeated_ngrams(lp_NxV, state.alive_BxKxL.reshape(B * K, L), i, no_repeat_ngram, eos_id, NEG_INF)
    return lp_NxV, cache

  def step(state: BeamState, encoded=None) -> BeamState:
    lp_NxV, cache = next_log_probs(state, encoded)
    return _advanced(state, lp_NxV, cache, alpha=alpha, penalty=penalty, eos_id=eos_id)

  def keep_going(state: BeamState):
    # The best a live hypothesis can still reach: its log-prob only falls, the penalty grows to max_len's.
    best_alive_B = state.alive_lp_BxK[:, 0] / length_penalty(L, alpha, penalty)
    return (state.step < L) & ~jnp.all(state.finished_score_BxK[:, -1] >= best_alive_B)

  state = BeamState(
    step=jnp.int32(0),
    cache=init_cache(model, B * K, S, L),
    alive_BxKxL=jnp.full((B, K, L), eos_id, jnp.int32),
    alive_lp_BxK=jnp.tile(jnp.array([0.0] + [NEG_INF] * (K - 1)), (B, 1)),  # one live beam at first
    finished_BxKxL=jnp.full((B, K, L), eos_id, jnp.int32),
    finished_score_BxK=jnp.full((B, K), NEG_INF),
  )
  state = step(state, encoded_NxSxD)  # the first step passes the encoder output (cached from then on)
  state = jax.lax.while_loop(keep_going, step, state)
  return state.finished_BxKxL, state.finished_score_BxK


@functools.partial(jax.jit, static_argnames=("model", "max_len", "bos_id", "eos_id", "no_repeat_ngram", "banned_ids"))
def greedy(
  params,
  source_BxS,
  source_valid_BxS,
  *,
  model: Transformer,
  max_len: int,
  bos_id: int,
  eos_id: int,
  no_repeat_ngram: int = 0,
  banned_ids: tuple[int, ...] = (),
):
  """tokens_BxL: the argmax token at every step but `banned_ids`, <eos>-padded after the first <eos>."""
  B, S = source_BxS.shape
  encoded_BxSxD = model.apply({"params": params}, source_BxS, source_valid_BxS=source_valid_BxS, method="encode")
  cache = init_cache(model, B, S, max_len)

  def step(state, encoded=None):
    i, cache, last_B, done_B, out_BxL = state
    logits_BxV, cache = decode_step(model, params, cache, encoded, last_B, source_valid_BxS)
    logits_BxV = logits_BxV.at[:, list(banned_ids)].set(-jnp.inf)
    if no_repeat_ngram:
      logits_BxV = ban_repeated_ngrams(logits_BxV, out_BxL, i, no_repeat_ngram, eos_id, -jnp.inf)
    token_B = jnp.where(done_B, eos_id, jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32))
    return i + 1, cache, token_B, done_B | (token_B == eos_id), out_BxL.at[:, i].set(token_B)

  state = (
    jnp.int32(0),
    cache,
    jnp.full((B,), bos_id, jnp.int32),
    jnp.zeros((B,), bool),
    jnp.full((B, max_len), eos_id, jnp.int32),
  )
  state = step(state, encoded_BxSxD)
  *_, out_BxL = jax.lax.while_loop(lambda s: (s[0] < max_len) & ~jnp.all(s[3]), step, state)
  return out_BxL


# ---------------------------------------------------------------------------------------------
# Many sentences: batching and text.

SOURCE_BUCKET = 16  # source lengths are padded up to a multiple of this: few shapes compile


def check_sources(sources: Sequence[Sequence[int]], max_len: int, vocab_size: int) -> list[list[int]]:
  sources = check_token_lists(sources, vocab_size, "sentence", "there is nothing to translate")
  for i, ids in enumerate(sources):
    if len(ids) > max_len:
      raise ConfigError(
        f"sentence {i} is {len(ids)} tokens, longer than the model's max_len={max_len}; split it into shorter sentences"
      )
  return sources


def _decoded(search, params, sources, B: int, max_len: int, mesh, rules, rows: list[int]) -> np.ndarray:
  """The best hypotheses of these sources (`rows`, sorted by length), B x L on the host."""
  S = min(round_up(len(sources[rows[-1]]), SOURCE_BUCKET), max_len)
  source_BxS, valid_BxS = pad_rows([sources[i] for i in rows], B, S, left=False)
  if mesh is None:
    tokens = search(params, source_BxS, valid_BxS)
  else:
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      tokens = search(params, *put_on_mesh(mesh, rules, source_BxS, valid_BxS))
  return multihost_utils.process_allgather(tokens, tiled=True) if jax.process_count() > 1 else np.asarray(tokens)


def translate_ids(
  model: Transformer,
  params,
  sources: Sequence[Sequence[int]],
  *,
  eos_id: int,
  bos_id: int | None = None,
  beam_size: int = 1,
  alpha: float = 0.6,
  penalty: str = "gnmt",
  max_len: int | None = None,
  no_repeat_ngram: int = 0,
  banned_ids: Sequence[int] = (),
  batch_size: int = 32,
  mesh=None,
  rules: tuple = (),
) -> list[list[int]]:
  """The best translation of each source (token ids, without <eos>), in order: greedy for
  beam_size 1, else beam search (`penalty`: its length penalty, `length_penalty`). The decoder
  starts from `bos_id`: by default <eos> (<|endoftext|>), as our translation runs train; Marian's
  models start from their <pad>, which `banned_ids` keeps out of their translations
  (`Tokenizer.decoder_start_id`, `Tokenizer.never_generated`).

  Sources are sorted by length and batched (batch_size rows, lengths padded to a multiple of 16),
  so few shapes compile. With `mesh`, batches are split over its data-parallel devices; with the
  CPU's kernels on one CPU device, batches decode at once, one per core
  (transformer.kernels.decode_threads)."""
  cfg = model.config
  max_len = max_len or cfg.max_len
  search = _search(
    model,
    beam_size=beam_size,
    max_len=max_len,
    alpha=alpha,
    penalty=penalty,
    bos_id=eos_id if bos_id is None else bos_id,
    eos_id=eos_id,
    no_repeat_ngram=no_repeat_ngram,
    banned_ids=tuple(sorted(int(i) for i in banned_ids)),
  )
  sources = check_sources(sources, cfg.max_len, cfg.vocab_size)
  B = batch_rows(batch_size, mesh, rules)
  order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
  out: list[list[int]] = [[] for _ in sources]
  batches = [order[start : start + B] for start in range(0, len(order), B)]

  decode = functools.partial(_decoded, search, params, sources, B, cfg.max_len, mesh, rules)
  threads = decode_threads.threads(kernels.resolve(cfg.kernels), mesh)
  for rows, best_BxL in zip(batches, decode_threads.on_threads(decode, batches, threads)):
    for r, i in enumerate(rows):
      out[i] = until_stop(best_BxL[r], eos_id)
  return out


def _search(model: Transformer, *, beam_size: int, alpha: float, penalty: str, **decoding):
  """(params, source_BxS, valid_BxS) -> the best translation of each source (B x max_len): greedy
  decoding for beam_size 1, else beam search's best beam. `decoding`: what the two share (max_len,
  bos_id, eos_id, no_repeat_ngram, banned_ids), checked here once."""
  max_len, limit = decoding["max_len"], model.config.max_len
  if beam_size < 1 or not 2 <= max_len <= limit:
    raise ConfigError(f"beam_size must be >= 1 and max_len in [2, {limit}], got {beam_size} and {max_len}")
  if decoding["no_repeat_ngram"] < 0:
    raise ConfigError(f"no_repeat_ngram must be >= 0 (0: repeats allowed), got {decoding['no_repeat_ngram']}")
  if penalty not in PENALTIES:
    raise ConfigError(f"unknown length penalty {penalty!r}; choose one of {', '.join(PENALTIES)}")
  if beam_size == 1:
    return functools.partial(greedy, model=model, **decoding)
  beams = functools.partial(
    beam_search, model=model, beam_size=beam_size, alpha=float(alpha), penalty=penalty, **decoding
  )
  return lambda *args: beams(*args)[0][:, 0]  # the best of each sentence's beams


def translate_texts(model: Transformer, params, tokenizer, texts: Sequence[str], **options) -> list[str]:
  """Sentences in, sentences out (see `translate_ids` for the options), the decoder started and
  restrained as the tokenizer says (`decoder_start_id`, `never_generated`)."""
  if isinstance(texts, str):
    raise ConfigError("texts must be a list of sentences, not one string")
  ids = [tokenizer.encode(t.strip()) for t in texts]
  hyps = translate_ids(model, params, ids, **special_ids(tokenizer), **options)
  return [tokenizer.decode(h) for h in hyps]


def special_ids(tokenizer) -> dict:
  """`translate_ids`' eos_id, bos_id and banned_ids for a model that reads `tokenizer`'s tokens."""
  return {"eos_id": tokenizer.eot_id, "bos_id": tokenizer.decoder_start_id, "banned_ids": tokenizer.never_generated}
