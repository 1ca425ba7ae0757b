"""Sentence-pair data for translation: direction, dropped pairs (counted), length buckets."""

import pytest

from transformer import data
from transformer.data import pipeline
from transformer.errors import DataError


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  directory = tmp_path_factory.mktemp("pairs")
  tsv = directory / "pairs.tsv"
  lines = [f"ein satz nummer {i}\tsentence number {i}" for i in range(200)]
  lines += ["ganz " * 40 + "lang\t" + "very long " * 30]  # over-long: dropped, counted
  tsv.write_text("\n".join(lines) + "\n")
  out = directory / "prepared"
  data.prepare(data.file_source([str(tsv)], "pairs"), out, data.PrepareOptions(tokenizer="gpt2", seed=0))
  return data.load_prepared(out)


def test_direction_picks_the_source_column(prepared):
  forward, dropped = pipeline.translation_pairs(prepared, "train", direction="src-tgt", max_len=32)
  backward, _ = pipeline.translation_pairs(prepared, "train", direction="tgt-src", max_len=32)
  tok = prepared.tokenizer
  assert tok.decode(forward[0][0]).startswith("ein satz") and tok.decode(forward[0][1]).startswith("sentence")
  assert tok.decode(backward[0][0]) == tok.decode(forward[0][1])
  assert pipeline.pair_columns("en-de", ("de", "en")) == ("tgt", "src")
  with pytest.raises(DataError, match="unknown direction 'fr-en' for this data set; choose 'de-en' or 'en-de'"):
    pipeline.pair_columns("fr-en", ("de", "en"))


def test_over_long_pairs_are_dropped_and_counted_never_truncated(prepared):
  kept, too_long, empty = 0, 0, 0
  for split in ("train", "validation", "test"):
    try:
      pairs, dropped = pipeline.translation_pairs(prepared, split, direction="src-tgt", max_len=32)
    except DataError:  # no such split
      continue
    kept, too_long, empty = kept + len(pairs), too_long + dropped["too_long"], empty + dropped["empty"]
    assert all(len(s) <= 31 and len(t) <= 31 for s, t in pairs)
  assert (kept, too_long, empty) == (200, 1, 0)


def test_batches_are_bucketed_under_a_token_budget_and_cover_every_pair_once(prepared):
  pairs, _ = pipeline.translation_pairs(prepared, "train", direction="src-tgt", max_len=32)
  eot = prepared.tokenizer.eot_id
  batches = pipeline.translation_batches(pairs, max_tokens=200, max_len=32, eot_id=eot, seed=0, batch_multiple=4)
  seen = 0
  for b in batches:
    B, L = b["source"].shape
    assert L % 8 == 0 and B % 4 == 0 and B * L <= max(200, 4 * L)
    assert (b["target_in"][:, 0] == eot).all()
    # target_out is target_in shifted left, ending in <|endoftext|>.
    for row in range(B):
      n = int(b["target_valid"][row].sum())
      if n:
        assert (b["target_in"][row, 1:n] == b["target_out"][row, : n - 1]).all() and b["target_out"][row, n - 1] == eot
    seen += int(b["target_valid"].any(axis=1).sum())
  assert seen == len(pairs)
  again = pipeline.translation_batches(pairs, max_tokens=200, max_len=32, eot_id=eot, seed=0, batch_multiple=4)
  assert all((a["source"] == b["source"]).all() for a, b in zip(batches, again))  # deterministic
  other = pipeline.translation_batches(pairs, max_tokens=200, max_len=32, eot_id=eot, seed=0, epoch=1, batch_multiple=4)
  assert any(
    a["source"].shape != b["source"].shape or (a["source"] != b["source"]).any() for a, b in zip(batches, other)
  )  # a new order each epoch


def test_packed_batches_have_one_shape_and_hold_every_pair_once(prepared):
  pairs, _ = pipeline.translation_pairs(prepared, "train", direction="src-tgt", max_len=32)
  eot = prepared.tokenizer.eot_id
  batches = pipeline.packed_batches(pairs, max_tokens=256, max_len=32, eot_id=eot, seed=0, batch_multiple=4)
  assert {b[k].shape for b in batches for k in b} == {(8, 32)}
  found = []
  for b in batches:
    for row in range(8):
      for segment in range(1, b["source_segments"][row].max() + 1):
        src = b["source"][row][b["source_segments"][row] == segment]
        tgt_in = b["target_in"][row][b["target_segments"][row] == segment]
        tgt_out = b["target_out"][row][b["target_segments"][row] == segment]
        assert tgt_in[0] == eot and tgt_out[-1] == eot and (tgt_in[1:] == tgt_out[:-1]).all()
        found.append((tuple(src), tuple(tgt_out[:-1])))
    assert (b["source_valid"] == (b["source_segments"] > 0)).all()
  assert sorted(found) == sorted((tuple(s), tuple(t)) for s, t in pairs)
  # Dense: the 200 short pairs fill few rows.
  assert len(batches) * 8 < len(pairs) / 2


def _packed_pairs(batch):
  """The (source, target) token tuples of a packed batch."""
  found = []
  for row in range(batch["source"].shape[0]):
    for segment in range(1, batch["source_segments"][row].max() + 1):
      src = batch["source"][row][batch["source_segments"][row] == segment]
      tgt = batch["target_out"][row][batch["target_segments"][row] == segment]
      found.append((tuple(src), tuple(tgt[:-1])))
  return found


def test_lexicon_pairs_join_each_epoch_in_turn_and_resume_exactly(prepared):
  pairs, _ = pipeline.translation_pairs(prepared, "train", direction="src-tgt", max_len=32)
  sentences, lexicon = pairs[:40], pairs[40:]  # 40 "sentences", the rest a stand-in lexicon
  make = lambda: pipeline.TranslationBatches(
    sentences, max_tokens=256, max_len=32, eot_id=prepared.tokenizer.eot_id, seed=3, extra=lexicon, extra_per_epoch=50
  )
  key = lambda p: (tuple(p[0]), tuple(p[1]))
  batches = make()
  epochs = {}
  while batches.epoch < 4:
    batch = next(batches)  # (the epoch moves on when its first batch is taken)
    epochs.setdefault(batches.epoch, []).extend(_packed_pairs(batch))
  sentence_keys, lexicon_keys = [key(p) for p in sentences], [key(p) for p in lexicon]
  assert len(set(lexicon_keys)) == len(lexicon) > 75
  for found in (epochs[e] for e in range(4)):  # every sentence once an epoch, and 50 lexicon pairs
    assert sorted(f for f in found if f in sentence_keys) == sorted(sentence_keys)
    assert len(found) == 40 + 50
  # Every lexicon pair once before any comes again: epochs 0-1 take 100 different ones, 0-2 all of
  # them (fewer than 150) and a few a second time.
  seen = {e: [f for f in epochs[e] if f in lexicon_keys] for e in range(3)}
  assert len(set(seen[0] + seen[1])) == 100 < len(lexicon) < 150
  assert set(seen[0] + seen[1] + seen[2]) == set(lexicon_keys)
  # Resuming from a saved position gives the same batches.
  batches = make()
  for _ in range(7):
    next(batches)
  state = batches.get_state()
  expected = [next(batches) for _ in range(5)]
  resumed = make()
  resumed.set_state(state)
  for want in expected:
    got = next(resumed)
    assert all((got[k] == want[k]).all() for k in want)
