"""grain input pipelines over prepared token shards.

Language modelling examples are `seq_len + 1` tokens (inputs are the first `seq_len`, targets the
last `seq_len`), drawn either as
  windows  random windows anywhere in the split's token stream (nanoGPT), or
  packed   the stream cut into consecutive chunks, shuffled once per epoch: every token is seen
           once an epoch; documents are packed back to back with <|endoftext|> between them (which
           the GPT reads as separate documents: transformer.tasks.lm, data.separate_documents).
Example k of the global batch of step s is the same whatever the number of processes: process p
of P reads the slice [p*B/P, (p+1)*B/P) of every global batch. The pipeline is a grain MapDataset,
so its iterator's `get_state()` is the exact data position to save with a checkpoint.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from transformer.data.prepare import Prepared
from transformer.errors import DataError

if TYPE_CHECKING:
  import grain

SAMPLING = ("windows", "packed")


def _window_start(seed: int, index: int, high: int) -> int:
  return int(np.random.default_rng([seed, index]).integers(0, high))


def lm_train_dataset(
  prepared: Prepared,
  *,
  seq_len: int,
  global_batch: int,
  seed: int,
  sampling: str = "windows",
  process_index: int = 0,
  process_count: int = 1,
  split: str = "train",
) -> grain.MapDataset:
  """Batches (B/P, seq_len + 1) of int32 token ids for this process, indexable by step (infinite)."""
  import grain  # here: a third of a second that the programs which only restore a model need not pay

  if sampling not in SAMPLING:
    raise DataError(f"unknown data.sampling {sampling!r}; choose one of {', '.join(SAMPLING)}")
  if global_batch % process_count:
    raise DataError(f"batch_size={global_batch} is not divisible by the {process_count} processes")
  tokens = prepared.tokens(split)
  example_len = seq_len + 1
  if len(tokens) < example_len + 1:
    raise DataError(
      f"the {split} split of {prepared.directory} has {len(tokens)} tokens, fewer than one "
      f"example of seq_len+1={example_len}; use a shorter seq_len or more data"
    )
  local = global_batch // process_count
  if sampling == "windows":
    high = len(tokens) - example_len + 1
    start_of = lambda g: _window_start(seed, g, high)
    base = grain.MapDataset.range(1 << 62)
  else:
    chunks = (len(tokens) - 1) // seq_len
    # One shuffled pass over the chunks per epoch, epochs repeated (each with its own order).
    order = grain.MapDataset.range(chunks).shuffle(seed=seed).repeat()
    start_of = lambda g: int(order[g]) * seq_len
    base = grain.MapDataset.range(1 << 62)

  def example(j: int) -> np.ndarray:
    # Local example j of this process -> its global example index.
    g = (j // local) * global_batch + process_index * local + j % local
    start = start_of(g)
    return np.asarray(tokens[start : start + example_len], dtype=np.int32)

  return base.map(example).batch(local, drop_remainder=True)


def lm_eval_batches(
  prepared: Prepared, *, seq_len: int, batch_size: int, num_batches: int, split: str = "validation"
) -> np.ndarray:
  """Fixed, evenly spaced windows (num_batches, batch_size, seq_len + 1): the same every evaluation."""
  tokens = prepared.tokens(split)
  example_len = seq_len + 1
  if len(tokens) < example_len:
    raise DataError(
      f"the {split} split of {prepared.directory} has {len(tokens)} tokens, fewer than one "
      f"example of seq_len+1={example_len}; use a shorter seq_len or a larger validation_fraction"
    )
  n = num_batches * batch_size
  starts = np.linspace(0, len(tokens) - example_len, n).astype(np.int64)
  windows = np.stack([np.asarray(tokens[s : s + example_len], dtype=np.int32) for s in starts])
  return windows.reshape(num_batches, batch_size, example_len)


# ---------------------------------------------------------------------------------------------
# Translation: sentence pairs, bucketed by length under a token budget.


def pair_columns(direction: str, languages: tuple[str, str] = ("src", "tgt")) -> tuple[str, str]:
  """("src", "tgt") or ("tgt", "src"): which stored column is the source for `direction` "a-b"."""
  forward, backward = "-".join(languages), "-".join(reversed(languages))
  if direction == forward:
    return "src", "tgt"
  if direction == backward:
    return "tgt", "src"
  raise DataError(f"unknown direction {direction!r} for this data set; choose {forward!r} or {backward!r}")


def translation_pairs(
  prepared: Prepared, split: str, *, direction: str, max_len: int, languages: tuple[str, str] = ("src", "tgt")
) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict]:
  """The split's (source ids, target ids) pairs, and counts of those dropped (never truncated):
  `too_long` (a side longer than max_len - 1, leaving room for <|endoftext|>) and `empty`."""
  src_col, tgt_col = pair_columns(direction, languages)
  index = prepared.index(split)
  tokens = {"src": prepared.tokens(split, "src"), "tgt": prepared.tokens(split, "tgt")}
  pairs, dropped = [], {"too_long": 0, "empty": 0}
  for _, s0, s1, t0, t1 in index:
    ends = {"src": (s0, s1), "tgt": (t0, t1)}
    src = np.asarray(tokens[src_col][slice(*ends[src_col])], np.int32)
    tgt = np.asarray(tokens[tgt_col][slice(*ends[tgt_col])], np.int32)
    if not len(src) or not len(tgt):
      dropped["empty"] += 1
    elif max(len(src), len(tgt)) > max_len - 1:
      dropped["too_long"] += 1
    else:
      pairs.append((src, tgt))
  return pairs, dropped


def bucket_length(length: int, max_len: int, step: int = 8) -> int:
  return min(-(-length // step) * step, max_len)


def bucket_rows(length: int, max_tokens: int, batch_multiple: int) -> int:
  """Rows of a full batch of `length`-token pairs under `max_tokens`, a multiple of `batch_multiple`."""
  return max(batch_multiple, (max_tokens // length) // batch_multiple * batch_multiple)


def translation_batches(
  pairs,
  *,
  max_tokens: int,
  max_len: int,
  eot_id: int,
  seed: int,
  bos_id: int | None = None,
  epoch: int = 0,
  batch_multiple: int = 1,
  shuffle: bool = True,
) -> list[dict]:
  """One epoch of padded batches, each pair once. Pairs are grouped by padded length (a multiple of
  8, so few shapes compile) and each batch holds at most `max_tokens` padded tokens per side (its
  size rounded down to `batch_multiple`, the data-parallel size); a bucket's last batch is filled
  up to batch_multiple * 2^k rows. Each batch has
    source, source_valid (B, S); target_in (<|endoftext|> + target), target_out (target +
    <|endoftext|>), target_valid (B, T); the length buckets S and T are those of the longest pair.
  `bos_id`: target_in's first token when it is not <|endoftext|> (`eot_id`): Marian's <pad>."""
  if not pairs:
    raise DataError("no sentence pairs left to batch (all were empty or longer than max_len)")
  start_id = eot_id if bos_id is None else bos_id  # target_in's first token
  rng = np.random.default_rng([seed, epoch])
  order = rng.permutation(len(pairs)) if shuffle else np.arange(len(pairs))
  buckets: dict[int, list[int]] = {}
  for i in order:
    src, tgt = pairs[i]
    buckets.setdefault(bucket_length(max(len(src), len(tgt) + 1), max_len), []).append(i)
  batches = []
  for length, members in sorted(buckets.items()):
    size = bucket_rows(length, max_tokens, batch_multiple)
    for start in range(0, len(members), size):
      chunk = members[start : start + size]
      real = len(chunk)
      # Fill a bucket's last batch with repeats of its first pair, which weigh nothing (target_valid
      # False), up to batch_multiple times a power of two (at most the full size): few shapes compile.
      fill = batch_multiple
      while fill < real:
        fill *= 2
      chunk += chunk[:1] * (min(fill, size) - real)
      B = len(chunk)
      batch = {k: np.zeros((B, length), np.int32) for k in ("source", "target_in", "target_out")}
      batch.update(source_valid=np.zeros((B, length), bool), target_valid=np.zeros((B, length), bool))
      for row, i in enumerate(chunk):
        src, tgt = pairs[i]
        batch["source"][row, : len(src)] = src
        batch["source_valid"][row, : len(src)] = True
        batch["target_in"][row, : len(tgt) + 1] = np.concatenate([[start_id], tgt])
        batch["target_out"][row, : len(tgt) + 1] = np.concatenate([tgt, [eot_id]])
        batch["target_valid"][row, : len(tgt) + 1] = row < real
      batches.append(batch)
  if shuffle:
    batches = [batches[i] for i in rng.permutation(len(batches))]
  return batches


BATCHING = ("packed", "bucketed")


def packed_batches(
  pairs,
  *,
  max_tokens: int,
  max_len: int,
  eot_id: int,
  seed: int,
  bos_id: int | None = None,
  epoch: int = 0,
  batch_multiple: int = 1,
  shuffle: bool = True,
  source_len: int | None = None,
) -> list[dict]:
  """One epoch of batches of one shape, each pair once: pairs are packed back to back into rows of
  `max_len` tokens per side (in order, a new row when the next pair does not fit: the flax WMT
  example's packing), `bucket_rows(max_len, max_tokens, batch_multiple)` rows a batch. The keys of
  `translation_batches`, plus source_segments (B, S) and target_segments (B, T): which pair of its
  row (1, 2, ...; 0 is padding) each token belongs to. A pair attends only to itself
  (models.seq2seq) and its positions start at 0, so packing changes no pair's loss. `source_len`:
  source rows longer than the target rows (sources that carry a fuzzy match: data.fuzzy_match_tokens)."""
  if not pairs:
    raise DataError("no sentence pairs left to batch (all were empty or longer than max_len)")
  start_id = eot_id if bos_id is None else bos_id  # target_in's first token
  source_len = source_len or max_len
  rng = np.random.default_rng([seed, epoch])
  order = rng.permutation(len(pairs)) if shuffle else np.arange(len(pairs))
  rows: list[list[int]] = [[]]
  used_src = used_tgt = 0
  for i in order:
    src, tgt = pairs[i]
    if rows[-1] and (used_src + len(src) > source_len or used_tgt + len(tgt) + 1 > max_len):
      rows.append([])
      used_src = used_tgt = 0
    rows[-1].append(int(i))
    used_src, used_tgt = used_src + len(src), used_tgt + len(tgt) + 1
  size = bucket_rows(max_len, max_tokens, batch_multiple)
  rows += [[]] * (-len(rows) % size)  # the last batch's empty rows weigh nothing
  batches = []
  for start in range(0, len(rows), size):
    batch = {
      k: np.zeros((size, source_len if k.startswith("source") else max_len), np.int32)
      for k in ("source", "source_segments", "target_in", "target_out", "target_segments")
    }
    for r, members in enumerate(rows[start : start + size]):
      s = t = 0
      for segment, i in enumerate(members, start=1):
        src, tgt = pairs[i]
        batch["source"][r, s : s + len(src)] = src
        batch["source_segments"][r, s : s + len(src)] = segment
        batch["target_in"][r, t : t + len(tgt) + 1] = np.concatenate([[start_id], tgt])
        batch["target_out"][r, t : t + len(tgt) + 1] = np.concatenate([tgt, [eot_id]])
        batch["target_segments"][r, t : t + len(tgt) + 1] = segment
        s, t = s + len(src), t + len(tgt) + 1
    batch["source_valid"] = batch["source_segments"] > 0
    batch["target_valid"] = batch["target_segments"] > 0
    batches.append(batch)
  return batches


class TranslationBatches:
  """Training batches of `packed_batches` (or, with batching="bucketed", `translation_batches`),
  epoch after epoch, each epoch in a new order. Like a grain iterator, `get_state()`/`set_state()`
  are the exact data position (epoch, batch) that a checkpoint saves, so a resumed run sees the
  batches an uninterrupted one would.

  `extra` pairs (a lexicon) join each epoch `extra_per_epoch` at a time: the next ones of a fixed
  shuffled order of them, going round, so that every extra pair is seen before any is seen again."""

  def __init__(
    self,
    pairs,
    *,
    max_tokens: int,
    max_len: int,
    eot_id: int,
    seed: int,
    bos_id: int | None = None,
    batch_multiple: int = 1,
    batching: str = "packed",
    extra=(),
    extra_per_epoch: int = 0,
    source_len: int | None = None,
  ):
    make = functools.partial(packed_batches, source_len=source_len) if batching == "packed" else translation_batches
    extra_order = np.random.default_rng([seed, 1 << 30]).permutation(len(extra)) if len(extra) else None

    def epoch_pairs(epoch: int) -> list:
      if not extra_per_epoch or extra_order is None:
        return pairs
      taken = extra_order[(epoch * extra_per_epoch + np.arange(extra_per_epoch)) % len(extra)]
      return list(pairs) + [extra[i] for i in taken]

    self._make = lambda epoch: make(
      epoch_pairs(epoch),
      max_tokens=max_tokens,
      max_len=max_len,
      eot_id=eot_id,
      bos_id=bos_id,
      seed=seed,
      epoch=epoch,
      batch_multiple=batch_multiple,
    )
    self.epoch, self.index, self._batches = 0, 0, None

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self._batches is None:
      self._batches = self._make(self.epoch)
    if self.index == len(self._batches):
      self.epoch, self.index, self._batches = self.epoch + 1, 0, self._make(self.epoch + 1)
    self.index += 1
    return self._batches[self.index - 1]

  def get_state(self) -> dict:
    return {"epoch": self.epoch, "index": self.index}

  def set_state(self, state: dict) -> None:
    self.epoch, self.index, self._batches = int(state["epoch"]), int(state["index"]), None
