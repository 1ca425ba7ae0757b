"""config.task="translation": the encoder-decoder Transformer on sentence pairs. Label-smoothed
cross-entropy over the real target tokens of packed (or length-bucketed) batches; validation loss and sacreBLEU
BLEU/chrF (greedy) on the dev split; greedy and beam-search BLEU/chrF on the test split at the end."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from transformer import layers, metrics, tokenizers
from transformer.config import RunConfig, at, check_positive, defaults_for, model_dict
from transformer.data import column_names, fuzzy, pipeline
from transformer.data.prepare import LEXICON
from transformer.errors import ConfigError, DataError
from transformer.generation import beam_search
from transformer.models import seq2seq
from transformer.models.formats import marian
from transformer.tasks import labelled
from transformer.tasks.base import Task


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """config.eval: BLEU during training and on the test split at the end."""

  bleu_sentences: int = 400  # dev sentences translated (greedy) at each evaluation; 0: all
  beam_size: int = 4  # the paper's beam and length penalty for the final test score
  alpha: float = 0.6
  # How beams are ranked (beam_search.length_penalty): "gnmt", log p / ((5 + length) / 6)^alpha (the
  # paper's); "hf", log p / length^alpha (transformers', with which Marian's models are used: alpha 1).
  length_penalty: str = "gnmt"
  # No translation repeats an n-gram of this many tokens (greedy and beam, dev and test); 0: off.
  no_repeat_ngram: int = 0
  decode_batch_size: int = 64
  # The test score is of the mean of the params of the last `average_last` checkpoints (the paper
  # averages the last 5); 1: of the final params alone.
  average_last: int = 1
  test_sentences: int = 0  # test pairs translated at the end (the first ones: a smoke run's score); 0: all


@dataclasses.dataclass(frozen=True)
class TranslationConfig:
  direction: str = at("data.direction", "")  # e.g. "en-de"; "": the data set's column order
  max_len: int = at("data.max_len", 64)  # longer pairs are dropped (and counted), never truncated
  batch_tokens: int = 4096  # padded tokens per side in a batch (fairseq's --max-tokens)
  # "packed": pairs back to back in rows of max_len tokens, one batch shape for the whole run (one
  # compile); "bucketed": a batch per length bucket, each pair padded to its bucket (a shape each).
  batching: str = at("data.batching", "packed")
  label_smoothing: float = 0.1
  # With data.lexicon: the share of each epoch's target tokens that are lexicon pairs (the next ones
  # of the lexicon, round and round); the sentence pairs make the rest, each once an epoch.
  lexicon_share: float = 0.5
  # Lexicon pairs' sources start with <|endoftext|> (which no sentence starts with): a tag that tells
  # the model a word entry from a sentence, as tagged back-translation does (Caswell et al. 2019).
  lexicon_tag: bool = False
  # Neural fuzzy repair (Bulté & Tezcan 2019; transformer.data.fuzzy): each source is followed by
  # <|endoftext|> and up to this many tokens of the target of its most similar training pair (never
  # itself), so source rows are data.max_len + this long. 0: off.
  fuzzy_match_tokens: int = at("data.fuzzy_match_tokens", 0)
  # A Marian model's directory (MarianMTModel + its tokenizer pair: a Helsinki-NLP/opus-mt-* download,
  # or launch.translate's --export) whose weights the run starts from: fine-tuning. The model and the
  # data's tokenizer must be that model's: experiments/translation.py:marian=DIR sets all three.
  init_from: str = ""
  eval: EvalConfig = EvalConfig()

  may_change: ClassVar[tuple[str, ...]] = ("eval",)

  @property
  def source_len(self) -> int:
    """Tokens a source may take: the sentence (< max_len), then <|endoftext|> and its fuzzy match."""
    return self.max_len + self.fuzzy_match_tokens

  def _check_eval(self, run: RunConfig) -> None:
    """config.eval: how dev and test translations are decoded and which checkpoints are averaged."""
    check_positive(self.eval, ("decode_batch_size", "beam_size", "average_last"), prefix="eval.")
    if self.eval.length_penalty not in beam_search.PENALTIES:
      raise ConfigError(
        f"--config.eval.length_penalty={self.eval.length_penalty!r} is unknown; choose one of "
        f"{', '.join(beam_search.PENALTIES)}"
      )
    if self.eval.no_repeat_ngram < 0:
      raise ConfigError(f"--config.eval.no_repeat_ngram must be >= 0 (0: off), got {self.eval.no_repeat_ngram}")
    if self.eval.test_sentences < 0:
      raise ConfigError(
        f"--config.eval.test_sentences must be >= 0 (0: the whole test split), got {self.eval.test_sentences}"
      )
    if self.eval.average_last > run.loop.keep_checkpoints:
      raise ConfigError(
        f"--config.eval.average_last={self.eval.average_last} averages more checkpoints than "
        f"--config.keep_checkpoints={run.loop.keep_checkpoints} keeps; raise keep_checkpoints"
      )

  def check(self, run: RunConfig, data_parallel: int | None) -> None:
    check_positive(self, ("batch_tokens",))
    if self.batching not in pipeline.BATCHING:
      raise ConfigError(
        f"--config.data.batching={self.batching!r} is unknown; choose one of {', '.join(pipeline.BATCHING)}"
      )
    self._check_eval(run)
    # A run restored or resumed elsewhere starts from its checkpoints, not from init_from: the
    # directory is read only where it is (a new run that lacks it fails in init_params, naming it).
    if self.init_from and marian.is_marian(self.init_from):
      other = marian.differences(run.model, marian.read_config(self.init_from))
      if other:
        raise ConfigError(
          f"--config.init_from={self.init_from} is another model than --config.model: {'; '.join(other)}; "
          f"start from its preset, --config=experiments/translation.py:marian={self.init_from}"
        )
    if self.fuzzy_match_tokens < 0:
      raise ConfigError(f"--config.data.fuzzy_match_tokens must be >= 0 (0: off), got {self.fuzzy_match_tokens}")
    if self.fuzzy_match_tokens and self.batching != "packed":
      raise ConfigError(
        "--config.data.fuzzy_match_tokens needs --config.data.batching=packed (its sources are longer than its targets)"
      )
    if self.source_len > run.model.max_len:
      with_match = f" + --config.data.fuzzy_match_tokens={self.fuzzy_match_tokens}" if self.fuzzy_match_tokens else ""
      raise ConfigError(
        f"--config.data.max_len={self.max_len}{with_match} is longer than --config.model.max_len="
        f"{run.model.max_len}; lower the one or raise the other"
      )
    if self.max_len < 2:
      raise ConfigError(f"--config.data.max_len must be at least 2 (a token and <|endoftext|>), got {self.max_len}")
    if self.batch_tokens < self.max_len:
      raise ConfigError(
        f"--config.batch_tokens={self.batch_tokens} cannot hold one pair of --config.data.max_len="
        f"{self.max_len} tokens; raise batch_tokens"
      )
    if not 0.0 <= self.label_smoothing < 1.0:
      raise ConfigError(f"--config.label_smoothing must be in [0, 1), got {self.label_smoothing}")
    if not 0.0 <= self.lexicon_share < 1.0:
      raise ConfigError(f"--config.lexicon_share must be in [0, 1), got {self.lexicon_share}")
    if self.lexicon_tag and not run.data.lexicon:
      raise ConfigError(
        "--config.lexicon_tag tags the lexicon's pairs, but there is no lexicon; set "
        "--config.data.lexicon (e.g. dictionary) or drop lexicon_tag"
      )
    if run.data.test_fraction <= 0:
      raise ConfigError(
        "translation is scored on a held-out test split; set --config.data.test_fraction > 0 (e.g. 0.05)"
      )


def translation_loss(model: seq2seq.Transformer, params, batch: dict, rng, train: bool, label_smoothing: float = 0.0):
  """(summed cross-entropy over the real target tokens, their number). Training (dropout on) smooths
  the labels by `label_smoothing` (the paper's 0.1: the target puts 1 - s on the right token and s
  spread over the vocabulary); evaluation (train=False) scores the plain negative log-likelihood."""
  # Packed batches (pipeline.packed_batches) say which pair of its row each token is of.
  segments = (
    {"source_segments_BxS": batch["source_segments"], "target_segments_BxT": batch["target_segments"]}
    if "source_segments" in batch
    else {}
  )
  logits_BxTxV = model.apply(
    {"params": params},
    batch["source"],
    batch["target_in"],
    source_valid_BxS=batch["source_valid"],
    deterministic=not train,
    rngs={"dropout": rng},
    **segments,
  )
  smoothing = label_smoothing if train else 0.0
  labels_BxTxV = optax.smooth_labels(jax.nn.one_hot(batch["target_out"], logits_BxTxV.shape[-1]), smoothing)
  ce_BxT = optax.softmax_cross_entropy(logits_BxTxV, labels_BxTxV)
  weight_BxT = batch["target_valid"].astype(jnp.float32)
  return (ce_BxT * weight_BxT).sum(), weight_BxT.sum()


class Translation(Task):
  """The encoder-decoder Transformer (config.model: Seq2SeqConfig fields) on the sentence pairs of
  config.data, in config.data.direction."""

  name = "translation"
  Config = TranslationConfig
  families = ("transformer",)
  data_kind = "pairs"
  best_metric = ("dev_bleu", "max")  # what a reader sees, rather than the loss
  curves = ("dev_bleu", "dev_chrf")
  MEMORY_FILE: ClassVar[str] = "translation_memory.npz"  # the training pairs, with data.fuzzy_match_tokens
  memory: fuzzy.TranslationMemory | None = None

  @classmethod
  def check_source(cls, run: RunConfig, source) -> None:
    direction = run.task_config.direction or "-".join(source.columns)
    try:
      pipeline.pair_columns(direction, source.columns)
    except DataError as e:
      raise ConfigError(
        f"--config.data.direction: {e} (the columns of {source.name}, in order; leave it empty for that order)"
      ) from None
    if tokenizers.is_marian_pair(run.data.tokenizer) and direction != "-".join(source.columns):
      raise ConfigError(
        f"--config.data.direction={direction}: a Marian tokenizer pair encodes the first column with its "
        f"source model, so it translates {'-'.join(source.columns)}; use a model of that direction, or swap "
        f"your TSV's columns"
      )

  def __init__(self, run: RunConfig, tokenizer, mesh, data=None, labels=None):
    super().__init__(run, tokenizer, mesh, data)
    # The data set's column order unless config.data.direction says otherwise (a restored model
    # without its data takes the names from the config: "de-en" for ding_de_en, "source-target" for a TSV).
    self.languages = tuple(data.manifest["columns"]) if data is not None else column_names(run.data)
    self.direction = self.config.direction or "-".join(self.languages)
    if data is not None:
      pipeline.pair_columns(self.direction, self.languages)  # an unknown direction fails here, named
      self._pairs = {split: self._split_pairs(split) for split in ("train", "validation", "test")}
      self._lexicon = self._split_pairs(LEXICON) if LEXICON in data.manifest["splits"] else []
      if self.config.lexicon_tag:
        self._lexicon = [
          (np.concatenate([[self.tokenizer.eot_id], source]).astype(source.dtype), target)
          for source, target in self._lexicon
        ]
      if self.config.fuzzy_match_tokens:
        self.memory = fuzzy.TranslationMemory(self._pairs["train"])
        self._pairs = {
          split: list(zip(self.with_matches([s for s, _ in pairs]), [t for _, t in pairs]))
          for split, pairs in self._pairs.items()
        }

  # --- Fuzzy matches (config.data.fuzzy_match_tokens): the memory goes into the workdir, so that a
  # restored model reads its sources as it was trained to. ---

  def with_matches(self, sources: list) -> list[np.ndarray]:
    """Each source followed by its fuzzy match from the translation memory."""
    return self.memory.augment(sources, self.config.fuzzy_match_tokens, self.tokenizer.eot_id)

  def save_files(self, workdir: Path) -> None:
    if self.memory is not None:
      self.memory.save(workdir / self.MEMORY_FILE)

  def load_files(self, workdir: Path) -> None:
    if self.config.fuzzy_match_tokens:
      path = workdir / self.MEMORY_FILE
      if not path.exists():
        raise DataError(
          f"{workdir} was trained with fuzzy matches (data.fuzzy_match_tokens) but holds no {path.name}; "
          f"it is written when training starts: train again"
        )
      self.memory = fuzzy.TranslationMemory.load(path)

  def _split_source(self, source: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sentence, fuzzy match) of a dev/test source: the match follows the first <|endoftext|>."""
    ends = np.flatnonzero(source == self.tokenizer.eot_id)
    if self.memory is None or not len(ends):
      return source, source[:0]
    return source[: ends[0]], source[ends[0] + 1 :]

  def build_model(self, model_config):
    return seq2seq.Transformer(model_config)

  def init_params(self, params, restore):
    """A new run's params: config.init_from's Marian weights, when it names a directory (whose
    tokenizer pair must be the one the data was prepared with)."""
    path = self.config.init_from
    if not path:
      return params
    if not marian.is_marian(path):
      raise ConfigError(
        f"--config.init_from={path} is not a Marian model's directory (a config.json of model_type 'marian', "
        f"model.safetensors, source.spm, target.spm, vocab.json)"
      )
    theirs = tokenizers.MarianTokenizer.from_directory(path)
    if not tokenizers.identical(theirs, self.tokenizer):
      raise ConfigError(
        f"--config.init_from={path} reads other tokens ({theirs}) than this run's data ({self.tokenizer}); "
        f"prepare the data with its tokenizer pair: --config.data.tokenizer={path}"
      )
    _, pretrained = marian.import_hf_marian(path)
    if self.model_config.scan_layers:
      pretrained = {
        **pretrained,
        "encoder": layers.stack_layers(pretrained["encoder"], self.model_config.num_layers),
        "decoder": layers.stack_layers(pretrained["decoder"], self.model_config.decoder_layers()),
      }
    return labelled.fit_body(jax.device_get(pretrained), params, path)

  def init_inputs(self) -> tuple:
    return jnp.zeros((1, 8), jnp.int32), jnp.zeros((1, 8), jnp.int32)

  def pairs(self, split: str) -> list:
    """(source ids, target ids) of the "train", "validation" or "test" split, as the model reads them."""
    return self._pairs[split]

  def _split_pairs(self, split: str) -> list:
    max_len = self.config.max_len
    pairs, dropped = pipeline.translation_pairs(
      self.data, split, direction=self.direction, max_len=max_len, languages=self.languages
    )
    if jax.process_index() == 0:
      print(
        f"{split}: {len(pairs)} pairs ({self.direction}); dropped {dropped['too_long']} longer than "
        f"data.max_len-1={max_len - 1} tokens and {dropped['empty']} with an empty side"
      )
    if not pairs and split in ("train", "validation"):
      raise DataError(
        f"the {split} split of {self.data.directory} has no pairs left; raise --config.data.max_len "
        f"or the split's fraction"
      )
    return pairs

  def loss(self, params, batch, rng, train: bool):
    return translation_loss(self.model, params, batch, rng, train, self.config.label_smoothing)

  def train_batches(self):
    c = self.config
    # Batches split evenly over the data-parallel devices and the accumulation microbatches.
    multiple = self.run.mesh.data_parallel * self.run.optimizer.accumulation_steps
    return pipeline.TranslationBatches(
      self._pairs["train"],
      max_tokens=c.batch_tokens,
      max_len=c.max_len,
      eot_id=self.tokenizer.eot_id,
      bos_id=self.tokenizer.decoder_start_id,
      seed=self.run.loop.seed,
      batch_multiple=multiple,
      batching=c.batching,
      extra=self._lexicon,
      extra_per_epoch=self.lexicon_per_epoch(),
      source_len=c.source_len,
    )

  def lexicon_per_epoch(self) -> int:
    """Lexicon pairs per epoch: config.lexicon_share of the epoch's target tokens (<|endoftext|> counted)."""
    share = self.config.lexicon_share
    if not self._lexicon or not share:
      return 0
    target_tokens = lambda pairs: sum(len(t) + 1 for _, t in pairs)
    per_pair = target_tokens(self._lexicon) / len(self._lexicon)
    return max(1, round(share / (1 - share) * target_tokens(self._pairs["train"]) / per_pair))

  def eval_batches(self) -> list:
    c = self.config
    kwargs = dict(
      max_tokens=c.batch_tokens,
      max_len=c.max_len,
      eot_id=self.tokenizer.eot_id,
      bos_id=self.tokenizer.decoder_start_id,
      seed=0,
      shuffle=False,
      batch_multiple=self.run.mesh.data_parallel,
    )
    if c.batching == "packed":
      return pipeline.packed_batches(self._pairs["validation"], source_len=c.source_len, **kwargs)
    return pipeline.translation_batches(self._pairs["validation"], **kwargs)

  def _full_rows(self) -> int:
    """Rows of a packed batch, or of one of the longest bucket (the fewest rows, the most padded tokens)."""
    c = self.config
    return pipeline.bucket_rows(
      c.max_len, c.batch_tokens, self.run.mesh.data_parallel * self.run.optimizer.accumulation_steps
    )

  def batch_shapes(self):
    # Packed: the one shape. Bucketed: the longest bucket's (the others hold at most batch_tokens
    # too, and compile as programs of their own).
    rows, c = self._full_rows(), self.config
    keys = ["source", "source_valid", "target_in", "target_out", "target_valid"]
    if c.batching == "packed":
      keys += ["source_segments", "target_segments"]
    return {
      k: jax.ShapeDtypeStruct(
        (rows, c.source_len if k.startswith("source") else c.max_len), jnp.bool_ if k.endswith("valid") else jnp.int32
      )
      for k in keys
    }

  def tokens_per_step(self) -> int:
    return self._full_rows() * self.config.max_len

  def count_tokens(self, batch: dict) -> int:
    return int(batch["target_valid"].sum())  # real target tokens (fairseq's words per second)

  def flops_per_token(self, num_params: int) -> float:
    # Per target token: 6N, as if each target token came with one source token through the encoder
    # (the weights are split about evenly), plus self-, cross- and encoder attention.
    cfg = self.model_config
    attention_layers = cfg.num_layers + 2 * cfg.decoder_layers()
    return metrics.flops_per_token(num_params, attention_layers, cfg.block.d_model, self.config.max_len)

  def evaluate(self, params, eval_fn, batches) -> dict:
    """Dev loss over every dev pair, and greedy BLEU/chrF on the first eval.bleu_sentences of them."""
    result = super().evaluate(params, eval_fn, batches)
    limit = self.config.eval.bleu_sentences or None
    scores = self.score(params, self._pairs["validation"][:limit], beam_size=1)
    return {**result, "dev_bleu": scores["bleu"], "dev_chrf": scores["chrf"]}

  def describe(self, result: dict) -> str:
    return f"{super().describe(result)}, dev BLEU {result['dev_bleu']:.2f}, chrF {result['dev_chrf']:.2f} (greedy)"

  def score(self, params, pairs, beam_size: int) -> dict:
    """sacreBLEU corpus BLEU and chrF of translating `pairs`' sources, against their targets; also
    the hypotheses and references."""
    ev = self.config.eval
    hyps = beam_search.translate_ids(
      self.model,
      params,
      [s for s, _ in pairs],
      **beam_search.special_ids(self.tokenizer),
      beam_size=beam_size,
      alpha=ev.alpha,
      penalty=ev.length_penalty,
      max_len=self.config.max_len,
      no_repeat_ngram=ev.no_repeat_ngram,
      batch_size=ev.decode_batch_size,
      mesh=self.mesh,
      rules=self.rules,
    )
    hyp_text = [self.tokenizer.decode(h) for h in hyps]
    ref_text = [self.tokenizer.decode(t) for _, t in pairs]
    return {**metrics.corpus_scores(hyp_text, ref_text), "hypotheses": hyp_text, "references": ref_text}

  def finish(self, params, workdir: Path, mean_of_last) -> dict:
    """Greedy and beam-search BLEU/chrF on the test split (its first eval.test_sentences pairs, when
    set), printed as a table, of the final params or (eval.average_last > 1) the mean of the last
    checkpoints', beside the final params' greedy score; the translations go to
    test_translations.tsv (source, reference, greedy, beam)."""
    split = self._pairs["test"]
    if not split:
      return {}
    pairs = split[: self.config.eval.test_sentences or None]
    beam, average = self.config.eval.beam_size, self.config.eval.average_last
    result, scores = {}, []
    if average > 1:
      last = self.score(params, pairs, beam_size=1)
      result.update(test_bleu_greedy_last=last["bleu"], test_chrf_greedy_last=last["chrf"])
      scores.append(("greedy, final params", last))
      steps, params = mean_of_last(average)
      average = len(steps)  # a short run may have saved fewer
      print(f"test scores of the mean of the params of steps {steps}")
    greedy = self.score(params, pairs, beam_size=1)
    searched = self.score(params, pairs, beam_size=beam)
    result.update(
      {
        "test_bleu_greedy": greedy["bleu"],
        "test_chrf_greedy": greedy["chrf"],
        f"test_bleu_beam{beam}": searched["bleu"],
        f"test_chrf_beam{beam}": searched["chrf"],
      }
    )
    alpha = self.config.eval.alpha
    averaged = f", mean of {average}" if average > 1 else ""
    scores += [(f"greedy{averaged}", greedy), (f"beam {beam}, alpha {alpha:g}{averaged}", searched)]
    if jax.process_index() == 0:
      split_sources = [self._split_source(s) for s, _ in pairs]
      columns = [("source", [self.tokenizer.decode(sentence) for sentence, _ in split_sources])]
      if self.memory is not None:  # what the model read after the sentence
        columns.append(("fuzzy_match", [self.tokenizer.decode(match) for _, match in split_sources]))
      columns += [
        ("reference", greedy["references"]),
        ("greedy", greedy["hypotheses"]),
        ("beam", searched["hypotheses"]),
      ]
      one_line = lambda text: " ".join(text.split())  # a tab or newline in a translation would break the TSV
      (workdir / "test_translations.tsv").write_text(
        "\t".join(name for name, _ in columns)
        + "\n"
        + "".join("\t".join(map(one_line, row)) + "\n" for row in zip(*(texts for _, texts in columns)))
      )
      table = "".join(f"  {name:<28}{r['bleu']:6.2f}  {r['chrf']:6.2f}\n" for name, r in scores)
      which = f"the first {len(pairs)} of {len(split)}" if len(pairs) < len(split) else f"{len(pairs)}"
      print(
        f"\ntest split, {which} pairs ({self.direction}), sacreBLEU {greedy['bleu_signature']}:\n"
        f"  {'decoding':<28}  BLEU    chrF\n{table}translations: {workdir / 'test_translations.tsv'}"
      )
    return result


def marian_defaults(directory: str) -> ml_collections.ConfigDict:
  """The config of a translation run that starts from the Marian model in `directory`: its model
  (every field read from its config.json, dropout included), its tokenizer pair for the data, its
  weights (init_from), and its decoding (transformers' length penalty, alpha 1, 4 beams). The data
  is yours (config.data.input_files, or a named data set); the direction is the model's."""
  c = defaults_for(Translation)
  c.model = model_dict(marian.read_config(directory))
  c.init_from = c.data.tokenizer = str(directory)
  c.data.max_len = min(c.model.max_len, 128)  # tokens a sentence may have (OPUS-MT's models read 512)
  c.eval.length_penalty, c.eval.alpha = "hf", 1.0
  c.data.dataset = "ding_de_en"  # or --config.data.input_files: your pairs, in the model's direction
  c.data.validation_fraction = c.data.test_fraction = 0.05
  return c
