"""What the Hugging Face weight formats (hf_gpt2, hf_marian) share: writing model.safetensors."""

from __future__ import annotations

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
