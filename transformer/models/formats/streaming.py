"""The one importer and exporter every weight format goes through (GPT-2, Marian, the open families): a
checkpoint's safetensors read one file (shard) at a time and one tensor at a time in its stored dtype, each
param converted by its layout entry and placed on its devices as soon as its tensors are read; an export
written from the same layout, refused first where the format cannot hold the model."""

from __future__ import annotations

import json
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

from transformer import layers
from transformer.errors import CheckpointError, ConfigError
from transformer.models import hf_files
from transformer.models.formats.base import Format


def read_params(files: list[Path], fmt: Format, stored, config, shardings=None) -> dict:
  """The params of `config` from a checkpoint's safetensors `files` whose config.json reads as `stored`
  (the two differ only in fields that keep the tensors' shapes, and a shorter learned position table):
  every tensor of `fmt.layout(stored)` in its shape, no other but the format's checked copies. `shardings`
  (a tree like the params') places each param as it is read. Unrolled layers; `stacked` scans them."""
  if getattr(config, "positions", None) == "learned" and config.max_len > stored.max_len:
    raise CheckpointError(
      f"max_len={config.max_len} is longer than the position table of {files[0]} ({stored.max_len} rows); "
      f"use max_len <= {stored.max_len}"
    )
  wanted = {key: (entry, shape) for entry in fmt.layout(stored) for key, shape in zip(entry.keys, entry.shapes)}
  abstract = nn.unbox(fmt.param_shapes(config.replace(scan_layers=False)))
  place = (lambda ours, x: jax.device_put(x, hf_files.get_path(shardings, ours))) if shardings else _on_device
  params, pieces, copies = {}, {}, {}
  copy_keys = set(fmt.copies(stored))
  for file in files:
    for key, value in _tensors(file, fmt, stored):
      if key in copy_keys:
        copies[key] = value
        continue
      entry, shape = _checked(key, value, wanted, file, stored, fmt.name)
      pieces[key] = value
      if all(k in pieces for k in entry.keys):  # every piece of this param read: convert and place it
        target = hf_files.get_path(abstract, entry.ours)
        value = entry.to_ours([pieces.pop(k) for k in entry.keys])[tuple(slice(n) for n in target.shape)]
        # contiguous, in the param's dtype (a strided array costs a device program); a longer position
        # table than max_len keeps its first rows (the slice above), which are all a shorter context reads
        hf_files.set_path(params, entry.ours, place(entry.ours, np.ascontiguousarray(value, target.dtype)))
  missing = [key for key in wanted if hf_files.get_path(params, wanted[key][0].ours, None) is None]
  if missing:
    key = missing[0]
    raise CheckpointError(f"{files[0].parent} is missing tensor {key!r} (expected shape {wanted[key][1]})")
  fmt.check_copies(copies, params, stored, str(files[0]))
  return params


def read(fmt: Format, files: list[Path], stored, shardings=None, overrides: dict | None = None) -> tuple:
  """(config, params) of the checkpoint `files` whose config.json reads as `stored`, with `overrides` of the
  fields that keep the shapes (scan_layers: the layers read, then stacked)."""
  overrides = dict(overrides or {})
  scan = overrides.pop("scan_layers", False)
  config = stored.replace(**overrides).check()
  params = read_params(files, fmt, stored, config, None if scan else shardings)
  if scan:
    config = config.replace(scan_layers=True).check()
    params = stacked(fmt, config, params, shardings)
  return config, params


def stacked(fmt: Format, config, params: dict, shardings=None) -> dict:
  """Unrolled layers' params (`layer_<i>`) as the scanned stacks of `config` (placed on `shardings`)."""
  params = {**params, **{name: layers.stack_layers(params[name], n) for name, n in fmt.stacks(config).items()}}
  return jax.device_put(params, shardings) if shardings else params


def _on_device(ours, x):
  return jax.device_put(x)  # (jnp.asarray of a NumPy array compiles a program for each shape)


def _checked(key: str, value, wanted: dict, file: Path, config, name: str):
  """(the mapping entry, its shape) of tensor `key` of `file`, or the error naming what is wrong."""
  if key not in wanted:
    raise CheckpointError(f"{file} has a tensor a {name} of this config.json does not: {key!r}")
  entry, shape = wanted[key]
  if value.shape != shape:
    raise CheckpointError(
      f"tensor {key!r} in {file} has shape {value.shape}, expected {shape} for the config.json beside it "
      f"({config.num_layers} layers, d_model={config.block.d_model}, {config.block.num_heads} heads, "
      f"vocab={config.vocab_size})"
    )
  return entry, shape


def _tensors(file: Path, fmt: Format, config):
  """(the layout's key, array) of one safetensors file, less the buffers and a tied model's copy of its
  embedding (never read)."""
  tied = getattr(config, "tie_embeddings", False)
  skip = lambda key: (fmt.ignored is not None and fmt.ignored.search(key)) or (tied and key in fmt.tied_copies)
  for key, value in hf_files.read_tensors(file, lambda stored: skip(stored.removeprefix(fmt.prefix))):
    yield key.removeprefix(fmt.prefix), value


def write(fmt: Format, config, params: dict, out_dir: str | Path, hf: dict) -> Path:
  """Writes config.json (`hf`, what `fmt.config_to_hf` gave) and model.safetensors of `config`'s `params`
  to `out_dir`, after refusing, each field named, what the format cannot hold: what is written must read
  back as this model. Nothing is written when refused."""
  other = fmt.cannot_hold(config, hf)
  if other:
    raise ConfigError(f"the Hugging Face {fmt.name} format cannot hold this model: {'; '.join(other)}")
  params = nn.unbox(params)
  if config.scan_layers:
    params = {**params, **{name: layers.unstack_layers(params[name], n) for name, n in fmt.stacks(config).items()}}
  tensors = {}
  for entry in fmt.layout(config.replace(scan_layers=False)):
    value = fmt.exported(params, entry, config)
    for key, array in zip(entry.keys, entry.to_hf(value)):
      tensors[fmt.stored_key(key)] = np.ascontiguousarray(array)
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  hf_files.save_safetensors(tensors, out_dir / "model.safetensors")
  (out_dir / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
  return out_dir
