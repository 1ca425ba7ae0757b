"""Hugging Face GPT-2 safetensors <-> GPT params (import and export), without torch.

Hugging Face's GPT-2 stores its linear layers as `Conv1D` with weights `[in, out]` (the same
orientation as a Flax kernel) and fuses Q, K, V into one `c_attn` of width 3·D, split into heads
as (3, H, K): exactly our `qkv` kernel (D, 3, H, K), so import is a reshape, never a transpose.
Its files may come without config.json (the shapes then say all but the heads). Read and written by the one
streaming importer and exporter (formats/streaming.py); no torch is needed.

    >>> config, params = import_hf_gpt2("path/to/gpt2")            # dir with model.safetensors
    >>> logits = GPT(config).apply({"params": params}, tokens)
    >>> export_hf_gpt2(config, params, "out/")   # GPT2LMHeadModel.from_pretrained("out/") loads it
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np

from transformer import layers
from transformer.errors import CheckpointError
from transformer.models import hf_files
from transformer.models.formats import streaming
from transformer.models.formats.base import Format, Tensor, as_is, linear, reshaped
from transformer.models.gpt import GPTConfig

# d_model -> heads of the four OpenAI GPT-2 sizes: heads cannot be read off any tensor shape.
_GPT2_HEADS = {768: 12, 1024: 16, 1280: 20, 1600: 25}
# Buffers some GPT-2 files carry (the causal mask), not parameters.
_IGNORED = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")


class GPT2Format(Format):
  """GPT-2 (GPT2LMHeadModel): its config.json keys, and the layout `_hf_layout` gives as `Tensor` entries."""

  model_type = "gpt2"
  architecture = "GPT2LMHeadModel"
  handled = frozenset(
    {"vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head", "n_inner", "layer_norm_epsilon"}
    | {"tie_word_embeddings", "dtype", "torch_dtype", "resid_pdrop", "embd_pdrop", "attn_pdrop", "task_specific_params"}
    # the sequence-classification head's, which the language model does not have
    | {"summary_activation", "summary_first_dropout", "summary_proj_to_labels", "summary_type", "summary_use_proj"}
  )
  fixed = {
    "activation_function": "gelu_new",
    "add_cross_attention": False,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
  }

  def config_from_hf(self, hf: dict, where: str) -> GPTConfig:
    """The GPTConfig of a GPT-2 config.json alone (the importer reads its tensors' shapes as well)."""
    self.check_keys(hf, where)
    D, L, V = hf["n_embd"], hf["n_layer"], hf["vocab_size"]
    shapes = {"wte.weight": (V, D), "wpe.weight": (hf["n_positions"], D)}
    shapes |= {f"h.{i}.mlp.c_fc.weight": (D, hf.get("n_inner") or 4 * D) for i in range(L)}
    return _gpt2_config(
      shapes if hf.get("tie_word_embeddings", True) else shapes | {"lm_head.weight": (V, D)}, hf, where
    )

  ignored = _IGNORED
  tied_copies = ("lm_head.weight",)
  prefix = "transformer."  # GPT2LMHeadModel's keys; the Hub's gpt2 files have none

  @property
  def name(self) -> str:
    return "GPT-2"

  def config_to_hf(self, config: GPTConfig, tokenizer=None) -> dict:
    return _export_config(config)

  def cannot_hold(self, config: GPTConfig, hf: dict) -> list[str]:
    # The MLP's width as a number on both sides (d_mlp 0 means 4 * d_model); biases of zeros where the
    # model has none compute the same function (GPT-2 always has them).
    ours = layers.replace_model(config, {"d_mlp": config.block.mlp_width})
    theirs = self.config_from_hf(hf, "the export")
    return hf_files.differences(ours, theirs, self.name, hf_files.FREE | {"use_bias"})

  def exported(self, params: dict, entry: Tensor, config: GPTConfig) -> np.ndarray:
    if entry.ours[-1] == "bias" and not config.block.use_bias:
      return entry.to_ours([np.zeros(entry.shapes[0], np.float32)])  # the same function: GPT-2 always has biases
    return np.asarray(jax.device_get(hf_files.get_path(params, entry.ours)), np.float32)

  def stored_key(self, key: str) -> str:
    return key if key.startswith("lm_head") else self.prefix + key  # as GPT2LMHeadModel.save_pretrained writes

  def layout(self, cfg: GPTConfig) -> Iterator[Tensor]:
    for key, ours, hf_shape in _hf_layout(cfg):
      if _is_lm_head(ours):  # a torch Linear, [out, in]
        yield linear(ours, key, hf_shape, hf_shape[::-1])
      elif ours[-2:] == ("qkv", "kernel") or ours[-2:] == ("qkv", "bias"):  # (D, 3D) as (D, 3, H, K)
        H = cfg.block.num_heads
        yield reshaped(ours, key, hf_shape, (*hf_shape[:-1], 3, H, hf_shape[-1] // (3 * H)))
      elif ours[-2:] == ("out", "kernel"):  # (D, D) as (H, K, D)
        H = cfg.block.num_heads
        yield reshaped(ours, key, hf_shape, (H, hf_shape[0] // H, hf_shape[1]))
      else:
        yield as_is(ours, key, hf_shape)


FORMAT = GPT2Format()


def _hf_layout(cfg: GPTConfig):
  """(HF key, our param path, HF shape) for every tensor of a GPT-2 with config `cfg`."""
  D, L, V = cfg.block.d_model, cfg.max_len, cfg.vocab_size
  F = cfg.block.mlp_width
  yield "wte.weight", ("wte", "embedding"), (V, D)
  yield "wpe.weight", ("wpe",), (L, D)
  for i in range(cfg.num_layers):
    p, h = ("h", f"layer_{i}"), f"h.{i}"
    for ln in ("ln_1", "ln_2"):
      yield f"{h}.{ln}.weight", (*p, ln, "scale"), (D,)
      yield f"{h}.{ln}.bias", (*p, ln, "bias"), (D,)
    yield f"{h}.attn.c_attn.weight", (*p, "attn", "qkv", "kernel"), (D, 3 * D)
    yield f"{h}.attn.c_attn.bias", (*p, "attn", "qkv", "bias"), (3 * D,)
    yield f"{h}.attn.c_proj.weight", (*p, "attn", "out", "kernel"), (D, D)
    yield f"{h}.attn.c_proj.bias", (*p, "attn", "out", "bias"), (D,)
    yield f"{h}.mlp.c_fc.weight", (*p, "mlp", "fc", "kernel"), (D, F)
    yield f"{h}.mlp.c_fc.bias", (*p, "mlp", "fc", "bias"), (F,)
    yield f"{h}.mlp.c_proj.weight", (*p, "mlp", "proj", "kernel"), (F, D)
    yield f"{h}.mlp.c_proj.bias", (*p, "mlp", "proj", "bias"), (D,)
  yield "ln_f.weight", ("ln_f", "scale"), (D,)
  yield "ln_f.bias", ("ln_f", "bias"), (D,)
  if not cfg.tie_embeddings:
    yield "lm_head.weight", ("lm_head", "kernel"), (V, D)  # torch Linear: [out, in]


def _is_lm_head(path) -> bool:
  return path == ("lm_head", "kernel")


def _gpt2_config(shapes: dict[str, tuple[int, ...]], hf: dict, where: str) -> GPTConfig:
  """The GPTConfig that GPT-2 tensors of these `shapes` (keys without "transformer.") and a config.json
  `hf` describe: what the importer builds, and what an export must read back as."""
  V, D = shapes["wte.weight"]
  heads = hf.get("n_head") or _GPT2_HEADS.get(D)
  if heads is None:
    raise CheckpointError(
      f"cannot tell the number of heads of {where} (d_model={D}): put its config.json "
      f"(with n_head) beside it, or pass num_heads="
    )
  block = layers.BlockConfig(
    d_model=D,
    num_heads=heads,
    d_mlp=shapes["h.0.mlp.c_fc.weight"][1],
    layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-5),
  )
  num_layers = 1 + max(int(m.group(1)) for k in shapes if (m := re.match(r"h\.(\d+)\.", k)))
  tied = "lm_head.weight" not in shapes
  return GPTConfig(
    vocab_size=V, max_len=shapes["wpe.weight"][0], num_layers=num_layers, block=block, tie_embeddings=tied
  )


def config_of_files(path: Path) -> tuple[list[Path], GPTConfig]:
  """(the safetensors files, the GPTConfig) of a GPT-2 directory or its model.safetensors alone: from
  config.json where it is beside them, else from the tensors' shapes (the header alone is read)."""
  path = Path(path)
  file = path / "model.safetensors" if path.is_dir() else path
  directory = file.parent
  if (directory / "config.json").is_file():
    hf = hf_files.read_config(directory)
    files = hf_files.shard_files(directory) if path.is_dir() else [file]
    return files, FORMAT.config_from_hf(hf, str(directory / "config.json"))
  if not file.is_file():
    raise CheckpointError(f"no GPT-2 safetensors at {path} (looked for {file}){hf_files.torch_only(directory)}")
  shapes = {k.removeprefix(FORMAT.prefix): v for k, v in hf_files.header_shapes(file).items()}
  for key in ("wte.weight", "wpe.weight", "h.0.mlp.c_fc.weight"):
    if key not in shapes:
      raise CheckpointError(f"{file} has no tensor {key!r}: not a GPT-2 checkpoint")
  return [file], _gpt2_config(shapes, {}, str(file))


def import_hf_gpt2(path: str | Path, **overrides) -> tuple[GPTConfig, dict]:
  """Loads a Hugging Face GPT-2 (gpt2 ... gpt2-xl, or any GPT-2 shape): its directory or model.safetensors.

  The config is config.json's (without one, the tensors' shapes, the heads of OpenAI's sizes); `overrides`
  change fields that do not alter shapes (dtype, attention, scan_layers, ...), or shorten `max_len` (the
  position table's first rows kept). Returns (config, params).
  """
  files, stored = config_of_files(Path(path))
  return streaming.read(FORMAT, files, stored, None, overrides)


def _export_config(config: GPTConfig) -> dict:
  """The config.json of GPT2Config for `config`."""
  block = config.block
  return {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "activation_function": "gelu_new",
    "vocab_size": config.vocab_size,
    "n_positions": config.max_len,
    "n_embd": block.d_model,
    "n_layer": config.num_layers,
    "n_head": block.num_heads,
    "n_inner": None if block.mlp_width == 4 * block.d_model else block.mlp_width,
    "layer_norm_epsilon": block.layer_norm_epsilon,
    "tie_word_embeddings": config.tie_embeddings,
    "resid_pdrop": block.dropout_rate,
    "embd_pdrop": block.dropout_rate,
    "attn_pdrop": block.attention_dropout_rate,
    "bos_token_id": config.vocab_size - 1,
    "eos_token_id": config.vocab_size - 1,
    "scale_attn_weights": True,
  }


def export_hf_gpt2(config: GPTConfig, params: dict, out_dir: str | Path) -> Path:
  """Writes `model.safetensors` + `config.json` that `GPT2LMHeadModel.from_pretrained` loads. A model
  GPT-2's format cannot hold is refused, each such field named: what is written must read back (as
  `import_hf_gpt2` reads it) as this model."""
  return streaming.write(FORMAT, config, params, out_dir, _export_config(config))
