"""Hugging Face GPT-2 safetensors <-> GPT params (import and export), without torch.

Hugging Face's GPT-2 stores its linear layers as `Conv1D` with weights `[in, out]` (the same
orientation as a Flax kernel) and fuses Q, K, V into one `c_attn` of width 3·D, split into heads
as (3, H, K): exactly our `qkv` kernel (D, 3, H, K), so import is a reshape, never a transpose.
Every key and shape is checked and the offending key named. No torch is needed.

    >>> config, params = import_hf_gpt2("path/to/gpt2")            # dir with model.safetensors
    >>> logits = GPT(config).apply({"params": params}, tokens)
    >>> export_hf_gpt2(config, params, "out/")   # GPT2LMHeadModel.from_pretrained("out/") loads it
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from transformer import layers
from transformer.errors import CheckpointError, ConfigError
from transformer.models import hf_files
from transformer.models.formats.base import Format, Tensor, as_is, linear, reshaped
from transformer.models.gpt import GPTConfig, param_shapes
from transformer.models.hf_files import save_safetensors

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

  def config_to_hf(self, config: GPTConfig) -> dict:
    return _export_config(config)

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


def _read_config_json(directory: Path) -> dict:
  path = directory / "config.json"
  return json.loads(path.read_text()) if path.exists() else {}


def _read_tensors(path: Path) -> tuple[Path, dict]:
  """(the safetensors file at `path`, its GPT-2 tensors under their names without `transformer.`); one error
  for a missing or unreadable file or one that is not a GPT-2's."""
  file = path / "model.safetensors" if path.is_dir() else path
  if not file.is_file():
    raise CheckpointError(f"no GPT-2 safetensors at {path} (looked for {file}){hf_files.torch_only(file.parent)}")
  try:
    tensors = load_file(file)
  except SafetensorError as e:  # random bytes, an empty or cut file: its header cannot be read
    raise CheckpointError(
      f"{file} is not a safetensors file ({e}); give a Hugging Face GPT-2 model.safetensors or its directory"
    ) from None
  tensors = {k.removeprefix("transformer."): v for k, v in tensors.items()}
  tensors = {k: v for k, v in tensors.items() if not _IGNORED.match(k)}
  for key in ("wte.weight", "wpe.weight", "h.0.mlp.c_fc.weight"):
    if key not in tensors:
      raise CheckpointError(f"{file} has no tensor {key!r}: not a GPT-2 checkpoint")
  return file, tensors


def _params_of(cfg: GPTConfig, tensors: dict, file: Path) -> dict:
  """Our params from the checkpoint's tensors: every key of the layout there in its shape, and no other."""
  params: dict = {}
  expected = set()
  dtypes = jax.tree.map(lambda x: x.dtype, nn.unbox(param_shapes(cfg)))
  for entry in FORMAT.layout(cfg):
    (key,), (hf_shape,) = entry.keys, entry.shapes
    expected.add(key)
    if key not in tensors:
      raise CheckpointError(f"{file} is missing tensor {key!r} (expected shape {hf_shape})")
    value = tensors[key]
    if value.shape != hf_shape:
      raise CheckpointError(
        f"tensor {key!r} in {file} has shape {value.shape}, expected {hf_shape} "
        f"for a GPT-2 with {cfg.num_layers} layers, d_model={cfg.block.d_model}, vocab={cfg.vocab_size}"
      )
    dtype = hf_files.get_path(dtypes, entry.ours)
    hf_files.set_path(params, entry.ours, jnp.asarray(entry.to_ours([value]), dtype=dtype))
  unexpected = sorted(set(tensors) - expected)
  if unexpected:
    raise CheckpointError(f"{file} has tensors a GPT-2 does not: {', '.join(unexpected[:5])}")
  return params


def import_hf_gpt2(path: str | Path, **overrides) -> tuple[GPTConfig, dict]:
  """Loads a Hugging Face GPT-2 `model.safetensors` (gpt2 ... gpt2-xl, or any GPT-2 shape).

  The config is inferred from the tensor shapes (and `config.json` beside it, for the number of
  heads and the LayerNorm epsilon); `overrides` change fields that do not alter shapes (dtype,
  attention, scan_layers, ...), or shorten `max_len`. Returns (config, params).
  """
  file, tensors = _read_tensors(Path(path))
  hf = _read_config_json(file.parent)
  if hf:
    FORMAT.check_keys(hf, str(file.parent / "config.json"))
  tied = "lm_head.weight" not in tensors or np.array_equal(tensors["lm_head.weight"], tensors["wte.weight"])
  if tied:
    tensors.pop("lm_head.weight", None)
  cfg = _gpt2_config({k: v.shape for k, v in tensors.items()}, hf, str(file))
  table_length = cfg.max_len
  scan = overrides.pop("scan_layers", False)
  cfg = cfg.replace(**overrides)
  if cfg.max_len > table_length:
    raise CheckpointError(
      f"max_len={cfg.max_len} is longer than the position table of "
      f"{file} ({table_length} rows); use max_len <= {table_length}"
    )
  if cfg.max_len < table_length:  # keep the first rows: positions beyond are never used
    tensors["wpe.weight"] = tensors["wpe.weight"][: cfg.max_len]
  cfg.check()

  params = _params_of(cfg, tensors, file)
  if scan:
    cfg = cfg.replace(scan_layers=True)
    params["h"] = layers.stack_layers(params["h"], cfg.num_layers)
  return cfg, params


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
  block = config.block
  hf_config = _export_config(config)
  shapes = {key: shape for key, _, shape in _hf_layout(config)}
  theirs = _gpt2_config(shapes, hf_config, "the export")
  # The MLP's width as a number on both sides (d_mlp 0 means 4 * d_model); biases of zeros where the
  # model has none compute the same function (GPT-2 always has them).
  ours = layers.replace_model(config, {"d_mlp": block.mlp_width})
  other = hf_files.differences(ours, theirs, "GPT-2", hf_files.FREE | {"use_bias"})
  if other:
    raise ConfigError(f"the Hugging Face GPT-2 format cannot hold this model: {'; '.join(other)}")
  params = hf_files.unrolled(config, params)
  tensors = {}
  for entry in FORMAT.layout(config):
    (key,), (hf_shape,) = entry.keys, entry.shapes
    if entry.ours[-1] == "bias" and not block.use_bias:
      value = np.zeros(hf_shape, np.float32)  # the same function: GPT-2 always has biases
    else:
      (value,) = entry.to_hf(np.asarray(jax.device_get(hf_files.get_path(params, entry.ours)), dtype=np.float32))
    tensors[f"transformer.{key}" if not key.startswith("lm_head") else key] = np.ascontiguousarray(value)
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  save_safetensors(tensors, out_dir / "model.safetensors")
  (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
  return out_dir
