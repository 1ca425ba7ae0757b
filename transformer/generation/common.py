"""What GPT sampling and encoder-decoder search share: checking token-id inputs, padding a list of
sequences into one bucketed batch with filler rows, putting it on the mesh, an empty KV cache,
cutting outputs at the stop token."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from transformer import sharding
from transformer.errors import ConfigError


def check_token_lists(lists: Sequence[Sequence[int]], vocab_size: int, what: str, if_empty: str) -> list[list[int]]:
  """Token-id lists (prompts, source sentences) as ints; an empty one or an id outside the
  vocabulary is an error naming which `what` it is (`if_empty` says what to do about an empty one)."""
  if isinstance(lists, (str, bytes)) or not len(lists):
    raise ConfigError(f"{what}s must be a non-empty list of token-id lists (encode text with a tokenizer)")
  out = []
  for i, ids in enumerate(lists):
    ids = [int(t) for t in ids]
    if not ids:
      raise ConfigError(f"{what} {i} is empty; {if_empty}")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
      raise ConfigError(
        f"{what} {i} has token id {bad[0]} outside the model's vocabulary [0, {vocab_size}); "
        f"was it encoded with another tokenizer?"
      )
    out.append(ids)
  return out


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def batch_rows(num_rows: int, mesh, rules) -> int:
  """`num_rows` rounded up to a multiple of the data-parallel size (1 without a mesh)."""
  dp = sharding.data_parallel_size(mesh, rules) if mesh is not None else 1
  return round_up(max(num_rows, 1), dp)


def pad_rows(rows: Sequence[Sequence[int]], num_rows: int, length: int, *, left: bool) -> tuple[np.ndarray, np.ndarray]:
  """(ids_BxL, valid_BxL): `rows` padded to `length` on the left (prompts, so that every one ends
  where generation starts) or the right (sources), then filler copies of row 0 up to `num_rows`
  (the caller drops their outputs). Shapes are fixed by the caller's buckets: few compile."""
  ids_BxL = np.zeros((num_rows, length), np.int32)
  valid_BxL = np.zeros((num_rows, length), bool)
  for b in range(num_rows):
    row = rows[b] if b < len(rows) else rows[0]
    cols = slice(length - len(row), length) if left else slice(0, len(row))
    ids_BxL[b, cols], valid_BxL[b, cols] = row, True
  return ids_BxL, valid_BxL


def put_on_mesh(mesh, rules, *arrays: np.ndarray) -> tuple:
  """Host batches -> global arrays split over the mesh's data-parallel devices (each process puts
  in its own shards), or unchanged without a mesh."""
  if mesh is None:
    return arrays
  return sharding.global_array(arrays, sharding.batch_sharding(mesh, rules))


def empty_cache(init: Callable[[], dict]):
  """Zeros shaped like the "cache" collection that `init()` (a model.init in decode mode) makes;
  only its shapes are traced, no forward pass runs."""
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(init)["cache"])


def grow_cache(cache, shapes):
  """`cache` zero-padded at the end of whichever axis `shapes` (a cache's `jax.eval_shape`) makes
  longer: its length axis, wherever a layer stack puts it. The new slots hold no token (valid =
  False), so no query attends to them before a step writes them."""
  grow = lambda x, s: jnp.pad(x, [(0, n - m) for m, n in zip(x.shape, s.shape)]) if x.shape != s.shape else x
  return jax.tree.map(grow, cache, shapes)


def until_stop(tokens, stop_id: int | None) -> list[int]:
  """The tokens before the first `stop_id` (all of them if there is none)."""
  tokens = np.asarray(tokens).tolist()
  return tokens[: tokens.index(stop_id)] if stop_id in tokens else tokens
