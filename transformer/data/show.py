"""Human-readable views of a prepared data set: counts per split and what tokenization looks like."""

from __future__ import annotations

from transformer.data.prepare import LEXICON, SPLITS, Prepared


def tokenization(prepared: Prepared, split: str = "train", n_tokens: int = 32) -> str:
  """The first tokens of a split, each shown as its text between bars, then the ids."""
  ids = [int(i) for i in prepared.tokens(split)[:n_tokens]]
  pieces = "|".join(repr(prepared.tokenizer.decode([i]))[1:-1] for i in ids)
  return f"|{pieces}|\n{ids}"


def summary(prepared: Prepared) -> str:
  m = prepared.manifest
  tok = m["tokenizer"]
  lines = [
    f"{m['source']} ({m['kind']}) -> {prepared.directory}",
    f"tokenizer {tok['name']}: vocab_size {tok['vocab_size']}, end-of-text id {tok['eot_id']}, "
    f"stored as {m['dtype']}; prepared in {m['seconds']} s",
    f"{'split':<12}{'records':>10}{'documents':>11}{'tokens':>12}{'chars':>12}{'chars/token':>13}",
  ]
  for split in SPLITS + ((LEXICON,) if LEXICON in m["splits"] else ()):
    c = m["splits"][split]
    ratio = f"{c['chars'] / c['tokens']:.2f}" if c["tokens"] else "-"
    lines.append(f"{split:<12}{c['records']:>10}{c['documents']:>11}{c['tokens']:>12}{c['chars']:>12}{ratio:>13}")
  if m["dropped_duplicates"]:
    lines.append(f"dropped {m['dropped_duplicates']} exact duplicate records")
  if LEXICON in m["splits"]:
    c = m["splits"][LEXICON]
    lines.append(
      f"lexicon {m['request']['lexicon']['source']}, for training only: left out {c['duplicates']} "
      f"repeats and {c['held_out']} pairs sharing a side with a validation or test pair"
    )
  if m["kind"] == "text":
    lines += ["first training tokens:", tokenization(prepared)]
  return "\n".join(lines)
