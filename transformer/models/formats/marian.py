"""Hugging Face Marian (`MarianMTModel`, the OPUS-MT models) safetensors <-> encoder-decoder params.

Marian is the encoder-decoder of "Attention Is All You Need" with a few choices of its own, each a
Seq2SeqConfig value here: post-LN blocks, one embedding for source, target and the tied head,
embeddings scaled by sqrt(d_model) (`scale_embedding`), sinusoids laid out in halves
(`sinusoids="halves"`), the `swish` activation, a `final_logits_bias`. Its linear layers are torch's
`[out, in]`: transposed here, then split into heads. Every key and shape is checked and the offending
one named; what the format holds that our model cannot express is refused in one line naming it.

    >>> config, params = import_hf_marian("path/to/opus-mt-de-en")   # its config.json, model.safetensors
    >>> logits = Transformer(config).apply({"params": params}, source_BxS, target_in_BxT)
    >>> export_hf_marian(config, params, tokenizer, "out/")  # MarianMTModel.from_pretrained("out/") loads it

The tokenizer pair is `tokenizers.MarianTokenizer`; `inference.import_marian` puts both together as a
trained translation model.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from transformer import layers
from transformer.errors import CheckpointError, ConfigError
from transformer.models import hf_files
from transformer.models.formats import streaming
from transformer.models.formats.base import Format, Tensor, as_is, linear, reshaped, stacked, stacked_bias, vector
from transformer.models.seq2seq import Seq2SeqConfig, Transformer

_ACTIVATIONS = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh"}


class MarianFormat(Format):
  """Marian (MarianMTModel): the config.json keys `marian_config` reads, those older (BART-era) files carry
  at the one value Marian uses, and the layout (`_layout`)."""

  model_type = "marian"
  architecture = "MarianMTModel"
  handled = frozenset(
    {"vocab_size", "decoder_vocab_size", "share_encoder_decoder_embeddings", "tie_word_embeddings", "d_model"}
    | {"max_position_embeddings", "encoder_layers", "decoder_layers", "encoder_attention_heads", "dtype"}
    | {"decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "activation_function", "torch_dtype"}
    | {"scale_embedding", "is_encoder_decoder", "encoder_layerdrop", "decoder_layerdrop", "num_hidden_layers"}
    | {"classif_dropout"}
  )
  fixed = {
    "normalize_before": False,
    "normalize_embedding": False,
    "add_final_layer_norm": False,
    "add_bias_logits": False,
    "static_position_embeddings": True,
    "extra_pos_embeddings": 0,
  }

  def config_from_hf(self, hf: dict, where: str) -> Seq2SeqConfig:
    return marian_config(hf, where)

  @property
  def name(self) -> str:
    return "Marian"

  def config_to_hf(self, config: Seq2SeqConfig, tokenizer=None) -> dict:
    return _export_checked(config, tokenizer)

  def layout(self, config: Seq2SeqConfig):
    return _layout(config.replace(scan_layers=False))

  def param_shapes(self, config: Seq2SeqConfig) -> dict:
    tokens = jax.ShapeDtypeStruct((1, 2), jnp.int32)
    return jax.eval_shape(lambda s, t: Transformer(config).init(jax.random.key(0), s, t), tokens, tokens)["params"]

  def stacks(self, config: Seq2SeqConfig) -> dict[str, int]:
    return {"encoder": config.num_layers, "decoder": config.decoder_layers()}

  def copies(self, config: Seq2SeqConfig) -> tuple[str, ...]:
    # older files keep copies of the shared embedding and the sinusoid tables
    tied = ("lm_head.weight",) if config.tie_output else ()
    return (
      *(f"model.{side}.{t}.weight" for side in ("encoder", "decoder") for t in ("embed_tokens", "embed_positions")),
      *tied,
    )

  def check_copies(self, copies: dict, params: dict, config: Seq2SeqConfig, where: str) -> None:
    shared = np.asarray(params["source_embed"]["table"]["embedding"])
    sinusoids = layers.sinusoidal_positions(config.max_len, config.block.d_model, "halves")
    for key, value in copies.items():
      if "embed_positions" in key and not np.allclose(value, sinusoids, atol=1e-5):
        raise CheckpointError(f"{where}: {key} is not Marian's sinusoid table; ours computes that table")
      if "embed_positions" not in key and not np.array_equal(value, shared):
        raise CheckpointError(f"{where}: {key} differs from the shared embedding; ours ties them")

  def exported(self, params: dict, entry: Tensor, config: Seq2SeqConfig) -> np.ndarray:
    return np.asarray(jax.device_get(hf_files.get_path(params, entry.ours)), np.float32)

  def write_beside(self, out_dir: Path, hf: dict, tokenizer) -> None:
    _write_beside(out_dir, hf, tokenizer)


FORMAT = MarianFormat()


def marian_config(hf: dict, where: str) -> Seq2SeqConfig:
  """Our Seq2SeqConfig for a Marian `config.json` (`hf`, read from `where`), or a CheckpointError naming
  the first field our model cannot express."""
  if hf.get("model_type") != "marian":
    raise CheckpointError(f"{where} is not a Marian config (model_type {hf.get('model_type')!r}, not 'marian')")
  FORMAT.check_keys(hf, where)
  for ours, theirs in (("heads", "attention_heads"), ("MLP width", "ffn_dim")):
    if hf[f"encoder_{theirs}"] != hf[f"decoder_{theirs}"]:
      raise CheckpointError(
        f"{where}: encoder_{theirs}={hf[f'encoder_{theirs}']} and decoder_{theirs}={hf[f'decoder_{theirs}']} "
        f"differ; our encoder and decoder blocks share their {ours}"
      )
  if not hf.get("share_encoder_decoder_embeddings", True) or hf.get("decoder_vocab_size") not in (
    None,
    hf["vocab_size"],
  ):
    raise CheckpointError(f"{where}: separate source and target vocabularies; ours share one (a joint vocabulary)")
  if hf.get("activation_function") not in _ACTIVATIONS:
    raise CheckpointError(
      f"{where}: activation_function {hf.get('activation_function')!r} is not one of ours ({', '.join(_ACTIVATIONS)})"
    )
  block = layers.BlockConfig(
    d_model=hf["d_model"],
    num_heads=hf["encoder_attention_heads"],
    d_mlp=hf["encoder_ffn_dim"],
    dropout_rate=float(hf.get("dropout", 0.0)),  # training's (fine-tuning); decoding runs without
    layer_norm_epsilon=1e-5,  # torch's LayerNorm default, which Marian's layers keep
    pre_layer_norm=False,
    activation=_ACTIVATIONS[hf["activation_function"]],
  )
  return Seq2SeqConfig(
    vocab_size=hf["vocab_size"],
    max_len=hf["max_position_embeddings"],
    num_layers=hf["encoder_layers"],
    num_decoder_layers=hf["decoder_layers"],
    block=block,
    share_embeddings=True,
    tie_output=hf.get("tie_word_embeddings", True),
    sinusoids="halves",
    scale_embeddings=bool(hf.get("scale_embedding", False)),
    logits_bias=True,
  ).check()


def is_marian(directory: str | Path) -> bool:
  """Whether `directory` holds a Marian model (its config.json says model_type "marian")."""
  try:
    return json.loads((Path(directory) / "config.json").read_text()).get("model_type") == "marian"
  except (OSError, ValueError, AttributeError):
    return False


def read_config(directory: str | Path) -> Seq2SeqConfig:
  """`marian_config` of a directory's config.json."""
  path = Path(directory) / "config.json"
  if not path.is_file():
    raise CheckpointError(f"{directory} has no config.json: give a Marian model's directory (MarianMTModel)")
  try:
    hf = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path} is not JSON ({e})") from None
  return marian_config(hf, str(path))


def differences(ours: Seq2SeqConfig, marian: Seq2SeqConfig) -> list[str]:
  """ "field=ours (Marian's: theirs)" for every field of ours that makes another model than `marian`."""
  return hf_files.differences(ours, marian, "Marian")


def _layout(cfg: Seq2SeqConfig):
  """Every param of the Marian model with config `cfg` as the Hugging Face tensors it is made of (`Tensor`),
  what drives import and export alike: the shared embedding, the logits bias, an untied head, and each
  layer's attention, norms and MLP. Self-attention's q, k, v are one fused projection of ours (`qkv`);
  cross-attention's `q` stands alone and its k, v are fused (`kv`), the encoder's output being their one
  input. (The copies older files keep of the embedding and the sinusoid tables are checked on import.)"""
  D, F, V = cfg.block.d_model, cfg.block.mlp_width, cfg.vocab_size
  H = cfg.block.num_heads
  K = D // H
  yield as_is(("source_embed", "table", "embedding"), "model.shared.weight", (V, D))
  yield reshaped(("final_logits_bias",), "final_logits_bias", (1, V), (V,))
  if not cfg.tie_output:
    yield linear(("head", "kernel"), "lm_head.weight", (V, D), (D, V))
  for side, count in (("encoder", cfg.num_layers), ("decoder", cfg.decoder_layers())):
    for i in range(count):
      key, ours = f"model.{side}.layers.{i}", (side, f"layer_{i}")
      attentions = [("self_attn", "attn", "qkv")] + (
        [("encoder_attn", "cross_attn", "kv")] if side == "decoder" else []
      )
      norms = [("self_attn_layer_norm", "ln_1"), ("final_layer_norm", "ln_2")]
      norms += [("encoder_attn_layer_norm", "ln_cross")] if side == "decoder" else []
      for theirs, mine, fused in attentions:
        at, names = ours + (mine,), [f"{key}.{theirs}.{name}_proj" for name in fused]
        if fused == "kv":
          yield linear((*at, "q", "kernel"), f"{key}.{theirs}.q_proj.weight", (D, D), (D, H, K))
          yield vector((*at, "q", "bias"), f"{key}.{theirs}.q_proj.bias", (H, K))
        n = len(fused)
        yield stacked((*at, fused, "kernel"), tuple(f"{k}.weight" for k in names), ((D, D),) * n, (D, n, H, K))
        yield stacked_bias((*at, fused, "bias"), tuple(f"{k}.bias" for k in names), (n, H, K))
        yield linear((*at, "out", "kernel"), f"{key}.{theirs}.out_proj.weight", (D, D), (H, K, D))
        yield as_is((*at, "out", "bias"), f"{key}.{theirs}.out_proj.bias", (D,))
      for theirs, mine in norms:
        yield as_is(ours + (mine, "scale"), f"{key}.{theirs}.weight", (D,))
        yield as_is(ours + (mine, "bias"), f"{key}.{theirs}.bias", (D,))
      for theirs, mine, shape in (("fc1", "fc", (F, D)), ("fc2", "proj", (D, F))):
        yield linear(ours + ("mlp", mine, "kernel"), f"{key}.{theirs}.weight", shape, shape[::-1])
        yield as_is(ours + ("mlp", mine, "bias"), f"{key}.{theirs}.bias", shape[:1])


def import_hf_marian(directory: str | Path) -> tuple[Seq2SeqConfig, dict]:
  """(config, params) of a Marian directory (`config.json`, `model.safetensors`), every tensor
  checked against the shape our model gives it. The copies older files keep of the shared embedding
  (`encoder.embed_tokens`, `decoder.embed_tokens`, a tied `lm_head`) must equal it, and their
  sinusoid tables ours."""
  directory = Path(directory)
  cfg, weights = read_config(directory), directory / "model.safetensors"
  if not weights.is_file():
    raise CheckpointError(
      f"{directory} has no model.safetensors: give a Marian model's directory (MarianMTModel; an older one's "
      f"pytorch_model.bin converts with MarianMTModel.from_pretrained(DIR).save_pretrained(DIR))"
    )
  return cfg, streaming.read_params([weights], FORMAT, cfg, cfg)


# ---------------------------------------------------------------------------------------------
# Export: ours -> a directory MarianMTModel.from_pretrained and MarianTokenizer.from_pretrained load.


def export_config(cfg: Seq2SeqConfig, tokenizer) -> dict:
  """The config.json of MarianConfig for `cfg`, its special ids from the Marian `tokenizer`."""
  b = cfg.block
  theirs = {v: k for k, v in _ACTIVATIONS.items() if k != "silu"}
  pad, eos = tokenizer.pad_id, tokenizer.eot_id
  return {
    "architectures": ["MarianMTModel"],
    "model_type": "marian",
    "vocab_size": cfg.vocab_size,
    "decoder_vocab_size": cfg.vocab_size,
    "share_encoder_decoder_embeddings": cfg.share_embeddings,
    "tie_word_embeddings": cfg.tie_output,
    "max_position_embeddings": cfg.max_len,
    "d_model": b.d_model,
    "encoder_layers": cfg.num_layers,
    "decoder_layers": cfg.decoder_layers(),
    "encoder_attention_heads": b.num_heads,
    "decoder_attention_heads": b.num_heads,
    "encoder_ffn_dim": b.mlp_width,
    "decoder_ffn_dim": b.mlp_width,
    "activation_function": theirs.get(b.activation, b.activation),
    "scale_embedding": cfg.scale_embeddings,
    "dropout": b.dropout_rate,
    "attention_dropout": b.attention_dropout_rate,
    "activation_dropout": 0.0,
    "encoder_layerdrop": 0.0,
    "decoder_layerdrop": 0.0,
    "init_std": 0.02,
    "is_encoder_decoder": True,
    "use_cache": True,
    "dtype": "float32",
    "bos_token_id": None,
    "pad_token_id": pad,
    "eos_token_id": eos,
    "forced_eos_token_id": eos,
    "decoder_start_token_id": pad,
  }


def _export_checked(cfg: Seq2SeqConfig, tokenizer) -> dict:
  """export_config(cfg), after refusing a tokenizer that is no Marian pair and an activation the format has no
  name for (the rest it cannot hold, streaming.write refuses by `cannot_hold`)."""
  if getattr(tokenizer, "name", None) != "marian":
    raise ConfigError(
      f"the model reads {tokenizer} tokens; MarianTokenizer reads SentencePiece pairs (source.spm, target.spm, "
      f"vocab.json): export a run fine-tuned from a Marian model, or trained on data prepared with "
      f"--config.data.tokenizer=<a Marian model's directory>"
    )
  block = cfg.block
  if block.activation not in _ACTIVATIONS.values():
    raise ConfigError(f"Marian's format cannot hold block.activation={block.activation!r} ({', '.join(_ACTIVATIONS)})")
  return export_config(cfg, tokenizer)


def export_hf_marian(cfg: Seq2SeqConfig, params: dict, tokenizer, out_dir: str | Path) -> Path:
  """Writes `config.json`, `generation_config.json`, `model.safetensors` (the tensors transformers'
  `save_pretrained` writes: the shared embedding once, the layers, `final_logits_bias`) and the
  tokenizer pair (`source.spm`, `target.spm`, `vocab.json`, `tokenizer_config.json`) to `out_dir`.
  A model Marian's format cannot hold (pre-LN blocks, interleaved sinusoids, no logits bias, ...)
  is refused, each such field named."""
  hf = _export_checked(cfg, tokenizer)
  out_dir = streaming.write(FORMAT, cfg, params, out_dir, hf)
  FORMAT.write_beside(out_dir, hf, tokenizer)
  return out_dir


def _write_beside(out_dir: Path, hf: dict, tokenizer) -> None:
  """What a Marian directory holds beside its weights: generation_config.json and the tokenizer pair."""
  generation = {k: hf[k] for k in ("decoder_start_token_id", "eos_token_id", "forced_eos_token_id", "pad_token_id")}
  generation["bad_words_ids"] = [[tokenizer.pad_id]]  # the decoder's start, never generated
  (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
  tokenizer.write_files(out_dir)
  tokenizer_config = {"tokenizer_class": "MarianTokenizer", "model_max_length": 512, "separate_vocabs": False}
  tokenizer_config |= {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
  (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
