"""Activations as training data: what a sparse autoencoder (transformer.models.sae) learns from.

Three sources with one interface: `chunk(i)`, the i-th refill of training rows (a pure function of
i), and `eval_rows()`, the fixed rows every evaluation scores; `d_in`, their width.

  ModelActivations      a trained GPT's activations at a named point and layer, computed on the fly
                        (transformer.interp.activations: it runs the model, so it stands with the
                        instrument, above this package)
  ArrayActivations      an .npy or .safetensors array a user brings (rows x d_in, from any model); a
                        chunk is an epoch of its training rows in a new order; the last
                        `validation_fraction` of the rows are held out for evaluation
  SyntheticActivations  rows in superposition whose features are known (transformer.data.superposition)

`ActivationStore(source, batch_size, seed)` serves training batches from chunk after chunk. Its
position ({"chunk", "served"}) is saved with each checkpoint; restoring it recomputes that chunk, so a
resumed run sees exactly the rows a straight one would.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import safetensors.numpy

from transformer.data.superposition import Superposition
from transformer.errors import DataError, InputWarning


def read_array(path: str | Path) -> np.ndarray:
  """Rows x d_in float32 activations from an .npy or a .safetensors file (one tensor, or the one
  named "activations"; leading axes are flattened into rows). Empty, not finite or unreadable arrays
  are one clear error."""
  path = Path(path)
  if not path.is_file():
    raise DataError(f"{path} does not exist; give an .npy or .safetensors file of activations (rows x d_in)")
  try:
    if path.suffix == ".npy":
      array = np.load(path, mmap_mode="r")
    elif path.suffix == ".safetensors":
      tensors = safetensors.numpy.load_file(str(path))
      if len(tensors) != 1 and "activations" not in tensors:
        raise DataError(
          f"{path} holds tensors {', '.join(sorted(tensors))}; name the activations 'activations' or keep one"
        )
      array = tensors.get("activations", next(iter(tensors.values())))
    else:
      raise DataError(f"{path}: activations are read from .npy or .safetensors files, not {path.suffix or 'this'}")
  except (ValueError, OSError) as e:
    raise DataError(f"{path} is not a readable array ({e}); write it with numpy.save or safetensors") from None
  if array.ndim < 2 or array.size == 0:
    raise DataError(f"{path} holds an array of shape {array.shape}; activations are rows x d_in, with rows")
  if array.ndim > 2:  # (sequences x tokens x d_in, as a model's activations come) read as rows, said so
    warnings.warn(
      InputWarning(
        f"{path} holds an array of shape {tuple(array.shape)}: its leading axes are read as "
        f"{int(np.prod(array.shape[:-1]))} rows of {array.shape[-1]} (save it as rows x d_in to say so)"
      ),
      stacklevel=2,
    )
  rows = np.asarray(array, np.float32).reshape(-1, array.shape[-1])
  finite = np.isfinite(rows).all(axis=1)
  if not finite.all():
    raise DataError(f"{path}: row {int(np.argmin(finite))} is not finite (NaN or inf); clean the activations first")
  return rows


class ArrayActivations:
  """Rows a user brings (`read_array`): the first 1 - `validation_fraction` train, the rest evaluate."""

  def __init__(self, rows_NxD: np.ndarray, *, validation_fraction: float, eval_rows: int, seed: int):
    held_out = max(1, int(len(rows_NxD) * validation_fraction))
    if len(rows_NxD) - held_out < 1:
      raise DataError(f"{len(rows_NxD)} rows leave none to train on; bring more rows")
    self.train, self.held_out = rows_NxD[:-held_out], rows_NxD[-held_out:][:eval_rows]
    self.d_in, self.seed = rows_NxD.shape[1], seed

  def chunk(self, index: int) -> np.ndarray:
    return self.train[np.random.default_rng([self.seed, index]).permutation(len(self.train))]

  def eval_rows(self) -> np.ndarray:
    return self.held_out


class SyntheticActivations:
  """`Superposition`'s rows: a chunk is one batch; the evaluation rows are a batch no chunk draws."""

  def __init__(self, source: Superposition, *, batch_size: int, eval_rows: int):
    self.source, self.batch_size, self.num_eval = source, batch_size, eval_rows
    self.d_in = source.d

  def chunk(self, index: int) -> np.ndarray:
    return self.source.batch(index, self.batch_size)

  def eval_rows(self) -> np.ndarray:
    return self.source.batch(-1, self.num_eval)


class ActivationStore:
  """Training batches (batch_size x d_in) from a source's chunks, in order; resumable from its state."""

  def __init__(self, source, batch_size: int):
    self.source, self.batch_size = source, batch_size
    self.index, self.served, self.rows = 0, 0, None

  def __iter__(self):
    return self

  def _load(self, index: int) -> None:
    self.index, self.rows = index, self.source.chunk(index)
    if len(self.rows) < self.batch_size:
      raise DataError(
        f"a refill of the activation store holds {len(self.rows)} rows, fewer than batch_size={self.batch_size}; "
        f"lower batch_size or raise buffer_sequences (or bring more rows)"
      )

  def __next__(self) -> np.ndarray:
    if self.rows is None:
      self._load(self.index)
    if (self.served + 1) * self.batch_size > len(self.rows):
      self._load(self.index + 1)
      self.served = 0
    batch = self.rows[self.served * self.batch_size : (self.served + 1) * self.batch_size]
    self.served += 1
    return batch

  def get_state(self) -> dict:
    return {"chunk": self.index, "served": self.served}

  def set_state(self, state: dict) -> None:
    self.index, self.served, self.rows = int(state["chunk"]), int(state["served"]), None
