"""What the Hugging Face weight formats (transformer.models.formats) share: reading a directory's
config.json and its safetensors (one file, or shards by their index, a tensor at a time), writing
model.safetensors, and the comparison of our model config with the one a format's files describe (what an
export refuses, what a fine-tuning run checks), field by field."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from transformer.errors import CheckpointError


def read_config(directory: str | Path) -> dict:
  path = Path(directory) / "config.json"
  if not path.is_file():
    raise CheckpointError(
      f"no config.json in {directory}: a Hugging Face model directory has one (save_pretrained writes it) "
      f"beside its safetensors"
    )
  try:
    return json.loads(path.read_text())
  except ValueError as e:
    raise CheckpointError(f"{path} is not JSON ({e})") from None


def shard_files(directory: Path) -> list[Path]:
  """The safetensors files of a checkpoint: those its index names (model.safetensors.index.json),
  else model.safetensors."""
  index = directory / "model.safetensors.index.json"
  if index.exists():
    try:
      weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
      raise CheckpointError(
        f"{index} is not a safetensors index ({e}); it maps each tensor to its shard file"
      ) from None
    files = [directory / name for name in dict.fromkeys(weight_map.values())]
  else:
    files = [directory / "model.safetensors"]
  missing = [str(f) for f in files if not f.is_file()]
  if missing:
    raise CheckpointError(f"{directory} is missing its weights: no {', '.join(missing)}{torch_only(directory)}")
  return files


def torch_only(directory: Path) -> str:
  """What to do with a directory of PyTorch's pickled weights alone (pytorch_model.bin), said after the
  missing safetensors; "" when it has none."""
  pickled = sorted(p.name for p in Path(directory).glob("pytorch_model*.bin"))
  if not pickled:
    return ""
  return (
    f"; it holds PyTorch's pickled weights ({', '.join(pickled[:3])}), which we do not read: download the "
    "repository's *.safetensors, or convert them with transformers (from_pretrained, then "
    "save_pretrained(..., safe_serialization=True))"
  )


def read_tensors(file: Path, skip: Callable[[str], bool] = lambda key: False) -> Iterator[tuple[str, np.ndarray]]:
  """(key, array) of one safetensors file in its stored dtype, but the keys `skip` names. The file is
  mapped anew for each tensor: a mapping holds every page it has read until it is closed, so that one
  left open for a whole file would keep the file's bytes beside the params made of them."""
  try:
    with safe_open(file, framework="numpy") as f:
      keys = list(f.keys())
    for key in keys:
      if skip(key):
        continue
      with safe_open(file, framework="numpy") as f:
        tensor = f.get_tensor(key)
      yield key, tensor
  except SafetensorError as e:
    raise CheckpointError(f"{file} is not a safetensors file ({e}); give a Hugging Face model's directory") from None


def read_rows(file: Path, key: str, rows_k) -> np.ndarray:
  """Rows `rows_k` (in that order) of one tensor of a safetensors file, in its stored dtype, reading only them:
  a slice a run of consecutive rows, so that a few rows of a large matrix cost a few pages, not the file."""
  rows_k = np.asarray(rows_k, np.int64).reshape(-1)
  order = np.argsort(rows_k, kind="stable")
  wanted = rows_k[order]
  starts = np.flatnonzero(np.diff(wanted, prepend=-2) != 1)  # where a run of consecutive rows begins
  ends = np.append(starts[1:], len(wanted))
  try:
    with safe_open(file, framework="numpy") as f:
      tensor = f.get_slice(key)
      shape = tuple(tensor.get_shape())
      runs = [tensor[int(wanted[a]) : int(wanted[b - 1]) + 1] for a, b in zip(starts, ends)] or [tensor[0:0]]
  except SafetensorError as e:
    raise CheckpointError(f"{file} is not a safetensors file ({e})") from None
  out = np.empty((len(rows_k), *shape[1:]), runs[0].dtype)
  out[order] = np.concatenate(runs)
  return out


def header_shapes(file: Path) -> dict[str, tuple[int, ...]]:
  """Each tensor's shape in a safetensors file (its header: nothing read but the header)."""
  try:
    with safe_open(file, framework="numpy") as f:
      return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
  except SafetensorError as e:
    raise CheckpointError(f"{file} is not a safetensors file ({e})") from None


def itemsize(file: Path, key: str) -> int:
  """The bytes of one value of a tensor as a safetensors file stores it (its header)."""
  with safe_open(file, framework="numpy") as f:
    return f.get_slice(key)[0:0].dtype.itemsize  # (no rows read: safetensors' own dtype, as NumPy has it)


def numel(file: Path) -> int:
  """The number of values in a safetensors file (its header's shapes)."""
  return sum(int(np.prod(shape)) for shape in header_shapes(file).values())


def save_safetensors(tensors: dict[str, np.ndarray], path: Path) -> None:
  """Writes `tensors` as the safetensors file transformers' `save_pretrained` writes (PyTorch's
  format tag), readable as any file the process writes: safetensors creates its file 0600, which
  would leave an exported model unreadable to the other users of a shared directory."""
  save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path, metadata={"format": "pt"})
  umask = os.umask(0)
  os.umask(umask)
  path.chmod(0o666 & ~umask)


# What may differ from the config a format's files describe without changing the function the model
# computes (or changes it only in training): dropout, precision, the attention's implementation,
# initialisation, the fast forms, scanning and rematerialisation.
FREE = frozenset({"dropout_rate", "attention_dropout_rate", "dtype", "param_dtype", "attention", "kernel_init"})
FREE |= {"kernels", "scan_layers", "remat_policy", "source_word_dropout"}


def differences(ours, theirs, name: str, free: frozenset[str] = FREE) -> list[str]:
  """ "field=ours (`name`'s: theirs)" for every field of the model config `ours` (nested: block.*)
  that makes another model than the config `theirs` read from a format's files; `free` fields may
  differ."""
  return [
    f"{field}={mine!r} ({name}'s: {other!r})"
    for field, mine, other in _fields(ours, theirs)
    if mine != other and field.split(".")[-1] not in free
  ]


def _fields(a, b, prefix: str = ""):
  for f in dataclasses.fields(a):
    x, y = getattr(a, f.name), getattr(b, f.name)
    if dataclasses.is_dataclass(x):
      yield from _fields(x, y, f"{prefix}{f.name}.")
    else:
      yield f"{prefix}{f.name}", x, y


def get_path(tree, path, default=...):
  """tree[path[0]][path[1]]...; `default` (when given) where the path is not there."""
  for k in path:
    if default is not ... and (not isinstance(tree, dict) or k not in tree):
      return default
    tree = tree[k]
  return tree


def set_path(tree, path, value) -> None:
  """tree[path[0]][path[1]]... = value, making the dicts on the way."""
  for k in path[:-1]:
    tree = tree.setdefault(k, {})
  tree[path[-1]] = value
