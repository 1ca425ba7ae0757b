"""What `train_and_evaluate` trains, chosen by `config.task`:

  "lm"           a GPT on a text corpus: next-token cross-entropy on (seq_len + 1)-token windows;
                 validation loss and perplexity; a generated sample at the end.
  "translation"  the encoder-decoder Transformer on sentence pairs: label-smoothed cross-entropy
                 over the real target tokens of length-bucketed batches; validation loss and
                 sacreBLEU BLEU/chrF (greedy) on the dev split; greedy and beam-search BLEU/chrF on
                 the test split at the end.

A task owns what differs between the two: the model, its loss, the training batches and their
position (saved with each checkpoint), evaluation and the end-of-run output. `transformer.train`
owns what they share: the mesh and shardings, the jit-compiled steps, checkpoints, metrics and the
loop. A loss returns (sum over target tokens, number of target tokens), so that gradient
accumulation and padding weigh every real token the same.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from transformer import decode, metrics, sharding, translate
from transformer.data import Prepared, pipeline
from transformer.data.sources import DataError
from transformer.layers import ConfigError
from transformer.models import seq2seq
from transformer.models.gpt import GPT, GPTConfig

TASKS = ("lm", "translation")


def model_config(config_cls, fields: ml_collections.ConfigDict, vocab_size: int):
  """`config.model` as a checked `config_cls` (GPTConfig, Seq2SeqConfig); vocab_size 0 takes the tokenizer's."""
  names = {f.name for f in dataclasses.fields(config_cls)}
  given = dict(fields)
  unknown = set(given) - names
  if unknown:
    raise ConfigError(f"unknown config.model field(s) {sorted(unknown)}; {config_cls.__name__} fields are "
                      f"{sorted(names)}")
  if not given.get("vocab_size"):
    given["vocab_size"] = vocab_size
  elif given["vocab_size"] < vocab_size:
    raise ConfigError(f"config.model.vocab_size={given['vocab_size']} is smaller than the tokenizer's "
                      f"{vocab_size}; set it to 0 (take the tokenizer's) or at least {vocab_size}")
  return config_cls(**given).check()


def lm_loss(model: GPT, params, batch_BxL1, rng, train: bool):
  """(summed next-token cross-entropy, number of predicted tokens) of (seq_len + 1)-token examples."""
  inputs_BxL, targets_BxL = batch_BxL1[:, :-1], batch_BxL1[:, 1:]
  logits_BxLxV = model.apply({"params": params}, inputs_BxL, deterministic=not train, rngs={"dropout": rng})
  nll_BxL = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, targets_BxL)
  return nll_BxL.sum(), jnp.float32(nll_BxL.size)


def translation_loss(model: seq2seq.Transformer, params, batch: dict, rng, train: bool, label_smoothing: float = 0.0):
  """(summed cross-entropy over the real target tokens, their number). Training smooths the labels
  by `label_smoothing` (the paper's 0.1: the target puts 1 - s on the right token and s spread over
  the vocabulary); evaluation (train=False) scores the plain negative log-likelihood. Dropout is on
  if the model is `Transformer(cfg, deterministic=False)`."""
  logits_BxTxV = model.apply({"params": params}, batch["source"], batch["target_in"],
                             source_valid_BxS=batch["source_valid"], rngs={"dropout": rng})
  smoothing = label_smoothing if train else 0.0
  labels_BxTxV = optax.smooth_labels(jax.nn.one_hot(batch["target_out"], logits_BxTxV.shape[-1]), smoothing)
  ce_BxT = optax.softmax_cross_entropy(logits_BxTxV, labels_BxTxV)
  weight_BxT = batch["target_valid"].astype(jnp.float32)
  return (ce_BxT * weight_BxT).sum(), weight_BxT.sum()


def _check_positive(section, names, prefix: str = "") -> None:
  for name in names:
    if int(section[name]) <= 0:
      raise ConfigError(f"{prefix}{name} must be positive, got {section[name]}")


def _check_lm_config(config, dp: int) -> None:
  _check_positive(config, ("seq_len", "batch_size", "eval_batch_size", "eval_batches"))
  accum = int(config.optimizer.accumulation_steps)
  if config.seq_len > config.model.context_length:
    raise ConfigError(f"seq_len={config.seq_len} is longer than model.context_length={config.model.context_length}; "
                      f"lower --config.seq_len or raise --config.model.context_length")
  if config.batch_size % accum:
    raise ConfigError(f"batch_size={config.batch_size} is not divisible by optimizer.accumulation_steps={accum}")
  if (config.batch_size // accum) % dp:
    raise ConfigError(f"batch_size={config.batch_size} (microbatch {config.batch_size // accum}) is not "
                      f"divisible by the data-parallel size {dp} (mesh data*fsdp); use a multiple of {dp}")
  if config.eval_batch_size % dp:
    raise ConfigError(f"eval_batch_size={config.eval_batch_size} is not divisible by the data-parallel "
                      f"size {dp}; use a multiple of {dp}")


def _check_translation_config(config, dp: int) -> None:
  c = config
  _check_positive(c, ("batch_tokens",))
  _check_positive(c.eval, ("decode_batch_size", "beam_size"), prefix="eval.")
  if c.data.max_len > c.model.max_len:
    raise ConfigError(f"data.max_len={c.data.max_len} is longer than model.max_len={c.model.max_len}; "
                      f"lower data.max_len or raise model.max_len")
  if c.data.max_len < 2:
    raise ConfigError(f"data.max_len must be at least 2 (a token and <|endoftext|>), got {c.data.max_len}")
  if c.batch_tokens < c.data.max_len:
    raise ConfigError(f"batch_tokens={c.batch_tokens} cannot hold one pair of data.max_len={c.data.max_len} "
                      f"tokens; raise batch_tokens")
  if not 0.0 <= c.label_smoothing < 1.0:
    raise ConfigError(f"label_smoothing must be in [0, 1), got {c.label_smoothing}")
  if c.data.test_fraction <= 0:
    raise ConfigError("translation is scored on a held-out test split; set data.test_fraction > 0 (e.g. 0.05)")


def check_config(config, mesh, rules) -> None:
  """The task's training fields, before any data is prepared: a bad value costs nothing."""
  name = config.get("task", "lm")
  if name not in TASKS:
    raise ConfigError(f"unknown config.task {name!r}; choose one of {', '.join(TASKS)}")
  if int(config.optimizer.accumulation_steps) < 1:
    raise ConfigError(f"optimizer.accumulation_steps must be >= 1, got {config.optimizer.accumulation_steps}")
  check = _check_lm_config if name == "lm" else _check_translation_config
  check(config, sharding.data_parallel_size(mesh, rules))


def _check_kind(prepared: Prepared | None, want: str, task: str) -> None:
  if prepared is not None and prepared.kind != want:
    raise DataError(f"config.task={task!r} trains on {want} data, but {prepared.directory} holds "
                    f"{prepared.kind}; choose a {want} data set (config.data.dataset / input_files)")


class LanguageModel:
  """config.task="lm": a GPT (config.model: GPTConfig fields) on windows of a text corpus."""
  name = "lm"

  def __init__(self, config, tokenizer, mesh, rules, prepared: Prepared | None = None):
    self.config, self.tokenizer, self.mesh, self.rules, self.prepared = config, tokenizer, mesh, rules, prepared
    self.model_cfg: GPTConfig = model_config(GPTConfig, config.model, tokenizer.vocab_size)
    self.model = GPT(self.model_cfg)
    self.batch_sharding = sharding.batch_sharding(mesh, rules)
    _check_kind(prepared, "text", self.name)

  def init_inputs(self) -> tuple:
    return (jnp.zeros((1, 8), jnp.int32),)

  def loss(self, params, batch_BxL1, rng, train: bool):
    return lm_loss(self.model, params, batch_BxL1, rng, train)

  def train_batches(self):
    """Process-local batches (B/P, seq_len + 1); a grain iterator, so `get_state` is the data position."""
    c = self.config
    ds = pipeline.lm_train_dataset(self.prepared, seq_len=c.seq_len, global_batch=c.batch_size, seed=c.seed,
                                   sampling=c.data.sampling, process_index=jax.process_index(),
                                   process_count=jax.process_count())
    return iter(ds.to_iter_dataset())

  def put(self, local_batch):
    return jax.make_array_from_process_local_data(self.batch_sharding, local_batch)

  def count_tokens(self, local_batch) -> int:
    return self.config.batch_size * self.config.seq_len

  def flops_per_token(self, num_params: int) -> float:
    return metrics.flops_per_token(num_params, self.model_cfg.num_layers, self.model_cfg.d_model, self.config.seq_len)

  def eval_batches(self) -> list:
    c = self.config
    return list(pipeline.lm_eval_batches(self.prepared, seq_len=c.seq_len, batch_size=c.eval_batch_size,
                                         num_batches=c.eval_batches))

  def evaluate(self, params, eval_fn, batches) -> dict:
    return _loss_metrics(params, eval_fn, [sharding.global_array(b, self.batch_sharding) for b in batches])

  def describe(self, result: dict) -> str:
    return f"validation loss {result['val_loss']:.4f} (perplexity {result['val_perplexity']:.2f})"

  def finish(self, params, workdir: Path) -> dict:
    """A sample from the trained model (config.sample), printed and written to samples.txt."""
    s = self.config.sample
    if s.max_new_tokens <= 0:
      return {}
    tok = self.tokenizer
    prompt = tok.encode(s.prompt) if s.prompt else [tok.eot_id]
    sampling = decode.Sampling(temperature=s.temperature, top_k=s.top_k, top_p=s.get("top_p", 1.0))
    [ids] = decode.generate(self.model, params, [prompt], max_new_tokens=s.max_new_tokens, sampling=sampling,
                            seed=s.seed, stop_id=tok.eot_id, mesh=self.mesh, rules=self.rules, sliding_window=True)
    text = s.prompt + tok.decode(ids)
    if jax.process_index() == 0:
      (workdir / "samples.txt").write_text(text + "\n")
      print(f"\n--- sample (temperature {s.temperature}) ---\n{text}\n---")
    return {"sample": text}


class Translation:
  """config.task="translation": the encoder-decoder Transformer (config.model: Seq2SeqConfig fields)
  on the sentence pairs of config.data, in config.data.direction."""
  name = "translation"

  def __init__(self, config, tokenizer, mesh, rules, prepared: Prepared | None = None):
    self.config, self.tokenizer, self.mesh, self.rules, self.prepared = config, tokenizer, mesh, rules, prepared
    self.model_cfg: seq2seq.Seq2SeqConfig = model_config(seq2seq.Seq2SeqConfig, config.model, tokenizer.vocab_size)
    self.model = seq2seq.Transformer(self.model_cfg)
    self.train_model = seq2seq.Transformer(self.model_cfg, deterministic=False)  # dropout on, same params
    self.batch_sharding = sharding.batch_sharding(mesh, rules)
    _check_kind(prepared, "pairs", self.name)
    if prepared is not None:
      self.languages = tuple(prepared.manifest["columns"])
      self.direction = config.data.direction or "-".join(self.languages)
      pipeline.pair_columns(self.direction, self.languages)  # an unknown direction fails here, named
      self._pairs = {split: self._split_pairs(split) for split in ("train", "validation", "test")}

  def init_inputs(self) -> tuple:
    return jnp.zeros((1, 8), jnp.int32), jnp.zeros((1, 8), jnp.int32)

  def _split_pairs(self, split: str) -> list:
    pairs, dropped = pipeline.translation_pairs(self.prepared, split, direction=self.direction,
                                                max_len=self.config.data.max_len, languages=self.languages)
    if jax.process_index() == 0:
      print(f"{split}: {len(pairs)} pairs ({self.direction}); dropped {dropped['too_long']} longer than "
            f"data.max_len-1={self.config.data.max_len - 1} tokens and {dropped['empty']} with an empty side")
    if not pairs and split != "test":
      raise DataError(f"the {split} split of {self.prepared.directory} has no pairs left; raise data.max_len "
                      f"or the split's fraction")
    return pairs

  def _batch_multiple(self) -> int:
    return sharding.data_parallel_size(self.mesh, self.rules) * int(self.config.optimizer.accumulation_steps)

  def loss(self, params, batch, rng, train: bool):
    return translation_loss(self.train_model if train else self.model, params, batch, rng, train,
                            float(self.config.label_smoothing))

  def train_batches(self):
    c = self.config
    return pipeline.TranslationBatches(self._pairs["train"], max_tokens=c.batch_tokens, max_len=c.data.max_len,
                                       eot_id=self.tokenizer.eot_id, seed=c.seed,
                                       batch_multiple=self._batch_multiple())

  def put(self, batch: dict):
    # Every process builds the same global batch (cheap: a list of small arrays).
    return {k: sharding.global_array(v, self.batch_sharding) for k, v in batch.items()}

  def count_tokens(self, batch: dict) -> int:
    return int(batch["target_valid"].sum())  # real target tokens (fairseq's words per second)

  def flops_per_token(self, num_params: int) -> float:
    # Per target token: 6N, as if each target token came with one source token through the encoder
    # (the weights are split about evenly), plus self-, cross- and encoder attention.
    cfg = self.model_cfg
    return metrics.flops_per_token(num_params, 3 * cfg.num_layers, cfg.d_model, self.config.data.max_len)

  def eval_batches(self) -> list:
    c = self.config
    return pipeline.translation_batches(self._pairs["validation"], max_tokens=c.batch_tokens, max_len=c.data.max_len,
                                        eot_id=self.tokenizer.eot_id, seed=0, shuffle=False,
                                        batch_multiple=sharding.data_parallel_size(self.mesh, self.rules))

  def evaluate(self, params, eval_fn, batches) -> dict:
    """Dev loss over every dev pair, and greedy BLEU/chrF on the first eval.bleu_sentences of them."""
    result = _loss_metrics(params, eval_fn, [self.put(b) for b in batches])
    limit = int(self.config.eval.bleu_sentences) or None
    scores = self.score(params, self._pairs["validation"][:limit], beam_size=1)
    return {**result, "dev_bleu": scores["bleu"], "dev_chrf": scores["chrf"]}

  def describe(self, result: dict) -> str:
    return (f"validation loss {result['val_loss']:.4f} (perplexity {result['val_perplexity']:.2f}), "
            f"dev BLEU {result['dev_bleu']:.2f}, chrF {result['dev_chrf']:.2f} (greedy)")

  def score(self, params, pairs, beam_size: int) -> dict:
    """sacreBLEU corpus BLEU and chrF of translating `pairs`' sources, against their targets; also
    the hypotheses and references."""
    ev = self.config.eval
    hyps = translate.translate_ids(self.model, params, [s for s, _ in pairs], eos_id=self.tokenizer.eot_id,
                                   beam_size=beam_size, alpha=float(ev.alpha),
                                   batch_size=int(ev.decode_batch_size), mesh=self.mesh, rules=self.rules)
    hyp_text = [self.tokenizer.decode(h) for h in hyps]
    ref_text = [self.tokenizer.decode(t) for _, t in pairs]
    return {**translate.corpus_scores(hyp_text, ref_text), "hypotheses": hyp_text, "references": ref_text}

  def finish(self, params, workdir: Path) -> dict:
    """Greedy and beam-search BLEU/chrF on the test split, printed as a table; the translations go to
    test_translations.tsv (source, reference, greedy, beam)."""
    pairs = self._pairs["test"]
    if not pairs:
      return {}
    beam = int(self.config.eval.beam_size)
    greedy = self.score(params, pairs, beam_size=1)
    searched = self.score(params, pairs, beam_size=beam)
    result = {"test_bleu_greedy": greedy["bleu"], "test_chrf_greedy": greedy["chrf"],
              f"test_bleu_beam{beam}": searched["bleu"], f"test_chrf_beam{beam}": searched["chrf"]}
    if jax.process_index() == 0:
      sources = [self.tokenizer.decode(s) for s, _ in pairs]
      rows = zip(sources, greedy["references"], greedy["hypotheses"], searched["hypotheses"])
      one_line = lambda text: " ".join(text.split())  # a tab or newline in a translation would break the TSV
      (workdir / "test_translations.tsv").write_text(
          "source\treference\tgreedy\tbeam\n" + "".join("\t".join(map(one_line, r)) + "\n" for r in rows))
      alpha = self.config.eval.alpha
      print(f"\ntest split, {len(pairs)} pairs ({self.direction}), sacreBLEU {greedy['bleu_signature']}:\n"
            f"  decoding              BLEU    chrF\n"
            f"  greedy              {greedy['bleu']:6.2f}  {greedy['chrf']:6.2f}\n"
            f"  beam {beam}, alpha {alpha:<4}  {searched['bleu']:6.2f}  {searched['chrf']:6.2f}\n"
            f"translations: {workdir / 'test_translations.tsv'}")
    return result


def _loss_metrics(params, eval_fn, device_batches) -> dict:
  sums = [tuple(map(float, eval_fn(params, b))) for b in device_batches]
  loss = sum(s for s, _ in sums) / max(sum(n for _, n in sums), 1.0)
  return {"val_loss": loss, "val_perplexity": float(np.exp(min(loss, 50.0)))}


def make_task(config, tokenizer, mesh, rules, prepared: Prepared | None = None):
  """The task config.task names. Without `prepared` it only builds the model (for restoring)."""
  name = config.get("task", "lm")
  if name == "lm":
    return LanguageModel(config, tokenizer, mesh, rules, prepared)
  if name == "translation":
    return Translation(config, tokenizer, mesh, rules, prepared)
  raise ConfigError(f"unknown config.task {name!r}; choose one of {', '.join(TASKS)}")
