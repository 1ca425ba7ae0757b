"""config.task="lm": a GPT (or, as the historical baseline, an LSTM: config.model.family="lstm") on a
text corpus. Next-token cross-entropy on (seq_len + 1)-token windows; validation loss and perplexity
on fixed windows; a generated sample at the end."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer import kernels, metrics, tokenizers
from transformer.config import RunConfig, at, check_positive, defaults_for, model_dict
from transformer.data import pipeline
from transformer.errors import ConfigError, TokenizerError, UserError
from transformer.generation import sampling
from transformer.interp import interventions
from transformer.models import formats, hf_files
from transformer.models.gpt import GPT, next_token_nll
from transformer.models.lstm import LSTMLanguageModel
from transformer.tasks.base import Task


@dataclasses.dataclass(frozen=True)
class SampleConfig:
  """config.sample: what the end of a run generates (samples.txt)."""

  prompt: str = ""  # empty: start from <|endoftext|>
  max_new_tokens: int = 200  # 0: no sample
  temperature: float = 0.8
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0


@dataclasses.dataclass(frozen=True)
class LMConfig:
  batch_size: int = 32  # global, in sequences; split over the data-parallel devices
  seq_len: int = 256
  eval_batches: int = 8  # fixed validation windows, the same at every evaluation
  eval_batch_size: int = 32
  sampling: str = at("data.sampling", "windows")  # "windows" (random) | "packed" (every token once an epoch)
  # Packed rows hold several documents: attention stays inside each and positions restart at each
  # <|endoftext|> (which begins a document, as it begins generation). False: one text per row.
  separate_documents: bool = at("data.separate_documents", True)
  sample: SampleConfig = SampleConfig()
  # A GPT's heads scored at every evaluation (metrics.jsonl, TensorBoard): previous-token,
  # duplicate-token and induction scores per head, and the in-context score (transformer.interp.interventions).
  head_scores: bool = False
  # A Hugging Face language model's directory (an open model's, transformer.models.formats, or
  # GPT-2's) whose weights a new run starts from: fine-tuning. experiments/hf.py:DIR sets config.model
  # and the tokenizer from it (`hf_defaults`); a resumed run starts from its own checkpoints.
  init_from: str = ""

  may_change: ClassVar[tuple[str, ...]] = ("eval_batches", "eval_batch_size", "sample", "head_scores", "init_from")

  def check(self, run: RunConfig, data_parallel: int | None) -> None:
    check_positive(self, ("seq_len", "batch_size", "eval_batch_size", "eval_batches"))
    if self.sampling not in pipeline.SAMPLING:
      raise ConfigError(
        f"--config.data.sampling={self.sampling!r} is unknown; choose one of {', '.join(pipeline.SAMPLING)}"
      )
    if self.seq_len > run.model.max_len:
      raise ConfigError(
        f"--config.seq_len={self.seq_len} is longer than --config.model.max_len="
        f"{run.model.max_len}; lower the one or raise the other"
      )
    if self.head_scores and run.model.family != "gpt":
      raise ConfigError(f"--config.head_scores scores a GPT's attention heads; this model is an {run.model.family}")
    if self.sample.max_new_tokens < 0:
      raise ConfigError(f"--config.sample.max_new_tokens must be >= 0 (0: no sample), got {self.sample.max_new_tokens}")
    self.sample_options().check()
    if self.init_from:
      _check_pretrained(self.init_from, run)
    if self.segmented and run.model.family != "gpt":
      raise ConfigError(
        f"--config.data.separate_documents is for GPTs (attention within a document); an "
        f"{run.model.family} reads a packed row as one text: set "
        f"--config.data.separate_documents=False"
      )
    accum = run.optimizer.accumulation_steps
    if self.batch_size % accum:
      raise ConfigError(
        f"--config.batch_size={self.batch_size} is not divisible by --config.optimizer.accumulation_steps={accum}"
      )
    if data_parallel is None:
      return
    if (self.batch_size // accum) % data_parallel:
      raise ConfigError(
        f"--config.batch_size={self.batch_size} (microbatch {self.batch_size // accum}) is not "
        f"divisible by the data-parallel size {data_parallel} (mesh data*fsdp); use a multiple "
        f"of {data_parallel}"
      )
    if self.eval_batch_size % data_parallel:
      raise ConfigError(
        f"--config.eval_batch_size={self.eval_batch_size} is not divisible by the data-parallel "
        f"size {data_parallel}; use a multiple of {data_parallel}"
      )

  @property
  def segmented(self) -> bool:
    """Whether rows are read as separate documents (packed sampling only: windows are nanoGPT's)."""
    return self.sampling == "packed" and self.separate_documents

  def sample_options(self) -> sampling.Sampling:
    return sampling.Sampling(temperature=self.sample.temperature, top_k=self.sample.top_k, top_p=self.sample.top_p)


def _check_pretrained(path: str, run: RunConfig) -> None:
  """config.init_from's model is the run's (config.model), or one error naming each field that differs."""
  if run.model.family != "gpt":
    raise ConfigError(
      f"--config.init_from={path} starts a GPT from a Hugging Face model; this model is an {run.model.family}"
    )
  try:
    theirs = formats.read_model_config(path)
  except UserError as e:
    raise ConfigError(f"--config.init_from={path}: {e}") from None
  other = hf_files.differences(
    run.model.replace(vocab_size=run.model.vocab_size or theirs.vocab_size), theirs, "the pretrained model"
  )
  if other:
    raise ConfigError(
      f"--config.init_from={path} is another model than --config.model: {'; '.join(other)}; start from its "
      f"preset, --config=experiments/hf.py:{path}"
    )


def hf_defaults(directory: str):
  """The config of a language-model run that starts from the Hugging Face model in `directory` (an open
  model's or GPT-2's): its model (every field read from its config.json), its tokenizer for the data
  (tokenizer.json; GPT-2's files have none: gpt2), its weights (init_from), AdamW at a fine-tuning rate.
  The data is yours (config.data.input_files, or a named data set)."""
  c = defaults_for(LanguageModel)
  model = formats.read_model_config(directory)
  c.model = model_dict(model)
  c.model.block.param_dtype = "float32"  # the optimizer's master weights, whatever the checkpoint stores
  c.init_from = directory
  c.data.tokenizer = directory if tokenizers.is_hf_tokenizer(directory) else "gpt2"
  c.seq_len = min(model.max_len, 256)
  c.batch_size = c.eval_batch_size = 8
  c.optimizer.name, c.optimizer.lr, c.optimizer.warmup_steps = "adamw", 3e-5, 10
  c.num_train_steps, c.eval_every_steps, c.checkpoint_every_steps = 200, 50, 50
  return c


def document_ids(tokens_BxL, eot_id: int):
  """Which document of its row each token is in: a new one begins at every <|endoftext|>."""
  return jnp.cumsum(tokens_BxL == eot_id, axis=1)


def lm_nll(model: GPT | LSTMLanguageModel, params, batch_BxL1, rng, train: bool, eot_id: int | None = None):
  """The next-token cross-entropy at every position of (seq_len + 1)-token examples, (B, seq_len).
  With `eot_id`, each row is read as the documents that <|endoftext|> separates (a GPT only)."""
  inputs_BxL, targets_BxL = batch_BxL1[:, :-1], batch_BxL1[:, 1:]
  segments = {} if eot_id is None else {"segments_BxT": document_ids(inputs_BxL, eot_id)}
  logits_BxLxV = model.apply({"params": params}, inputs_BxL, deterministic=not train, rngs={"dropout": rng}, **segments)
  return next_token_nll(logits_BxLxV, targets_BxL, kernels.resolve(model.config.kernels))


def lm_loss(model: GPT | LSTMLanguageModel, params, batch_BxL1, rng, train: bool, eot_id: int | None = None):
  """(summed next-token cross-entropy, number of predicted tokens) of (seq_len + 1)-token examples."""
  nll_BxL = lm_nll(model, params, batch_BxL1, rng, train, eot_id)
  return nll_BxL.sum(), jnp.float32(nll_BxL.size)


class LanguageModel(Task):
  """A GPT (config.model: GPTConfig fields) or a one-way LSTM (LSTMConfig fields) on windows of a text
  corpus (config.data)."""

  name = "lm"
  Config = LMConfig
  families = ("gpt", "lstm")
  data_kind = "text"

  def __init__(self, run: RunConfig, tokenizer, mesh, data=None, labels=None):
    super().__init__(run, tokenizer, mesh, data)
    try:  # now, not after training (a model without a tokenizer samples from its end-of-text id)
      textless = isinstance(tokenizer, tokenizers.NoTokenizer)
      self._sample_prompt = (not textless and tokenizer.encode(self.config.sample.prompt)) or [tokenizer.eot_id]
    except TokenizerError as e:
      raise ConfigError(f"--config.sample.prompt: {e}") from None

  def init_params(self, params, restore):
    """A new run's params: config.init_from's weights, when it names a Hugging Face model (whose
    tokenizer must be the one the data was prepared with)."""
    path = self.config.init_from
    if not path:
      return params
    own = formats.is_open_model(path)
    if own and not tokenizers.is_hf_tokenizer(path):
      raise ConfigError(f"--config.init_from={path} has no tokenizer.json: the data must be tokenized as the model was")
    theirs = tokenizers.load_tokenizer(path) if own else tokenizers.get_tokenizer("gpt2")
    if not tokenizers.identical(theirs, self.tokenizer):
      raise ConfigError(
        f"--config.init_from={path} reads other tokens ({theirs}) than this run's data ({self.tokenizer}); "
        f"prepare the data with its tokenizer: --config.data.tokenizer={path if own else 'gpt2'}"
      )
    _, pretrained = formats.import_lm(path, scan_layers=self.model_config.scan_layers)
    return jax.tree.map(lambda p, ours: jnp.asarray(p, ours.dtype), pretrained, nn.unbox(params))

  def build_model(self, model_config):
    return LSTMLanguageModel(model_config) if model_config.family == "lstm" else GPT(model_config)

  def init_inputs(self) -> tuple:
    return (jnp.zeros((1, 8), jnp.int32),)

  def loss(self, params, batch_BxL1, rng, train: bool):
    eot_id = self.tokenizer.eot_id if self.config.segmented else None
    return lm_loss(self.model, params, batch_BxL1, rng, train, eot_id)

  def train_batches(self):
    """Process-local batches (B/P, seq_len + 1); a grain iterator, so `get_state` is the data position."""
    c = self.config
    ds = pipeline.lm_train_dataset(
      self.data,
      seq_len=c.seq_len,
      global_batch=c.batch_size,
      seed=self.run.loop.seed,
      sampling=c.sampling,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
    )
    return iter(ds.to_iter_dataset())

  def put(self, local_batch):
    # Each process read only its slice of the global batch (pipeline.lm_train_dataset).
    return jax.make_array_from_process_local_data(self.batch_sharding, local_batch)

  def batch_shapes(self):
    return jax.ShapeDtypeStruct((self.config.batch_size, self.config.seq_len + 1), jnp.int32)

  def tokens_per_step(self) -> int:
    return self.config.batch_size * self.config.seq_len

  def count_tokens(self, local_batch) -> int:
    return self.config.batch_size * self.config.seq_len

  def flops_per_token(self, num_params: int) -> float:
    cfg = self.model_config
    if cfg.family != "gpt":  # an LSTM: the 6N of its matmuls
      return metrics.flops_per_token(num_params, 0, 0, self.config.seq_len)
    attention_width = cfg.block.num_heads * cfg.block.head_dim  # d_model, but for Gemma's wider heads
    return metrics.flops_per_token(num_params, cfg.num_layers, attention_width, self.config.seq_len)

  def eval_batches(self) -> list:
    c = self.config
    return list(
      pipeline.lm_eval_batches(self.data, seq_len=c.seq_len, batch_size=c.eval_batch_size, num_batches=c.eval_batches)
    )

  def evaluate(self, params, eval_fn, batches: list) -> dict:
    """Validation loss and perplexity; with config.head_scores, every head's detector scores
    (`previous_token_L0H1`, `duplicate_token_...`, `induction_...`) on 16 rows of random tokens (among
    those of the first validation batch) repeated twice, and the in-context score on that batch."""
    result = super().evaluate(params, eval_fn, batches)
    if not self.config.head_scores:
      return result
    length = min(50, self.config.seq_len // 2)
    seen = np.unique(np.asarray(batches[0]))  # tokens of the text: the heads' behaviour on those is what counts
    tokens = interventions.repeated_random_tokens(self.model_config.vocab_size, length, batch=16, ids=seen)
    for kind, score_LxH in interventions.head_scores(self.model, params, tokens).items():
      result.update({f"{kind}_L{l}H{h}": float(s) for (l, h), s in np.ndenumerate(np.asarray(score_LxH))})
    inputs_BxL = jnp.asarray(batches[0])[:, :-1]
    result["in_context_score"] = float(interventions.in_context_score(self.model, params, inputs_BxL))
    return result

  def finish(self, params, workdir: Path, mean_of_last) -> dict:
    """A sample from the trained model (config.sample), printed and written to samples.txt; with
    config.head_scores, heads.png (the heads' scores by step, metrics.plot_head_scores)."""
    if jax.process_index() == 0 and self.config.head_scores:
      metrics.plot_head_scores(workdir / "metrics.jsonl", workdir / "heads.png", title=workdir.name)
    s = self.config.sample
    if s.max_new_tokens <= 0:
      return {}
    tok = self.tokenizer
    [ids] = sampling.generate(
      self.model,
      params,
      [self._sample_prompt],
      max_new_tokens=s.max_new_tokens,
      sampling=self.config.sample_options(),
      seed=s.seed,
      stop_id=tok.eot_id,
      mesh=self.mesh,
      rules=self.rules,
      sliding_window=True,
    )
    text = s.prompt + tok.decode(ids)
    if jax.process_index() == 0:
      (workdir / "samples.txt").write_text(text + "\n")
      print(f"\n--- sample (temperature {s.temperature}) ---\n{text}\n---")
    return {"sample": text}
