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

import dataclasses
import json
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from transformer import layers
from transformer.errors import CheckpointError, ConfigError
from transformer.models.hf_files import save_safetensors
from transformer.models.seq2seq import Seq2SeqConfig, Transformer

_ACTIVATIONS = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh"}


class _Reading(dict):
  """The tensors of a file, remembering which keys were read: the rest are what our model lacks."""

  def __init__(self, tensors: dict):
    super().__init__(tensors)
    self.read: set[str] = set()

  def __getitem__(self, key: str):
    self.read.add(key)
    return super().__getitem__(key)


def marian_config(hf: dict, where: str) -> Seq2SeqConfig:
  """Our Seq2SeqConfig for a Marian `config.json` (`hf`, read from `where`), or a CheckpointError naming
  the first field our model cannot express."""
  if hf.get("model_type") != "marian":
    raise CheckpointError(f"{where} is not a Marian config (model_type {hf.get('model_type')!r}, not 'marian')")
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


# What may differ from a Marian directory's config without changing the function the model computes
# (or changes it only in training): dropout, precision, the attention's implementation, initialisation,
# scanning and rematerialisation.
_FREE = {"dropout_rate", "attention_dropout_rate", "dtype", "param_dtype", "attention", "kernel_init"}
_FREE |= {"kernels", "scan_layers", "remat_policy", "source_word_dropout"}


def differences(ours: Seq2SeqConfig, marian: Seq2SeqConfig) -> list[str]:
  """ "field=ours (Marian's: theirs)" for every field of ours that makes another model than `marian`."""
  out = []
  for name, mine, theirs in _fields(ours, marian):
    if mine != theirs and name.split(".")[-1] not in _FREE:
      out.append(f"{name}={mine!r} (Marian's: {theirs!r})")
  return out


def _fields(a, b, prefix: str = ""):
  for f in dataclasses.fields(a):
    x, y = getattr(a, f.name), getattr(b, f.name)
    if dataclasses.is_dataclass(x):
      yield from _fields(x, y, f"{prefix}{f.name}.")
    else:
      yield f"{prefix}{f.name}", x, y


def _attention(tensors, key: str, D: int, H: int, cross: bool) -> dict:
  """A Marian attention's q/k/v/out projections (torch Linear, [out, in]) as our kernels: self-attention
  one fused `qkv`, cross-attention `q` and a fused `kv`."""
  K = D // H
  kernel = lambda name: tensors[f"{key}.{name}_proj.weight"].T.reshape(D, H, K)  # in -> heads
  bias = lambda name: tensors[f"{key}.{name}_proj.bias"].reshape(H, K)
  fused = lambda names: {"kernel": np.stack([kernel(n) for n in names], 1), "bias": np.stack([bias(n) for n in names])}
  out_weight = tensors[f"{key}.out_proj.weight"].T.reshape(H, K, D)
  projections = {"q": {"kernel": kernel("q"), "bias": bias("q")}, "kv": fused("kv")} if cross else {"qkv": fused("qkv")}
  return {**projections, "out": {"kernel": out_weight, "bias": tensors[f"{key}.out_proj.bias"]}}


def _norm(tensors, key: str) -> dict:
  return {"scale": tensors[f"{key}.weight"], "bias": tensors[f"{key}.bias"]}


def _block(tensors, key: str, cfg: Seq2SeqConfig, cross: bool) -> dict:
  D, H = cfg.block.d_model, cfg.block.num_heads
  block = {
    "attn": _attention(tensors, f"{key}.self_attn", D, H, cross=False),
    "ln_1": _norm(tensors, f"{key}.self_attn_layer_norm"),
    "mlp": {
      "fc": {"kernel": tensors[f"{key}.fc1.weight"].T, "bias": tensors[f"{key}.fc1.bias"]},
      "proj": {"kernel": tensors[f"{key}.fc2.weight"].T, "bias": tensors[f"{key}.fc2.bias"]},
    },
    "ln_2": _norm(tensors, f"{key}.final_layer_norm"),
  }
  if cross:
    block["cross_attn"] = _attention(tensors, f"{key}.encoder_attn", D, H, cross=True)
    block["ln_cross"] = _norm(tensors, f"{key}.encoder_attn_layer_norm")
  return block


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
  try:
    tensors = load_file(weights)
  except SafetensorError as e:
    raise CheckpointError(f"{weights} is not a safetensors file ({e})") from None
  tensors = _Reading({k.removeprefix("model."): v for k, v in tensors.items()})
  if "shared.weight" not in tensors:
    raise CheckpointError(f"{weights} has no tensor 'model.shared.weight': not a Marian checkpoint")
  shared = tensors["shared.weight"]
  # Older files keep copies of the shared embedding and the sinusoid tables: read (so not leftovers)
  # and checked to be what our model computes.
  copies = ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"]
  copies += ["lm_head.weight"] if cfg.tie_output else []
  for key in copies:
    if key in tensors and not np.array_equal(tensors[key], shared):
      raise CheckpointError(f"{weights}: {key} differs from the shared embedding; ours ties them")
  sinusoids = layers.sinusoidal_positions(cfg.max_len, cfg.block.d_model, "halves")
  for key in ("encoder.embed_positions.weight", "decoder.embed_positions.weight"):
    if key in tensors and not np.allclose(tensors[key], sinusoids, atol=1e-5):
      raise CheckpointError(f"{weights}: {key} is not Marian's sinusoid table; ours computes that table")

  try:
    params = {
      "source_embed": {"table": {"embedding": shared}},
      "final_logits_bias": tensors["final_logits_bias"].reshape(-1),
      "encoder": {f"layer_{i}": _block(tensors, f"encoder.layers.{i}", cfg, False) for i in range(cfg.num_layers)},
      "decoder": {f"layer_{i}": _block(tensors, f"decoder.layers.{i}", cfg, True) for i in range(cfg.decoder_layers())},
    }
    if not cfg.tie_output:
      params["head"] = {"kernel": tensors["lm_head.weight"].T}
  except KeyError as e:
    raise CheckpointError(
      f"{weights} is missing tensor {e.args[0]!r} for {cfg.num_layers}+{cfg.decoder_layers()} layers"
    ) from None
  unexpected = sorted(set(tensors) - tensors.read)
  if unexpected:
    raise CheckpointError(f"{weights} has tensors our model does not: {', '.join(unexpected[:5])}")

  shapes = nn.unbox(
    jax.eval_shape(
      lambda: Transformer(cfg).init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32), jnp.zeros((1, 2), jnp.int32))
    )
  )["params"]
  flat_shapes = dict(jax.tree_util.tree_flatten_with_path(shapes)[0])
  flat_params = dict(jax.tree_util.tree_flatten_with_path(params)[0])
  if set(flat_shapes) != set(flat_params):
    missing = sorted(jax.tree_util.keystr(k) for k in set(flat_shapes) ^ set(flat_params))
    raise CheckpointError(f"{weights}: the tensors do not make our model's parameters ({', '.join(missing[:3])})")
  for path, want in flat_shapes.items():
    if flat_params[path].shape != want.shape:
      raise CheckpointError(
        f"{weights}: {jax.tree_util.keystr(path)} comes out {flat_params[path].shape}, our model needs {want.shape}"
      )
  return cfg, jax.tree.map(lambda x, want: jnp.asarray(x, want.dtype), params, shapes)


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
  """export_config(cfg), after refusing (naming each field) what Marian's format cannot hold: the
  config it writes must read back as this model."""
  if getattr(tokenizer, "name", None) != "marian":
    raise ConfigError(
      f"the model reads {tokenizer} tokens; MarianTokenizer reads SentencePiece pairs (source.spm, target.spm, "
      f"vocab.json): export a run fine-tuned from a Marian model, or trained on data prepared with "
      f"--config.data.tokenizer=<a Marian model's directory>"
    )
  block = cfg.block
  if block.activation not in _ACTIVATIONS.values():
    raise ConfigError(f"Marian's format cannot hold block.activation={block.activation!r} ({', '.join(_ACTIVATIONS)})")
  hf = export_config(cfg, tokenizer)
  other = differences(cfg, marian_config(hf, "the export"))
  if other:
    raise ConfigError(f"Marian's format cannot hold this model: {'; '.join(other)}")
  return hf


def export_hf_marian(cfg: Seq2SeqConfig, params: dict, tokenizer, out_dir: str | Path) -> Path:
  """Writes `config.json`, `generation_config.json`, `model.safetensors` (the tensors transformers'
  `save_pretrained` writes: the shared embedding once, the layers, `final_logits_bias`) and the
  tokenizer pair (`source.spm`, `target.spm`, `vocab.json`, `tokenizer_config.json`) to `out_dir`.
  A model Marian's format cannot hold (pre-LN blocks, interleaved sinusoids, no logits bias, ...)
  is refused, each such field named."""
  hf = _export_checked(cfg, tokenizer)
  params = jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float32), nn.unbox(params))
  D = cfg.block.d_model
  tensors = {"model.shared.weight": params["source_embed"]["table"]["embedding"]}
  tensors["final_logits_bias"] = params["final_logits_bias"].reshape(1, -1)
  if not cfg.tie_output:
    tensors["lm_head.weight"] = params["head"]["kernel"].T

  def attention(key: str, ours: dict) -> None:
    parts = {"q": ours["q"], **_unfused(ours["kv"], "kv")} if "kv" in ours else _unfused(ours["qkv"], "qkv")
    for name, p in parts.items():
      tensors[f"{key}.{name}_proj.weight"] = p["kernel"].reshape(D, D).T
      tensors[f"{key}.{name}_proj.bias"] = p["bias"].reshape(D)
    tensors[f"{key}.out_proj.weight"] = ours["out"]["kernel"].reshape(D, D).T
    tensors[f"{key}.out_proj.bias"] = ours["out"]["bias"]

  def norm(key: str, ours: dict) -> None:
    tensors[f"{key}.weight"], tensors[f"{key}.bias"] = ours["scale"], ours["bias"]

  for side, count in (("encoder", cfg.num_layers), ("decoder", cfg.decoder_layers())):
    stack = params[side]
    stack = layers.unstack_layers(stack, count) if cfg.scan_layers else stack
    for i in range(count):
      key, block = f"model.{side}.layers.{i}", stack[f"layer_{i}"]
      attention(f"{key}.self_attn", block["attn"])
      norm(f"{key}.self_attn_layer_norm", block["ln_1"])
      if side == "decoder":
        attention(f"{key}.encoder_attn", block["cross_attn"])
        norm(f"{key}.encoder_attn_layer_norm", block["ln_cross"])
      for fc, ours in (("fc1", "fc"), ("fc2", "proj")):
        tensors[f"{key}.{fc}.weight"] = block["mlp"][ours]["kernel"].T
        tensors[f"{key}.{fc}.bias"] = block["mlp"][ours]["bias"]
      norm(f"{key}.final_layer_norm", block["ln_2"])
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  save_safetensors(tensors, out_dir / "model.safetensors")
  (out_dir / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
  generation = {k: hf[k] for k in ("decoder_start_token_id", "eos_token_id", "forced_eos_token_id", "pad_token_id")}
  generation["bad_words_ids"] = [[tokenizer.pad_id]]  # the decoder's start, never generated
  (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
  tokenizer.write_files(out_dir)
  tokenizer_config = {"tokenizer_class": "MarianTokenizer", "model_max_length": 512, "separate_vocabs": False}
  tokenizer_config |= {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
  (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
  return out_dir


def _unfused(fused: dict, names: str) -> dict:
  """A fused projection ({kernel [D, n, H, K], bias [n, H, K]}) as one per name."""
  return {n: {"kernel": fused["kernel"][:, i], "bias": fused["bias"][i]} for i, n in enumerate(names)}
