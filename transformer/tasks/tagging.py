"""config.task="tagging": a label for every word (part of speech), by an encoder-only Transformer, a
bidirectional LSTM (or, to see what reading only leftwards costs, a GPT or a one-way LSTM) with a
linear head at each position. With a subword tokenizer a word's tag is predicted at its first token;
its other tokens count in no loss or accuracy (tokenizers.word_pieces).

Tag sets (config.data.tagset):
  brown      the tags as the data writes them (the Brown corpus: 472 tags like at, nn-tl, np$, ppss+bem)
  universal  the 12 universal tags of Petrov, Das & McDonald (2012): NOUN VERB ADJ ADV PRON DET ADP
             NUM CONJ PRT . X. A Brown tag maps by its base: "fw-" (foreign word) is X; the -tl
             (title), -hl (headline) and -nc (cited) suffixes and a negation's * are dropped; a
             contraction (ppss+bem, "I'm") takes its first part's tag
Metrics: token accuracy over the words (dev at each evaluation; dev and test at the end), per-tag
accuracy of the most frequent tags, and beside them the most-frequent-tag baseline: each word's
(first token's) most frequent tag in training, the overall most frequent tag for unseen ones.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

import jax
import numpy as np

from transformer import models
from transformer.config import RunConfig, at
from transformer.errors import ConfigError, DataError
from transformer.models import classifier
from transformer.tasks import labelled

TAGSETS = ("brown", "universal")

# Brown base tags -> universal tags (Petrov et al. 2012, their en-brown mapping).
_UNIVERSAL = {
  "ADJ": "jj jj$ jjr jjs jjt ap",
  "ADP": "in cs",
  "ADV": "rb rb$ rbr rbt rn ql qlp wql wrb *",
  "CONJ": "cc",
  "DET": "at dt dt$ dti dts dtx abx ex wdt",
  "NOUN": "nn nn$ nns nns$ np np$ nps nps$ nr nr$ nrs pn pn$",
  "NUM": "cd cd$ od",
  "PRON": "pp$ pp$$ ppl ppls ppo pps ppss prp prp$ wp$ wpo wps",
  "PRT": "abl abn ap$ rp to",
  "VERB": "vb vbd vbg vbn vbz md be bed bedz beg bem ben ber bez do dod doz hv hvd hvg hvn hvz",
  "X": "fw uh nil",
  ".": ". , : ; ( ) -- ' '' `` !",
}
BROWN_TO_UNIVERSAL = {brown: universal for universal, tags in _UNIVERSAL.items() for brown in tags.split()}


def universal_tag(brown: str) -> str:
  """The universal tag of a Brown tag (see the module docstring for the rule)."""
  tag = brown.lower()
  if tag.startswith("fw-"):
    return "X"
  tag = tag.split("+")[0]
  while tag[-3:] in ("-tl", "-hl", "-nc"):
    tag = tag[:-3]
  if tag != "*":
    tag = tag.rstrip("*")
  if tag not in BROWN_TO_UNIVERSAL:
    raise DataError(f"tag {brown!r} is not a Brown tag that maps to a universal one; use --config.data.tagset=brown")
  return BROWN_TO_UNIVERSAL[tag]


def map_tag(tag: str, tagset: str) -> str:
  return universal_tag(tag) if tagset == "universal" else tag


@dataclasses.dataclass(frozen=True)
class TaggingConfig(labelled.LabelledConfig):  # + max_len (a longer sentence: rows), batches, init_from
  tagset: str = at("data.tagset", "brown")  # brown | universal (see the module docstring)

  def check(self, run: RunConfig, data_parallel: int | None) -> None:
    super().check(run, data_parallel)
    if self.tagset not in TAGSETS:
      raise ConfigError(f"--config.data.tagset={self.tagset!r} is unknown; choose one of {', '.join(TAGSETS)}")


class Tagging(labelled.LabelledTask):
  """A tag per word of config.data (a `tagged` data set: brown, or files of word/TAG sentences)."""

  name = "tagging"
  Config = TaggingConfig
  families = ("encoder", "lstm", "gpt")
  data_kind = "tagged"
  per_token = True

  def __init__(self, run: RunConfig, tokenizer, mesh, data=None, labels=None):
    self._data_tags = None
    if labels is not None:
      self._tags = tuple(labels)
    elif data is not None:
      self._data_tags = list(data.manifest["tags"])
      mapped = [map_tag(t, run.task_config.tagset) for t in self._data_tags]
      self._tags = tuple(sorted(set(mapped))) if run.task_config.tagset == "universal" else tuple(self._data_tags)
    else:
      raise ConfigError("a tagger's tags come from its data; give the data or the labels")
    super().__init__(run, tokenizer, mesh, data)
    if data is not None:
      index = {t: i for i, t in enumerate(self._tags)}
      self._to_tag = np.array(
        [index[map_tag(t, self.config.tagset)] for t in self._data_tags] + [-1], np.int32
      )  # the last entry: -1 (a label of -1, no tag) stays -1
      self.examples = {split: self._examples(split) for split in ("train", "validation", "test")}

  @property
  def labels(self) -> tuple[str, ...]:
    return self._tags

  def build_model(self, model_config):
    return classifier.TokenClassifier(model_config, len(self._tags), models.body_fields(model_config).dropout_rate)

  def _examples(self, split: str) -> list:
    d, L = self.data, self.config.max_len
    rows, tokens, tags = d.index(split), d.tokens(split), self._to_tag[d.labels(split)]
    examples, cut = [], 0
    for _, start, end in rows:
      cut += end - start > L
      for s in range(start, end, L):  # every token is scored, in rows of at most max_len
        examples.append((np.asarray(tokens[s : min(s + L, end)], np.int32), tags[s : min(s + L, end)]))
    if jax.process_index() == 0:
      words = sum(int((t >= 0).sum()) for _, t in examples)
      print(
        f"{split}: {len(rows)} sentences, {words} words ({self.config.tagset} tags: {len(self._tags)}); "
        f"{cut} longer than max_len={L} tokens, split into rows"
      )
    if not examples and split != "test":
      raise DataError(f"the {split} split of {d.directory} has no sentence; give more data or a larger fraction")
    return examples

  def predictions(self, params, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(predicted tag, gold tag, first token id) of every word of `split`."""
    examples = self.examples[split]
    probs = self.probabilities(params, self.batches(split))
    predicted, gold, first = [], [], []
    for (ids, tags), p in zip(examples, probs):
      scored = tags >= 0
      predicted.append(p[: len(ids)].argmax(-1)[scored])
      gold.append(tags[scored])
      first.append(ids[scored])
    return np.concatenate(predicted), np.concatenate(gold), np.concatenate(first)

  def evaluate(self, params, eval_fn, batches) -> dict:
    sums = [tuple(map(float, eval_fn(params, self.put_global(b)))) for b in batches]
    loss = sum(s for s, _ in sums) / max(sum(n for _, n in sums), 1.0)
    predicted, gold, _ = self.predictions(params, "validation")
    return {"val_loss": loss, "dev_accuracy": float((predicted == gold).mean())}

  def describe(self, result: dict) -> str:
    return f"validation loss {result['val_loss']:.4f}, dev token accuracy {result['dev_accuracy']:.2%}"

  def baseline(self):
    """The most-frequent-tag tagger of the training split: first token id -> tag."""
    counts = collections.defaultdict(collections.Counter)
    overall = collections.Counter()
    for ids, tags in self.examples["train"]:
      for t, g in zip(ids[tags >= 0], tags[tags >= 0]):
        counts[int(t)][int(g)] += 1
        overall[int(g)] += 1
    best = {t: c.most_common(1)[0][0] for t, c in counts.items()}
    default = overall.most_common(1)[0][0]
    return lambda first: np.array([best.get(int(t), default) for t in first])

  def finish(self, params, workdir: Path, mean_of_last) -> dict:
    """Token accuracy on dev and test beside the most-frequent-tag baseline; per-tag accuracy of the
    10 most frequent test tags."""
    guess = self.baseline()
    out, lines = {}, []
    per_tag = None
    for split, short in (("validation", "dev"), ("test", "test")):
      if not self.examples[split]:
        continue
      predicted, gold, first = self.predictions(params, split)
      accuracy, base = float((predicted == gold).mean()), float((guess(first) == gold).mean())
      out.update({f"{short}_accuracy": accuracy, f"{short}_baseline_accuracy": base})
      lines.append(f"  {short:<5} {len(gold):>8} {accuracy:9.2%} {base:9.2%}")
      per_tag = (short, predicted, gold)
    if jax.process_index() == 0 and per_tag is not None:
      short, predicted, gold = per_tag
      common = np.bincount(gold, minlength=len(self._tags)).argsort()[::-1][:10]
      tag_lines = [
        f"  {self._tags[t]:<8} {(gold == t).sum():>7} {(predicted[gold == t] == t).mean():9.2%}"
        for t in common
        if (gold == t).any()
      ]
      print(
        f"\n{self.config.tagset} tags ({len(self._tags)}); token accuracy (the baseline: each word's most "
        f"frequent training tag):\n  split    words     model  baseline\n"
        + "\n".join(lines)
        + f"\nper tag, the 10 most frequent ({short}):\n  tag        words  accuracy\n"
        + "\n".join(tag_lines)
      )
    return out
