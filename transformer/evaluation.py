"""Scoring a model on text: what `launch.evaluate` reports, for a user's file or a split of a run's data.

Language models: the next-token loss over every token of the text, and from it perplexity and the
text's information in **bits per byte** (and per character): its summed loss in bits over its UTF-8
bytes. Perplexity depends on the tokenizer (a character model predicts ~4 times more, easier,
tokens than a GPT-2 BPE model); bits per byte do not, so any two models compare on one scale. A text
is read as a document that follows <|endoftext|>, so its first token is predicted too, as at the
start of a training document. Text longer than the context is read in windows of `context` tokens;
a `stride` shorter than the context makes them overlap, so that every token but the first window's
is predicted from at least context - stride tokens (Hugging Face's "perplexity of fixed-length
models"), at context / stride times the cost. Each token is predicted once.

Classifiers and taggers: accuracy, macro-F1 and the confusion matrix (`classification.scores`);
translation models: sacreBLEU BLEU and chrF (`metrics.corpus_scores`), as `launch.translate --split`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator

import jax
import numpy as np

from transformer import inference
from transformer.data import sources
from transformer.errors import ConfigError, DataError
from transformer.tasks import classification, tagging
from transformer.tasks.lm import lm_nll


@dataclasses.dataclass(frozen=True)
class TextScore:
  """A language model's loss on a text: `nll` nats over `tokens` predicted tokens, the text being
  `bytes` UTF-8 bytes and `chars` characters long."""

  tokens: int
  nll: float
  bytes: int
  chars: int

  @property
  def loss(self) -> float:  # nats per token
    return self.nll / self.tokens

  @property
  def perplexity(self) -> float:
    return math.exp(min(self.loss, 700.0))

  @property
  def bits_per_token(self) -> float:
    return self.loss / math.log(2)

  @property
  def bits_per_byte(self) -> float:
    return self.nll / math.log(2) / self.bytes

  @property
  def bits_per_char(self) -> float:
    return self.nll / math.log(2) / self.chars


def windows(num_tokens: int, context: int, stride: int) -> Iterator[tuple[int, int, int]]:
  """(start, first scored target, end) of each window over a stream of `num_tokens` tokens: the
  window reads tokens [start, end - 1) and predicts targets [start + 1, end); it scores the targets
  from `first scored target` on, the ones no earlier window scored. Together they score every target
  1 .. num_tokens - 1 once."""
  if not 0 < stride <= context:
    raise ConfigError(f"stride must be in 1..context={context}, got {stride}")
  start, scored = 0, 1  # targets before `scored` are done
  while scored < num_tokens:
    end = min(start + context + 1, num_tokens)
    yield start, scored, end
    scored, start = end, start + stride


@functools.partial(jax.jit, static_argnames=("model", "eot_id"))
def _summed_nll(model, params, batch_BxL1, mask_BxL, eot_id):
  nll_BxL = lm_nll(model, params, batch_BxL1, jax.random.key(0), False, eot_id)
  return (nll_BxL * mask_BxL).sum(dtype=np.float32)


def lm_nll_sum(
  model,
  params,
  tokens: np.ndarray,
  *,
  context: int,
  stride: int = 0,
  batch_size: int = 8,
  eot_id: int | None = None,
  put=lambda batch: batch,
) -> float:
  """The summed next-token loss (nats) of targets 1 .. len(tokens) - 1 of a token stream, read in
  windows (`windows`; stride 0: the context, windows side by side). `eot_id`: rows are read as the
  documents <|endoftext|> separates (a run with data.separate_documents). `put` places a batch on the
  devices (a run's mesh); a batch's rows are padded with empty windows to `batch_size`."""
  total = 0.0
  spans = list(windows(len(tokens), context, stride or context))
  for b in range(0, len(spans), batch_size):
    batch_BxL1 = np.zeros((batch_size, context + 1), np.int32)
    mask_BxL = np.zeros((batch_size, context), np.float32)
    for row, (start, scored, end) in enumerate(spans[b : b + batch_size]):
      batch_BxL1[row, : end - start] = tokens[start:end]
      mask_BxL[row, scored - start - 1 : end - start - 1] = 1.0
    total += float(_summed_nll(model, params, *put((batch_BxL1, mask_BxL)), eot_id))
  return total


def score_text(model, params, tokenizer, text: str, allow_special=False, **options) -> TextScore:
  """`lm_nll_sum` of a text read as one document after <|endoftext|> (`options`: context, stride,
  batch_size, eot_id, put). Special tokens written in the text are refused (the tokenizer's error) unless
  `allow_special` (True, or a set of them) reads them as their ids."""
  if not text:
    raise DataError("the text is empty; give a file with text in it")
  tokens = np.asarray([tokenizer.eot_id, *tokenizer.encode(text, allow_special=allow_special)], np.int32)
  nll = lm_nll_sum(model, params, tokens, **options)
  return TextScore(len(tokens) - 1, nll, len(text.encode("utf-8")), len(text))


def score_stream(model, params, tokenizer, tokens: np.ndarray, **options) -> TextScore:
  """`lm_nll_sum` of a prepared split's token stream (its documents each end with <|endoftext|>),
  after <|endoftext|>; its bytes and characters are those of its text, the separators left out."""
  tokens = np.concatenate([[tokenizer.eot_id], np.asarray(tokens, np.int32)])
  text = tokenizer.decode(tokens[tokens != tokenizer.eot_id])
  nll = lm_nll_sum(model, params, tokens, **options)
  return TextScore(len(tokens) - 1, nll, len(text.encode("utf-8")), len(text))


def confusion_text(confusion: np.ndarray, names, most: int = 12) -> str:
  """A confusion matrix (rows: gold, columns: predicted) as text; with more than `most` classes, the
  `most` most frequent gold classes' rows and columns only."""
  keep = np.argsort(-confusion.sum(1), kind="stable")[:most] if len(names) > most else np.arange(len(names))
  width = max(6, *(len(names[i]) for i in keep)) + 1
  head = "gold \\ predicted".ljust(width + 2) + "".join(names[i].rjust(width) for i in keep)
  rows = [f"  {names[g]:<{width}}" + "".join(f"{confusion[g, p]:>{width}}" for p in keep) for g in keep]
  note = f"\n  ({len(keep)} most frequent of {len(names)} classes)" if len(keep) < len(names) else ""
  return head + "\n" + "\n".join(rows) + note


# --- Labelled files: the rows a classifier, tagger or translation model is scored on. ---


def labelled_rows(path: str, kind: str) -> list[tuple]:
  """The records of a user's file: `label<TAB>text` rows (classification), sentences of `word/TAG`
  tokens (tagged) or `source<TAB>reference` pairs (pairs), each refused with the file and line at fault."""
  rows = [rec for _, _, rec in sources.records(sources.file_source([path], kind))]
  if not rows:
    raise DataError(f"{path} holds no {kind} rows; give one a line")
  return rows


def classifier_scores(trained: inference.Trained, rows: list[tuple[str, str]], where: str) -> dict:
  """Accuracy, macro-F1 and confusion of a classifier on (label, text) rows whose labels are written
  as its training data wrote them (class names, or scores for config.classes binary/three); rows in
  no class (a binary score of 0) are left out and counted."""
  names = trained.task.labels
  gold = classification.classes_of(np.asarray([label for label, _ in rows]), trained.task.config.classes, names, where)
  texts = [text for (_, text), g in zip(rows, gold) if g >= 0]
  predicted = inference.classify(trained, texts).argmax(-1)
  return classification.scores(predicted, gold[gold >= 0], len(names)) | {
    "count": len(texts),
    "left_out": int((gold < 0).sum()),
  }


def tagger_scores(trained: inference.Trained, sentences: list[tuple[tuple[str, str], ...]], where: str) -> dict:
  """Token accuracy, macro-F1 and confusion of a tagger on sentences of (word, tag): a tag is one of
  the model's tags, or a Brown tag that maps to one (a model of universal tags: config.data.tagset)."""
  names, tagset = trained.task.labels, trained.task.config.tagset
  index = {name: i for i, name in enumerate(names)}

  def tag_id(tag: str) -> int:
    if tag in index:
      return index[tag]
    try:
      mapped = tagging.map_tag(tag, tagset)
    except DataError:
      mapped = None
    if mapped not in index:
      shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
      raise DataError(f"{where}: tag {tag!r} is not one the model knows ({tagset} tags: {shown})")
    return index[mapped]

  gold = np.asarray([tag_id(tag) for sentence in sentences for _, tag in sentence], np.int32)
  tags = inference.tag_words(trained, [[word for word, _ in sentence] for sentence in sentences])
  predicted = np.asarray([index[t] for sentence in tags for t in sentence], np.int32)
  return classification.scores(predicted, gold, len(names)) | {"count": len(gold), "left_out": 0}


def split_label_scores(trained: inference.Trained, workdir, split: str) -> dict:
  """`classifier_scores` / `tagger_scores` on a split of the run's own data (`inference.split_task`)."""
  task = inference.split_task(trained, workdir)
  predicted, gold = task.predictions(trained.params, split)[:2]
  if not len(gold):
    raise DataError(f"the {split} split of {task.data.directory} is empty; prepare it with a {split} fraction")
  return classification.scores(predicted, gold, len(task.labels)) | {"count": len(gold), "left_out": 0}
