"""grain input pipelines over prepared token shards.

Language modelling examples are `seq_len + 1` tokens (inputs are the first `seq_len`, targets the
last `seq_len`), drawn either as
  windows  random windows anywhere in the split's token stream (nanoGPT), or
  packed   the stream cut into consecutive chunks, shuffled once per epoch: every token is seen
           once an epoch; documents are packed back to back with <|endoftext|> between them.
Example k of the global batch of step s is the same whatever the number of processes: process p
of P reads the slice [p*B/P, (p+1)*B/P) of every global batch. The pipeline is a grain MapDataset,
so its iterator's `get_state()` is the exact data position to save with a checkpoint.
"""

from __future__ import annotations

import grain
import numpy as np

from transformer.data.prepare import Prepared
from transformer.data.sources import DataError

SAMPLING = ("windows", "packed")


def _window_start(seed: int, index: int, high: int) -> int:
  return int(np.random.default_rng([seed, index]).integers(0, high))


def lm_train_dataset(prepared: Prepared, *, seq_len: int, global_batch: int, seed: int,
                     sampling: str = "windows", process_index: int = 0, process_count: int = 1,
                     split: str = "train") -> grain.MapDataset:
  """Batches (B/P, seq_len + 1) of int32 token ids for this process, indexable by step (infinite)."""
  if sampling not in SAMPLING:
    raise DataError(f"unknown data.sampling {sampling!r}; choose one of {', '.join(SAMPLING)}")
  if global_batch % process_count:
    raise DataError(f"batch_size={global_batch} is not divisible by the {process_count} processes")
  tokens = prepared.tokens(split)
  example_len = seq_len + 1
  if len(tokens) < example_len + 1:
    raise DataError(f"the {split} split of {prepared.directory} has {len(tokens)} tokens, fewer than one "
                    f"example of seq_len+1={example_len}; use a shorter seq_len or more data")
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
    return np.asarray(tokens[start:start + example_len], dtype=np.int32)

  return base.map(example).batch(local, drop_remainder=True)


def lm_eval_batches(prepared: Prepared, *, seq_len: int, batch_size: int, num_batches: int,
                    split: str = "validation") -> np.ndarray:
  """Fixed, evenly spaced windows (num_batches, batch_size, seq_len + 1): the same every evaluation."""
  tokens = prepared.tokens(split)
  example_len = seq_len + 1
  if len(tokens) < example_len:
    raise DataError(f"the {split} split of {prepared.directory} has {len(tokens)} tokens, fewer than one "
                    f"example of seq_len+1={example_len}; use a shorter seq_len or a larger validation_fraction")
  n = num_batches * batch_size
  starts = np.linspace(0, len(tokens) - example_len, n).astype(np.int64)
  windows = np.stack([np.asarray(tokens[s:s + example_len], dtype=np.int32) for s in starts])
  return windows.reshape(num_batches, batch_size, example_len)
