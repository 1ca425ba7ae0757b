r"""Scores a model on your file or on a split of its run's data.

  python -m launch.evaluate --workdir=workdirs/shakespeare-char --split=validation
  python -m launch.evaluate --workdir=workdirs/shakespeare-char --input_file=hamlet.txt
  python -m launch.evaluate --hf=path/to/gpt2 --input_file=hamlet.txt       # GPT-2's weights, on the same scale
  python -m launch.evaluate --workdir=workdirs/sentiment-encoder --input_file=reviews.tsv   # label<TAB>text lines
  python -m launch.evaluate --workdir=workdirs/pos-encoder --input_file=tagged.txt         # word/TAG sentences
  python -m launch.evaluate --workdir=workdirs/de-en --input_file=pairs.tsv --beam_size=4   # source<TAB>reference
  python -m launch.evaluate --hf=path/to/opus-mt-de-en --input_file=pairs.tsv             # a Marian model's

What is reported depends on the model (the run's config.task):
  lm              loss (nats per token), perplexity, and bits per token, per byte and per character:
                  bits per byte compare models whatever their tokenizers (transformer.evaluation)
  classification  accuracy, macro-F1 and the confusion matrix on `label<TAB>text` lines, labels as the
                  run's data wrote them (class names, or scores for config.classes=binary/three)
  tagging         token accuracy, macro-F1 and the confusion matrix on sentences of `word/TAG` tokens
                  (a universal-tag model also takes Brown tags)
  translation     sacreBLEU BLEU and chrF of beam-search translations of `source<TAB>reference` lines
The file must be UTF-8 text; a label or tag the model does not know is one error naming it.
"""

import warnings

import numpy as np
from absl import flags

import launch
from transformer import cli, evaluation, inference, metrics, sharding, tokenizers
from transformer.data import sources
from transformer.errors import ConfigError, InputWarning, UserError
from transformer.generation.beam_search import PENALTIES

_MODEL = launch.ModelFlags(
  "A training workdir (launch.train's --workdir).",
  hf_help=launch.HF_HELP + launch.HF_MARIAN,
)
_INPUT_FILE = flags.DEFINE_string("input_file", None, "The file to score (its format: the model's task, above).")
_SPLIT = flags.DEFINE_enum(
  "split", None, ["train", "validation", "test"], "Instead of --input_file: this split of the run's data."
)
_CONTEXT = flags.DEFINE_integer(
  "context", 0, "Language models: tokens a window reads (0: the run's seq_len; GPT-2's 1,024 with --hf)."
)
_STRIDE = flags.DEFINE_integer(
  "stride", 0, "Language models: tokens between window starts (0: the context; less gives each token more context)."
)
_ALLOW_SPECIAL = flags.DEFINE_bool(
  "allow_special", False, "Language models: special tokens written in the text (<|endoftext|>) read as their ids."
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Windows, texts or sentences scored together.")
_BEAM_SIZE = flags.DEFINE_integer("beam_size", 4, "Translation: hypotheses kept per sentence; 1 is greedy.")
_ALPHA = flags.DEFINE_float(
  "alpha", None, "Translation: length penalty exponent (default: the run's config.eval.alpha)."
)
_LENGTH_PENALTY = flags.DEFINE_enum(
  "length_penalty", None, list(PENALTIES), "Translation: gnmt or hf (beam_search.length_penalty); default: the run's."
)


def _print_text_score(score: evaluation.TextScore) -> None:
  rows = [
    ("tokens", f"{score.tokens:,}"),
    ("bytes", f"{score.bytes:,}"),
    ("loss (nats/token)", f"{score.loss:.4f}"),
    ("perplexity", f"{score.perplexity:.3f}"),
    ("bits per token", f"{score.bits_per_token:.4f}"),
    ("bits per byte", f"{score.bits_per_byte:.4f}"),
    ("bits per char", f"{score.bits_per_char:.4f}"),
  ]
  print("\n".join(f"{name:<18} {value}" for name, value in rows))


def _print_label_scores(result: dict, names, unit: str) -> None:
  left_out = f" ({result['left_out']} in no class, left out)" if result["left_out"] else ""
  print(
    f"{unit:<9} {result['count']:,}{left_out}\naccuracy  {result['accuracy']:.2%}\nmacro-F1  {result['macro_f1']:.4f}"
  )
  print(evaluation.confusion_text(result["confusion"], names))


def _score_lm(model, params, tokenizer, text: str | None, *, context: int, max_context: int, split=None, **options):
  """A language model's `TextScore` on the text, or on the run's --split (`options["split"]`: its tokens)."""
  if context < 1:
    raise ConfigError(f"--context must be positive (0: the run's seq_len), got {context}")
  if context > max_context:
    raise ConfigError(f"--context={context} is longer than the model reads ({max_context} tokens); give at most that")
  options.update(context=context, stride=_STRIDE.value, batch_size=_BATCH_SIZE.value)
  if split is not None:
    return evaluation.score_stream(model, params, tokenizer, split, **options)
  fitted = tokenizers.fit_text(tokenizer, text)
  if fitted != text:
    lacking = sorted(c for c in set(text) if tokenizers.fit_text(tokenizer, c) != c)
    warnings.warn(
      f"{sum(map(text.count, lacking))} character(s) of {_INPUT_FILE.value} are not in the model's vocabulary "
      f"({' '.join(lacking[:10])}): each is read as its unaccented letter, or left out when it has none; "
      "bits per byte are of the text as read",
      InputWarning,
      stacklevel=2,
    )
  return evaluation.score_text(model, params, tokenizer, fitted, allow_special=_ALLOW_SPECIAL.value, **options)


def _run_lm(trained: inference.Trained, text: str | None) -> None:
  task = trained.task
  rows = sharding.data_parallel_size(trained.mesh, trained.rules)
  if _BATCH_SIZE.value % rows:
    raise ConfigError(f"--batch_size={_BATCH_SIZE.value} must be a multiple of the {rows} data-parallel devices")
  options = {"eot_id": trained.tokenizer.eot_id if task.config.segmented else None, "put": task.put_global}
  if _SPLIT.value:
    options["split"] = inference.split_task(trained, _MODEL.workdir.value).data.tokens(_SPLIT.value)
  gpt = task.model_config.family == "gpt"
  score = _score_lm(
    task.model,
    trained.params,
    trained.tokenizer,
    text,
    context=_CONTEXT.value or task.config.seq_len,
    max_context=task.model_config.max_len if gpt else np.iinfo(np.int32).max,  # an LSTM reads any length
    **options,
  )
  _print_text_score(score)


def _run_labelled(trained: inference.Trained) -> None:
  kind = trained.run.task
  if _SPLIT.value:
    result = evaluation.split_label_scores(trained, _MODEL.workdir.value, _SPLIT.value)
  elif kind == "classification":
    rows = evaluation.labelled_rows(_INPUT_FILE.value, "classification")
    result = evaluation.classifier_scores(trained, rows, _INPUT_FILE.value)
  else:
    sentences = evaluation.labelled_rows(_INPUT_FILE.value, "tagged")
    result = evaluation.tagger_scores(trained, sentences, _INPUT_FILE.value)
  _print_label_scores(result, trained.task.labels, "texts" if kind == "classification" else "words")


def _run_translation(trained: inference.Trained) -> None:
  if _SPLIT.value:
    pairs = inference.split_pairs(trained, _MODEL.workdir.value, _SPLIT.value)
    sources_ids, references = [s for s, _ in pairs], [trained.tokenizer.decode(t) for _, t in pairs]
  else:
    pairs = evaluation.labelled_rows(_INPUT_FILE.value, "pairs")
    sources_ids, references = inference.translation_sources(trained, [s for s, _ in pairs]), [t for _, t in pairs]
  ev = trained.task.config.eval
  alpha = ev.alpha if _ALPHA.value is None else _ALPHA.value
  penalty = _LENGTH_PENALTY.value or ev.length_penalty
  texts = inference.translate(
    trained, sources_ids, beam_size=_BEAM_SIZE.value, alpha=alpha, penalty=penalty, batch_size=_BATCH_SIZE.value
  )
  scores = metrics.corpus_scores(texts, references)
  print(f"pairs     {len(texts):,}\nBLEU      {scores['bleu']:.2f}\nchrF      {scores['chrf']:.2f}")
  print(f"# sacreBLEU {scores['bleu_signature']}, beam {_BEAM_SIZE.value}, {penalty} length penalty, alpha {alpha}")


def main(argv):
  del argv
  if (_INPUT_FILE.value is None) == (_SPLIT.value is None):
    raise UserError("give exactly one of --input_file (your file) or --split (the run's data)")
  if _MODEL.hf.value and _SPLIT.value:
    raise UserError("--split scores a run's own data; with --hf give --input_file")
  # Read first: a file that is not UTF-8 text is refused (naming the line and byte) before a model loads.
  text = "".join(sources.read_text(_INPUT_FILE.value)) if _INPUT_FILE.value else None
  trained = _MODEL.load()
  kind = trained.run.task
  print(f"# {trained.source} ({kind}) on {_INPUT_FILE.value or f'its {_SPLIT.value} split'}")
  if kind == "lm":
    _run_lm(trained, text)
  elif kind in ("classification", "tagging"):
    _run_labelled(trained)
  elif kind == "translation":
    _run_translation(trained)
  else:  # a task registered from Python
    raise UserError(
      f"{trained.source} holds a {kind!r} model; launch.evaluate scores lm, classification, tagging and translation"
    )


if __name__ == "__main__":
  cli.run(main)
