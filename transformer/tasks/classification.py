"""config.task="classification": one label per text (e.g. the sentiment of a movie review), by an
encoder-only Transformer, a GPT (from scratch or fine-tuned: config.init_from) or an LSTM under a
linear head on the pooled states. Cross-entropy per text; accuracy and macro-F1 on the dev split at
each evaluation; on dev and test at the end, with a confusion matrix (confusion_matrix.png).

Classes (config.classes):
  binary  a score's sign (the VADER snippets' mean rating, -4..+4): negative < 0 < positive; the
          37 of 10,605 snippets rated exactly 0 belong to neither and are left out
  three   negative (score <= -1), neutral (-1 < score < 1), positive (score >= 1)
  names   the label column as written (your own `label<TAB>text` file: --config.data.input_files)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np

from transformer import models
from transformer.config import RunConfig
from transformer.errors import ConfigError, DataError
from transformer.models import classifier
from transformer.tasks import labelled

SCHEMES = {"binary": ("negative", "positive"), "three": ("negative", "neutral", "positive"), "names": ()}


@dataclasses.dataclass(frozen=True)
class ClassificationConfig(labelled.LabelledConfig):  # + max_len (a longer text is cut), batches, init_from
  classes: str = "binary"  # binary | three | names (see the module docstring)
  pooling: str = "auto"  # mean | last | first of the real tokens' states; auto: last left-to-right, else mean

  def check(self, run: RunConfig, data_parallel: int | None) -> None:
    super().check(run, data_parallel)
    if self.classes not in SCHEMES:
      raise ConfigError(f"--config.classes={self.classes!r} is unknown; choose one of {', '.join(SCHEMES)}")
    if self.pooling not in ("auto", *classifier.POOLINGS):
      raise ConfigError(
        f"--config.pooling={self.pooling!r} is unknown; choose one of auto, {', '.join(classifier.POOLINGS)}"
      )


def classes_of(labels: np.ndarray, scheme: str, names: tuple[str, ...], where: str) -> np.ndarray:
  """Each label's class index under `scheme` (-1: in no class, e.g. a binary score of 0)."""
  if scheme == "names":
    index = {n: i for i, n in enumerate(names)}
    unknown = sorted(set(labels) - set(index))
    if unknown:
      raise DataError(
        f"{where}: label {str(unknown[0])!r} does not occur in the training split (its classes: {', '.join(names)})"
      )
    return np.array([index[label] for label in labels], np.int32)
  try:
    scores = labels.astype(np.float64)
  except ValueError:
    bad = next(label for label in labels if not _is_number(label))
    raise DataError(f"{where}: label {str(bad)!r} is not a score; for class names set --config.classes=names") from None
  if scheme == "binary":
    return np.where(scores > 0, 1, np.where(scores < 0, 0, -1)).astype(np.int32)
  return np.where(scores >= 1, 2, np.where(scores <= -1, 0, 1)).astype(np.int32)


def _is_number(text: str) -> bool:
  try:
    float(text)
    return True
  except ValueError:
    return False


def scores(predicted: np.ndarray, gold: np.ndarray, num_classes: int) -> dict:
  """Accuracy, macro-F1 (the mean of each class's F1 over the classes that are gold or predicted at
  least once, as scikit-learn's f1_score(average="macro")) and the confusion matrix (rows: gold,
  columns: predicted)."""
  confusion = np.zeros((num_classes, num_classes), np.int64)
  np.add.at(confusion, (gold, predicted), 1)
  tp = np.diag(confusion).astype(float)
  precision = tp / np.maximum(confusion.sum(0), 1)
  recall = tp / np.maximum(confusion.sum(1), 1)
  f1 = np.where(precision + recall > 0, 2 * precision * recall / np.maximum(precision + recall, 1e-12), 0.0)
  seen = (confusion.sum(0) + confusion.sum(1)) > 0
  return {
    "accuracy": float(tp.sum() / max(len(gold), 1)),
    "macro_f1": float(f1[seen].mean()) if seen.any() else 0.0,
    "confusion": confusion,
  }


class Classification(labelled.LabelledTask):
  """A label per text of config.data (a `classification` data set: vader, or `label<TAB>text` files)."""

  name = "classification"
  Config = ClassificationConfig
  data_kind = "classification"
  per_token = False

  def __init__(self, run: RunConfig, tokenizer, mesh, data=None, labels=None):
    scheme = run.task_config.classes
    if labels is not None:
      self._names = tuple(labels)
    elif scheme != "names":
      self._names = SCHEMES[scheme]
    elif data is not None:
      self._names = tuple(sorted(set(data.labels("train"))))
    else:
      raise ConfigError("config.classes='names' takes its classes from the data; give the data or the labels")
    if len(self._names) < 2:
      raise DataError(
        f"the training split has {len(self._names)} class(es): {', '.join(self._names)}; a classifier needs at least 2"
      )
    super().__init__(run, tokenizer, mesh, data)
    if data is not None:
      self.examples = {split: self._examples(split) for split in ("train", "validation", "test")}

  @property
  def labels(self) -> tuple[str, ...]:
    return self._names

  def build_model(self, model_config):
    pooling = self.config.pooling
    if pooling == "auto":
      pooling = classifier.natural_pooling(model_config)
    return classifier.SequenceClassifier(
      model_config, len(self._names), pooling, models.body_fields(model_config).dropout_rate
    )

  def _examples(self, split: str) -> list:
    d, max_len = self.data, self.config.max_len
    rows, tokens = d.index(split), d.tokens(split)
    classes = classes_of(d.labels(split), self.config.classes, self._names, f"{d.directory} ({split})")
    examples, cut, unlabelled, empty = [], 0, 0, 0
    for (_, start, end), label in zip(rows, classes):
      if label < 0:
        unlabelled += 1
      elif end == start:
        empty += 1
      else:
        cut += end - start > max_len
        examples.append((np.asarray(tokens[start : min(end, start + max_len)], np.int32), int(label)))
    if jax.process_index() == 0:
      counts = np.bincount([label for _, label in examples], minlength=len(self._names))
      print(
        f"{split}: {len(examples)} texts ({', '.join(f'{n} {c}' for n, c in zip(self._names, counts))}); "
        f"{cut} cut to max_len={max_len} tokens, {unlabelled} in no class ({self.config.classes}), {empty} empty"
      )
    if not examples and split != "test":
      raise DataError(f"the {split} split of {d.directory} has no labelled text; give more data or a larger fraction")
    return examples

  def predictions(self, params, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(predicted class, gold class) of every text of `split`."""
    examples = self.examples[split]
    probs = self.probabilities(params, self.batches(split))[: len(examples)]
    return probs.argmax(-1), np.array([label for _, label in examples])

  def evaluate(self, params, eval_fn, batches) -> dict:
    sums = [tuple(map(float, eval_fn(params, self.put_global(b)))) for b in batches]
    loss = sum(s for s, _ in sums) / max(sum(n for _, n in sums), 1.0)
    result = scores(*self.predictions(params, "validation"), len(self._names))
    return {"val_loss": loss, "dev_accuracy": result["accuracy"], "dev_macro_f1": result["macro_f1"]}

  def describe(self, result: dict) -> str:
    return (
      f"validation loss {result['val_loss']:.4f}, dev accuracy {result['dev_accuracy']:.2%}, "
      f"macro-F1 {result['dev_macro_f1']:.4f}"
    )

  def finish(self, params, workdir: Path, mean_of_last) -> dict:
    """Accuracy and macro-F1 on dev and test, printed as a table; the test confusion matrix as a PNG."""
    out, table = {}, {}
    for split, short in (("validation", "dev"), ("test", "test")):
      if self.examples[split]:
        table[short] = scores(*self.predictions(params, split), len(self._names))
        out.update({f"{short}_accuracy": table[short]["accuracy"], f"{short}_macro_f1": table[short]["macro_f1"]})
    if jax.process_index() == 0:
      lines = [
        f"  {s:<5} {len(self.examples['validation' if s == 'dev' else s]):>6} {r['accuracy']:9.2%} {r['macro_f1']:9.4f}"
        for s, r in table.items()
      ]
      print(
        f"\n{len(self._names)} classes ({', '.join(self._names)}):\n  split  texts  accuracy  macro-F1\n"
        + "\n".join(lines)
      )
      final = table.get("test") or table.get("dev")
      if final is not None:
        draw_confusion(
          final["confusion"],
          self._names,
          workdir / "confusion_matrix.png",
          f"{workdir.name}: {'test' if 'test' in table else 'dev'} split",
        )
        print(f"confusion matrix: {workdir / 'confusion_matrix.png'}")
    return out


def draw_confusion(confusion: np.ndarray, names, path: Path, title: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  n = len(names)
  fig, ax = plt.subplots(figsize=(2 + 0.6 * n, 1.6 + 0.6 * n))
  share = confusion / np.maximum(confusion.sum(1, keepdims=True), 1)
  ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
  for i in range(n):
    for j in range(n):
      ax.text(j, i, str(confusion[i, j]), ha="center", va="center", color="white" if share[i, j] > 0.5 else "black")
  ax.set_xticks(range(n), names, rotation=45, ha="right")
  ax.set_yticks(range(n), names)
  ax.set_xlabel("predicted")
  ax.set_ylabel("gold")
  ax.set_title(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
