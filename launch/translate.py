r"""Translates sentences with a trained encoder-decoder checkpoint (experiments/translation.py).

  python -m launch.translate --workdir=workdirs/de-en --sentence="Ich habe keine Zeit."
  python -m launch.translate --workdir=workdirs/de-en --input_file=sentences.de > sentences.en
  echo "Wo ist der Bahnhof?" | python -m launch.translate --workdir=workdirs/de-en --input_file=- --beam_size=1
  python -m launch.translate --workdir=workdirs/de-en --average=5 --sentence=...  # the last 5 checkpoints' mean
  python -m launch.translate --workdir=workdirs/de-en --ensemble=workdirs/de-en-seed1,workdirs/de-en-seed2 ...
  python -m launch.translate --workdir=workdirs/de-en --split=test --beam_size=4  # + sacreBLEU BLEU/chrF
  python -m launch.translate --hf=path/to/opus-mt-de-en --sentence="Ich habe keine Zeit."  # a Marian model
  python -m launch.translate --workdir=workdirs/marian-ft --export=out/  # a Marian run as MarianMTModel's files

Sentences come from --sentence (repeatable), then --input_file (one per line; "-" is stdin); one
translation per line comes out, in order. --beam_size=1 is greedy decoding; larger beams rank
hypotheses by log-probability over a length penalty: the run's (config.eval.length_penalty, alpha),
the GNMT one ((5 + length) / 6)^alpha unless it said otherwise, transformers' length^alpha for Marian. --ensemble
decodes with the mean of several runs' log-probabilities (runs of the same data and tokenizer, e.g.
other seeds: transformer.inference.restore_ensemble); --step and --average apply to each run.
--split=test (or validation) translates that split of the run's data instead and prints its
sacreBLEU BLEU and chrF to stderr: how an ensemble, an average or another decoding is scored.
"""

import sys
from pathlib import Path

from absl import flags

import launch
from transformer import cli, inference, metrics
from transformer.errors import UserError
from transformer.generation.beam_search import PENALTIES
from transformer.models.formats.marian import export_hf_marian

_MODEL = launch.ModelFlags(
  "A translation training workdir (launch.train's --workdir).",
  hf_help="Instead of --workdir: a Marian model's directory (MarianMTModel + MarianTokenizer files, e.g. OPUS-MT).",
  gpt2=False,
)
_WORKDIR, _HF, _STEP = _MODEL.workdir, _MODEL.hf, _MODEL.step  # read in main and _export
_EXPORT = flags.DEFINE_string(
  "export",
  None,
  "Write the model (--workdir's, at --step) as a directory MarianMTModel and MarianTokenizer.from_pretrained load, "
  "instead of translating.",
)
_AVERAGE = flags.DEFINE_integer(
  "average",
  1,
  "Translate with the mean of the params of this many checkpoints, up to and including --step (checkpoint averaging).",
)
_ENSEMBLE = flags.DEFINE_list(
  "ensemble",
  [],
  "More workdirs (comma-separated) whose models decode together with --workdir's: the mean of their log-probabilities.",
)
_SENTENCE = flags.DEFINE_multi_string("sentence", [], "A sentence to translate; repeat the flag for several.")
_INPUT_FILE = flags.DEFINE_string("input_file", None, "One sentence per line; '-' reads stdin.")
_SPLIT = flags.DEFINE_enum(
  "split",
  None,
  ["validation", "test"],
  "Translate this split of the run's data (instead of --sentence/--input_file) and print its BLEU and chrF to stderr.",
)
_BEAM_SIZE = flags.DEFINE_integer("beam_size", 4, "Hypotheses kept per sentence; 1 is greedy decoding.")
_ALPHA = flags.DEFINE_float(
  "alpha", None, "Length penalty exponent (0: plain log-probability); default: the run's config.eval.alpha."
)
_LENGTH_PENALTY = flags.DEFINE_enum(
  "length_penalty", None, list(PENALTIES), "gnmt or hf (beam_search.length_penalty); default: the run's."
)
_MAX_LEN = flags.DEFINE_integer("max_len", 0, "At most this many target tokens (0: the model's max_len).")
_NO_REPEAT_NGRAM = flags.DEFINE_integer(
  "no_repeat_ngram",
  -1,
  "No translation repeats an n-gram of this many tokens (0: off; -1: the run's config.eval.no_repeat_ngram).",
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Sentences decoded together.")


def _export() -> None:
  if _HF.value or _ENSEMBLE.value or _SENTENCE.value or _INPUT_FILE.value or _SPLIT.value:
    raise UserError("--export writes --workdir's model (at --step, --average); give it alone")
  out = Path(_EXPORT.value)
  if out.exists() and any(out.iterdir()):
    raise UserError(f"--export={out} is not empty; give a new directory (nothing there is overwritten)")
  trained = _MODEL.load("translation", average=_AVERAGE.value)
  export_hf_marian(trained.task.model_config, trained.params, trained.tokenizer, out)
  print(f"wrote {out}: MarianMTModel.from_pretrained({str(out)!r}), MarianTokenizer.from_pretrained({str(out)!r})")


def main(argv):
  del argv
  if (_WORKDIR.value is None) == (_HF.value is None):
    raise UserError("give exactly one of --workdir (a training run) or --hf (a Marian model's directory)")
  if _EXPORT.value:
    return _export()
  sentences = cli.read_inputs(_SENTENCE.value, _INPUT_FILE.value, "input_file")
  if bool(sentences) == bool(_SPLIT.value):
    raise UserError(
      "nothing to translate: give --sentence or --input_file"
      if not sentences
      else "--split translates the run's data: give it without --sentence and --input_file"
    )
  if _ENSEMBLE.value:
    if _HF.value:
      raise UserError("--ensemble, --average and --split use training runs: give --workdir")
    step = _STEP.value or inference.default_step(_WORKDIR.value)
    trained = inference.restore_ensemble([_WORKDIR.value, *_ENSEMBLE.value], step, average=_AVERAGE.value)
    launch.say_kernels(trained.run.model)
    source = f"{_WORKDIR.value} + {len(_ENSEMBLE.value)} more workdir(s), an ensemble"
  else:
    if _HF.value and (_SPLIT.value or _AVERAGE.value > 1):
      raise UserError("--ensemble, --average and --split use training runs: give --workdir")
    trained = _MODEL.load("translation", average=_AVERAGE.value)
    source = trained.source
  references = None
  if _SPLIT.value:
    pairs = inference.split_pairs(trained, _WORKDIR.value, _SPLIT.value)
    sources, references = [s for s, _ in pairs], [trained.tokenizer.decode(t) for _, t in pairs]
  else:
    # The ids the model reads (with data.fuzzy_match_tokens: each sentence followed by its fuzzy match).
    sources = inference.translation_sources(trained, sentences)
  ev = trained.task.config.eval
  alpha = ev.alpha if _ALPHA.value is None else _ALPHA.value
  penalty = _LENGTH_PENALTY.value or ev.length_penalty
  print(
    f"# {source} ({trained.task.direction}): "
    f"{len(sources)} sentence(s), beam {_BEAM_SIZE.value}, {penalty} length penalty, alpha {alpha}",
    file=sys.stderr,
  )
  texts = inference.translate(
    trained,
    sources,
    beam_size=_BEAM_SIZE.value,
    alpha=alpha,
    penalty=penalty,
    max_len=_MAX_LEN.value or None,
    no_repeat_ngram=None if _NO_REPEAT_NGRAM.value < 0 else _NO_REPEAT_NGRAM.value,
    batch_size=_BATCH_SIZE.value,
  )
  print("\n".join(texts))
  if references is not None:
    scores = metrics.corpus_scores(texts, references)
    print(
      f"# {_SPLIT.value} split, {len(texts)} pairs: BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f} "
      f"(sacreBLEU {scores['bleu_signature']})",
      file=sys.stderr,
    )


if __name__ == "__main__":
  cli.run(main)
