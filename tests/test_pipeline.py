"""The language-modelling input pipeline (transformer.data.pipeline): deterministic, resumable,
sharded over processes; packed epochs cover every chunk once."""

import numpy as np
import pytest

from transformer import data
from transformer.data import pipeline
from transformer.errors import DataError


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
  assert not np.array_equal(
    batches[1], pipeline.lm_train_dataset(prepared, seq_len=32, global_batch=8, seed=4, sampling=sampling)[1]
  )
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
  assert any(np.array_equal(tokens[s : s + 33], row) for s in starts)


def test_packed_covers_every_chunk_once_per_epoch(prepared):
  L = 4096
  tokens = np.asarray(prepared.tokens("train"), dtype=np.int32)
  n_chunks = (len(tokens) - 1) // L
  chunk_of = {tokens[c * L : c * L + L + 1].tobytes(): c for c in range(n_chunks)}
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
  np.testing.assert_array_equal(
    eval_batches, pipeline.lm_eval_batches(prepared, seq_len=16, batch_size=4, num_batches=3)
  )
