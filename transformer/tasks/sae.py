"""config.task="sae": a sparse autoencoder (transformer.models.sae) on activations, trained by the one
loop (checkpoints, resume, metrics.jsonl, TensorBoard, `--config.x=` overrides come with it).

The activations (transformer.data.activations; a model's, transformer.interp.activations), one source a run:
  --config.run=WORKDIR         a trained GPT's, at --config.point (resid_pre, resid_post, mlp_out,
                               z, ...) of block --config.layer (-1: the middle one), computed on the
                               fly from that run's text
  --config.hf=DIR              a Hugging Face model's (an open model's or GPT-2's), on the text of config.data
                               (--config.data.input_files=my.txt: your own text; the model's tokenizer reads it)
  --config.data.input_files=acts.npy   an array you bring (.npy or .safetensors, rows x d_in), without a model
  --config.synthetic_features=N        N features in superposition whose directions are known

Inputs are scaled to a mean norm of √d_in (config.normalize: SAELens's "expected_average_only_in"),
the factor kept in the SAE's params (`input_scale`) and undone on its output. Every evaluation scores
as SAELens names its scores: l0, mse, explained_variance, fvu, dead latents (no activation for
config.dead_tokens tokens) and dense ones (firing on more than a tenth of the tokens); with a model's
activations, the model's loss clean (`ce_loss_clean`), with the SAE's reconstruction spliced in at
the point (`ce_loss_spliced`, through run_with_patches) and with the point zeroed (`ce_loss_zero`),
and `ce_loss_score` = (zero - spliced) / (zero - clean); with synthetic ones, the recovery of the
true features (`mcc`, `mean_max_cosine`).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from transformer import data, metrics, tokenizers
from transformer import workdir as workdir_files
from transformer.config import RunConfig, check_positive, resolve_for
from transformer.data.activations import ActivationStore, ArrayActivations, SyntheticActivations, read_array
from transformer.data.superposition import Superposition
from transformer.errors import ConfigError, DataError
from transformer.interp import interventions, replacement
from transformer.interp.activations import ModelActivations, locate, middle_layer
from transformer.interp.interventions import Patch
from transformer.layers.points import Point
from transformer.models import formats
from transformer.models.clt import CLTConfig, CrossLayerTranscoder, check_recipe, clt_loss, init_clt_params
from transformer.models.gpt import GPT
from transformer.models.sae import (
  SAE,
  init_decoder_bias,
  latent_density,
  norm_scale,
  recovery,
  sae_loss,
  scores,
  threshold_from_data,
)
from transformer.tasks.base import Task
from transformer.tasks.lm import LanguageModel

DENSE = 0.1  # a latent firing on more than this share of tokens is dense (SAELens's feature-density plots)
SOURCES = ("run", "hf", "data.input_files", "synthetic_features")


@dataclasses.dataclass(frozen=True)
class SAETaskConfig:
  run: str = ""  # a trained GPT's workdir, whose activations the SAE learns ...
  hf: str = ""  # ... or a GPT-2 directory (Hugging Face files), on config.data's text ...
  synthetic_features: int = 0  # ... or this many features in superposition (else data.input_files)
  synthetic_d: int = 64
  synthetic_density: float = 0.02
  synthetic_importance: float = 1.0
  # A named point (transformer.interp.interventions), in our words or TransformerLens's: a name that says its
  # block (`blocks.3.hook_resid_pre`, `L3.resid_pre`) sets --config.layer (given both, they must agree).
  point: str = "resid_pre"
  layer: int = -1  # its block; -1: the middle one
  # A transcoder: the point of the same block it writes from `point` (mlp_in -> mlp_out: the MLP
  # replaced by a sparse dictionary); "": an SAE, which reconstructs its point. A model's source only.
  target_point: str = ""
  # A cross-layer transcoder (transformer.models.clt): `point` read at every layer, `target_point` written at
  # each from its own and every earlier layer's latents (--config.layer unused); with target_point.
  cross_layer: bool = False
  seq_len: int = 128  # the model's windows, each of seq_len rows
  batch_size: int = 4096  # rows a step
  buffer_sequences: int = 256  # windows a refill of the activation store computes and shuffles
  lm_batch_size: int = 32  # windows a forward pass of the model
  eval_sequences: int = 32  # validation windows: the rows every evaluation scores, and ce_loss_score's text
  eval_rows: int = 8192  # the rows an array or synthetic source holds out for evaluation
  dead_tokens: int = 1_000_000  # a latent that has not fired for this many tokens is dead (AuxK's, the score's)
  init_b_dec: str = "geometric_median"  # | "mean" | "zeros": b_dec at the start (of the first refill's rows)
  normalize: bool = True  # inputs scaled to a mean norm of √d_in

  may_change: ClassVar[tuple[str, ...]] = ("eval_sequences", "eval_rows")

  def __post_init__(self):
    # The points in our words, once, and the block a point's name says: what every reader of them takes.
    layers = {}
    for key in ("point", "target_point"):
      try:
        point = Point.parse(getattr(self, key)) if getattr(self, key) else None
      except KeyError as e:
        raise ConfigError(f"--config.{key}: {e.args[0]}") from None
      if point is not None:
        if point.head is not None:
          raise ConfigError(f"--config.{key}={getattr(self, key)!r} names a head; an SAE reads a whole point")
        object.__setattr__(self, key, point.name)
        if point.layer is not None:
          layers[key] = point.layer
    named = set(layers.values())
    if len(named) > 1 or (named and self.layer not in (-1, *named)):
      given = ", ".join(f"--config.{k} in block {v}" for k, v in layers.items())
      raise ConfigError(f"{given} and --config.layer={self.layer}: name one block (or leave --config.layer out)")
    if named:
      object.__setattr__(self, "layer", named.pop())

  def check(self, run: RunConfig, data_parallel: int | None) -> None:
    check_positive(self, ("seq_len", "batch_size", "buffer_sequences", "lm_batch_size", "eval_sequences", "eval_rows"))
    given = [s for s, v in zip(SOURCES, self.sources(run)) if v]
    if len(given) != 1:
      raise ConfigError(
        f"an SAE learns one source of activations; give exactly one of --config.{', --config.'.join(SOURCES)} "
        f"(given: {', '.join(given) or 'none'})"
      )
    if self.run and not (Path(self.run) / workdir_files.CONFIG).is_file():
      raise ConfigError(
        f"--config.run={self.run!r} is not a training workdir (no {workdir_files.CONFIG}); check the path"
      )
    if self.run:
      saved = workdir_files.saved_config_dict(Path(self.run))
      if saved.get("task", "lm") != "lm" or saved.get("model", {}).get("family", "gpt") != "gpt":
        raise ConfigError(
          f"--config.run={self.run!r} holds no GPT (config.task, model.family); an SAE reads a GPT's points"
        )
    if self.init_b_dec not in ("geometric_median", "mean", "zeros"):
      raise ConfigError(f"--config.init_b_dec={self.init_b_dec!r}: choose geometric_median, mean or zeros")
    if self.dead_tokens <= 0:
      raise ConfigError(f"--config.dead_tokens must be positive, got {self.dead_tokens}")
    if run.optimizer.accumulation_steps != 1:
      raise ConfigError(
        "an SAE's step sets its firing statistics from the whole batch: keep optimizer.accumulation_steps=1"
      )
    if self.synthetic_features:
      self.superposition()  # its own checks
    if self.target_point and not (self.run or self.hf):
      raise ConfigError(
        f"--config.target_point={self.target_point!r} makes a transcoder, which reads two points of a model: give "
        f"--config.run or --config.hf (an array or synthetic rows have one point)"
      )
    if self.cross_layer and not self.target_point:
      raise ConfigError(
        "--config.cross_layer makes a cross-layer transcoder: give --config.target_point (e.g. mlp_in -> mlp_out)"
      )
    if self.cross_layer:
      check_recipe(run.model)
    if bool(self.target_point) != bool(run.model.d_out) and run.model.d_out:
      raise ConfigError(
        "--config.model.d_out is a transcoder's: set --config.target_point (its width is taken from it)"
      )
    if data_parallel is not None and self.batch_size % data_parallel:
      raise ConfigError(
        f"--config.batch_size={self.batch_size} is not divisible by the data-parallel size {data_parallel}"
      )

  def sources(self, run: RunConfig) -> tuple:
    return self.run, self.hf, self.arrays(run), self.synthetic_features

  def arrays(self, run: RunConfig) -> tuple[str, ...]:
    """data.input_files as activations to learn; with a model (run or hf) they are its text instead."""
    return () if self.run or self.hf else tuple(run.data.input_files)

  def superposition(self) -> Superposition:
    try:
      return Superposition(
        num_features=self.synthetic_features,
        d=self.synthetic_d,
        density=self.synthetic_density,
        importance=self.synthetic_importance,
      )
    except ValueError as e:
      raise ConfigError(f"--config.synthetic_*: {e}") from None


@dataclasses.dataclass
class SAEData:
  """The SAE's activations (a source of transformer.data.activations) and the tokenizer of their text
  (for arrays and synthetic rows, which have none: GPT-2's, what a workdir keeps)."""

  source: Any
  tokenizer: Any


def source_model(config: SAETaskConfig) -> tuple[Any, Any]:
  """(GPT, abstract params) of the model whose activations a run or hf source reads: its shapes only,
  from its config (what the SAE's width needs when its model is restored for inference)."""
  if config.hf:
    gpt_config, params = formats.import_lm(config.hf)
    return GPT(gpt_config), params
  run = resolve_for(LanguageModel, workdir_files.saved_config_dict(Path(config.run)))  # a GPT's: config.check
  vocab = tokenizers.load_tokenizer(Path(config.run) / workdir_files.TOKENIZER).vocab_size
  model = GPT(run.model_config(vocab))
  return model, jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"])


class SparseAutoencoder(Task):
  """An SAE (config.model: SAEConfig fields) on the activations of config's source."""

  name = "sae"
  Config = SAETaskConfig
  families = ("sae",)
  data_kind = "activations"
  data_from_model = True
  curves = ("explained_variance",)

  def __init__(self, run: RunConfig, tokenizer, mesh, data: SAEData | None = None, labels=None):
    if data is not None:
      d_in, d_out, layers = data.source.d_in, getattr(data.source, "d_out", 0), getattr(data.source, "layers", 0)
    else:
      d_in, d_out, layers = self.source_width(run)
    if run.model.d_in and run.model.d_in != d_in:
      raise DataError(
        f"--config.model.d_in={run.model.d_in}, but the activations are {d_in} wide; set it to 0 "
        f"(take theirs) or {d_in}"
      )
    model = run.model.replace(d_in=d_in, d_out=d_out)
    if layers:
      model = CLTConfig.of(model, layers)
    super().__init__(dataclasses.replace(run, model=model), tokenizer, mesh, data)

  @classmethod
  def source_width(cls, run: RunConfig) -> tuple[int, int, int]:
    """(d_in, d_out, layers) of the source: the point's width, a transcoder's target's (else 0), and the
    layers a cross-layer transcoder spans (else 0)."""
    c = run.task_config
    if c.synthetic_features:
      return c.synthetic_d, 0, 0
    if c.arrays(run):
      return read_array(run.data.input_files[0]).shape[1], 0, 0
    model, params = source_model(c)
    layer = 0 if c.cross_layer else middle_layer(model, c.layer)
    d_out = locate(model, params, c.target_point, layer)[0] if c.target_point else 0
    return locate(model, params, c.point, layer)[0], d_out, model.config.num_layers if c.cross_layer else 0

  @classmethod
  def load_data(cls, run: RunConfig, load=None) -> SAEData:
    """The activations of the config's source; `load` (inference.load, which the loop hands over)
    restores the model of a run or hf source."""
    c = run.task_config
    if c.synthetic_features:
      source = SyntheticActivations(c.superposition(), batch_size=c.batch_size, eval_rows=c.eval_rows)
      return SAEData(source, tokenizers.get_tokenizer("gpt2"))
    if c.arrays(run):
      if len(run.data.input_files) != 1:
        raise DataError(f"an SAE reads one array of activations; got {len(run.data.input_files)} files")
      rows = read_array(run.data.input_files[0])
      source = ArrayActivations(
        rows, validation_fraction=run.data.validation_fraction or 0.1, eval_rows=c.eval_rows, seed=run.loop.seed
      )
      return SAEData(source, tokenizers.get_tokenizer("gpt2"))
    trained = load(workdir=c.run) if c.run else load(hf=c.hf, tokenizer=run.data.tokenizer)
    if c.run and not run.data.input_files:  # the run's own text
      text_data = trained.run.data
    else:  # config.data's text (a data set, or your files), read by the model's own tokenizer
      own = str(Path(c.run) / workdir_files.TOKENIZER) if c.run else trained.run.data.tokenizer
      text_data = dataclasses.replace(run.data, tokenizer=own)
    text = data.prepared_for(text_data, data.source_of(text_data, "text"))
    if not tokenizers.identical(text.tokenizer, trained.tokenizer):
      raise DataError(f"{text.directory} is tokenized by {text.tokenizer.name}, not the model's tokenizer")
    source = ModelActivations(
      trained.model,
      trained.params,
      text,
      point=c.point,
      layer=0 if c.cross_layer else middle_layer(trained.model, c.layer),
      seq_len=min(c.seq_len, trained.model.config.max_len),
      buffer_sequences=c.buffer_sequences,
      batch_sequences=c.lm_batch_size,
      eval_sequences=c.eval_sequences,
      seed=run.loop.seed,
      target_point=c.target_point,
      all_layers=c.cross_layer,
    )
    return SAEData(source, trained.tokenizer)

  def build_model(self, model_config):
    return CrossLayerTranscoder(model_config) if _cross_layer(model_config) else SAE(model_config)

  def init_inputs(self) -> tuple:
    cfg = self.model_config
    return (jnp.zeros((cfg.layers, 2, cfg.d_in)),) if _cross_layer(cfg) else (jnp.zeros((2, cfg.d_in)),)

  def init_params(self, params, restore):
    """b_dec at the first refill's mean or geometric median, and the inputs' scale, from its rows (a
    transcoder's: b_dec and `output_scale` from the target's columns); JumpReLU's θ₀ from them too
    (`initial_density`)."""
    rows = self.data.source.chunk(0)[: 16 * self.config.batch_size]
    if _cross_layer(self.model_config):
      return init_clt_params(
        self.model, params, *_split(self.model_config, rows), self.config.normalize, self.config.init_b_dec
      )
    x_NxD, y_NxO = _split(self.model_config, rows)
    scale = norm_scale(x_NxD) if self.config.normalize else 1.0
    params = {**params, "input_scale": jnp.full_like(params["input_scale"], scale)}
    if y_NxO is not None:
      scale = norm_scale(y_NxO) if self.config.normalize else 1.0
      params["output_scale"] = jnp.full_like(params["output_scale"], scale)
    if self.config.init_b_dec != "zeros":
      params = init_decoder_bias(params, (x_NxD if y_NxO is None else y_NxO) * scale, self.config.init_b_dec)
    if self.model_config.activation == "jumprelu" and self.model_config.initial_density > 0:
      params = threshold_from_data(self.model, params, x_NxD, self.model_config.initial_density)
    return params

  def update_scale(self):
    """The statistics and the inputs' scale are set, not learned (SAE's docstring)."""
    set_not_learned = ("since_fired", "input_scale", "output_scale")
    if self.model_config.activation == "batchtopk":  # JumpReLU's threshold is learned
      set_not_learned += ("threshold",)
    return lambda params: {k: jnp.zeros(()) if k in set_not_learned else jnp.ones(()) for k in params}

  def loss(self, params, batch_NxD, rng, train: bool):
    """The summed loss of the rows, their number, and (training) the statistics' new values."""
    x_NxD, y_NxO = _split(self.model_config, batch_NxD)
    if _cross_layer(self.model_config):
      loss, _, stats = clt_loss(self.model, params, x_NxD, y_NxO, dead_tokens=self.config.dead_tokens)
    else:
      loss, _, stats = sae_loss(
        self.model, params, x_NxD, train=train, dead_tokens=self.config.dead_tokens, y_NxO=y_NxO
      )
    rows = jnp.float32(batch_NxD.shape[0])
    return loss * rows, (rows, stats) if train else rows

  def train_batches(self):
    return ActivationStore(self.data.source, self.config.batch_size)

  def batch_shapes(self):
    cfg = self.model_config  # a transcoder's rows: its input, then its target (a cross-layer one's: every layer's)
    width = (cfg.d_in + cfg.d_out) * (cfg.layers if _cross_layer(cfg) else 1)
    return jax.ShapeDtypeStruct((self.config.batch_size, width), jnp.float32)

  def count_tokens(self, host_batch) -> int:
    return self.config.batch_size

  def flops_per_token(self, num_params: int) -> float:
    return metrics.flops_per_token(num_params, 0, 0, 1)

  def eval_batches(self) -> list:
    rows = self.data.source.eval_rows()
    return [rows[: len(rows) - len(rows) % self.run.mesh.data_parallel]]

  def evaluate(self, params, eval_fn, batches: list) -> dict:
    result = super().evaluate(params, eval_fn, batches)
    del result["val_perplexity"]
    [rows_NxD] = batches
    x_NxD, x_hat_NxD, z_NxZ = _scaled_forward(self.model, params, rows_NxD)
    result.update(scores(x_NxD, x_hat_NxD, z_NxZ))
    density_Z = latent_density(z_NxZ)
    result["dead_latents"] = float(np.mean(np.asarray(params["since_fired"]) >= self.config.dead_tokens))
    result["dense_latents"] = float(np.mean(density_Z > DENSE))
    source = self.data.source
    if isinstance(source, ModelActivations) and _cross_layer(self.model_config):
      result.update(_replaced_losses(source, self.model, params))
    elif isinstance(source, ModelActivations):
      result.update(spliced_losses(source, self.model, params))
    if isinstance(source, SyntheticActivations):
      decoder_ZxD = _decoder(self.model, params)
      result.update(recovery(np.asarray(decoder_ZxD), source.source.directions_FxD))
    return result

  def describe(self, result: dict) -> str:
    line = (
      f"explained variance {result['explained_variance']:.3f}, L0 {result['l0']:.1f}, "
      f"dead {100 * result['dead_latents']:.1f}%, dense {100 * result['dense_latents']:.1f}%"
    )
    if "ce_loss_score" in result:
      line += f", ce_loss_score {result['ce_loss_score']:.3f}"
    if "mcc" in result:
      line += f", MCC {result['mcc']:.3f}, {100 * result['recovered']:.0f}% of features found"
    return line


def _cross_layer(cfg) -> bool:
  return isinstance(cfg, CLTConfig)


def _split(cfg, rows_NxW):
  """(the input columns, a transcoder's target columns or None): rows are d_in (+ d_out) wide; a cross-layer
  transcoder's, every layer's input then every layer's target: (L x N x d_in, L x N x d_out)."""
  if not cfg.d_out:
    return rows_NxW, None
  if _cross_layer(cfg):
    L, N = cfg.layers, rows_NxW.shape[0]
    x_LxNxD = rows_NxW[:, : L * cfg.d_in].reshape(N, L, cfg.d_in).transpose(1, 0, 2)
    return x_LxNxD, rows_NxW[:, L * cfg.d_in :].reshape(N, L, cfg.d_out).transpose(1, 0, 2)
  return rows_NxW[:, : cfg.d_in], rows_NxW[:, cfg.d_in :]


@functools.partial(jax.jit, static_argnums=0)
def _scaled_forward(sae: SAE, params, rows_NxW):
  """(the target, its reconstruction, the latents), target and reconstruction in the space the SAE
  writes in (times `input_scale`, a transcoder's `output_scale`): what `scores` reads, one program. An
  SAE's target is its input; a transcoder's, the point it writes."""
  x_NxD, y_NxO = _split(sae.config, rows_NxW)
  y_hat_NxO, z_NxZ = sae.apply({"params": params}, x_NxD)
  if _cross_layer(sae.config):  # every layer's target side by side (N x L·O), every layer's latents (N x L·Z)
    side_by_side = lambda a_LxNxW: a_LxNxW.transpose(1, 0, 2).reshape(a_LxNxW.shape[1], -1)
    scale_LxNx1 = params["output_scale"][:, None, None]
    return side_by_side(y_NxO * scale_LxNx1), side_by_side(y_hat_NxO * scale_LxNx1), side_by_side(z_NxZ)
  scale = params["input_scale"] if y_NxO is None else params["output_scale"]
  target_NxO = x_NxD if y_NxO is None else y_NxO
  return target_NxO * scale, y_hat_NxO * scale, z_NxZ


_decoder = jax.jit(lambda sae, params: sae.apply({"params": params}, method=SAE.decoder), static_argnums=0)


def splice(source: ModelActivations, sae: SAE, sae_params, tokens_BxT) -> dict:
  """The patch that puts the SAE's reconstruction of the point in place of the point, on these tokens; a
  transcoder's output (of the point it reads, in the clean run) in place of the point it writes."""
  x = source.at_point(tokens_BxT)
  if not source.target_point:
    return {(source.point, source.point_layer): Patch.replace(_reconstruction(sae, source.d_in, sae_params, x))}
  y_hat = _transcoded(sae, source.d_in, source.d_out, sae_params, x)
  return {(source.target_point, source.point_layer): Patch.replace(y_hat.reshape(*x.shape[:2], -1))}


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _transcoded(sae: SAE, d_in: int, d_out: int, sae_params, x):
  """A transcoder's output from its point's activations, rows x d_out in the point's dtype: one program."""
  y_hat, _ = sae.apply({"params": sae_params}, x.reshape(-1, d_in).astype(jnp.float32))
  return y_hat.astype(x.dtype)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _reconstruction(sae: SAE, d_in: int, sae_params, x):
  """The SAE's reconstruction of a point's activations, in their shape and dtype: one compiled program."""
  x_hat, _ = sae.apply({"params": sae_params}, x.reshape(-1, d_in).astype(jnp.float32))
  return x_hat.reshape(x.shape).astype(x.dtype)


def _replaced_losses(source: ModelActivations, clt: CrossLayerTranscoder, params) -> dict[str, float]:
  """A cross-layer transcoder's replacement model (every MLP replaced at once, on the stream as it is then)
  against the clean model and every MLP zeroed, on the evaluation windows, named as `spliced_losses` names."""
  tc = replacement.CrossLayerTranscoders(clt, params, source.point, source.target_point)
  losses = replacement.replacement_losses(source.model, source.params, jnp.asarray(source.eval_tokens_BxT()), tc)
  return {
    "ce_loss_clean": losses["clean"],
    "ce_loss_spliced": losses["replaced"],
    "ce_loss_zero": losses["zero_mlp"],
    "ce_loss_score": losses["score"],
  }


def spliced_losses(source: ModelActivations, sae: SAE, sae_params) -> dict[str, float]:
  """The model's next-token loss on the evaluation windows clean, with the SAE spliced in at the point,
  and with the point zeroed; ce_loss_score (1: the SAE loses nothing, 0: no better than zeroing)."""
  tokens_BxT = jnp.asarray(source.eval_tokens_BxT())
  loss = lambda patches: float(interventions.next_token_losses(source.model, source.params, tokens_BxT, patches).mean())
  clean, zero = source.reference_losses
  spliced = loss(splice(source, sae, sae_params, tokens_BxT))
  return {
    "ce_loss_clean": clean,
    "ce_loss_spliced": spliced,
    "ce_loss_zero": zero,
    "ce_loss_score": (zero - spliced) / (zero - clean) if zero != clean else float("nan"),
  }
