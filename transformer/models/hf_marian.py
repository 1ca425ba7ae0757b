"""Hugging Face Marian (`MarianMTModel`, the OPUS-MT models) safetensors -> encoder-decoder params.

Marian is the encoder-decoder of "Attention Is All You Need" with a few choices of its own, each a
Seq2SeqConfig value here: post-LN blocks, one embedding for source, target and the tied head,
embeddings scaled by sqrt(d_model) (`scale_embedding`), sinusoids laid out in halves
(`sinusoids="halves"`), the `swish` activation, a `final_logits_bias`. Its linear layers are torch's
`[out, in]`: transposed here, then split into heads. Every key and shape is checked and the offending
one named; what the format holds that our model cannot express is refused in one line naming it.

    >>> config, params = import_hf_marian("path/to/opus-mt-de-en")   # its config.json, model.safetensors
    >>> logits = Transformer(config).apply({"params": params}, source_BxS, target_in_BxT)
"""

from __future__ import annotations

import json
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from transformer import layers
from transformer.errors import CheckpointError
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
    dropout_rate=0.0,
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
  config_file, weights = directory / "config.json", directory / "model.safetensors"
  for needed in (config_file, weights):
    if not needed.is_file():
      raise CheckpointError(f"{directory} has no {needed.name}: give a Marian model's directory (MarianMTModel)")
  cfg = marian_config(json.loads(config_file.read_text()), str(config_file))
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
