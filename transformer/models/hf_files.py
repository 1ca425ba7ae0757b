"""What the Hugging Face weight formats (hf_gpt2, hf_marian) share: writing model.safetensors, and
the comparison of our model config with the one a format's files describe (what an export refuses,
what a fine-tuning run checks), field by field."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


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
