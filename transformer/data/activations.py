"""Activations as training data: what a sparse autoencoder (transformer.models.sae) learns from.

Three sources with one interface: `chunk(i)`, the i-th refill of training rows (a pure function of
i), and `eval_rows()`, the fixed rows every evaluation scores; `d_in`, their width.

  ModelActivations      a trained GPT's activations at a named point and layer, computed on the fly
                        from its text through `run_with_cache` (jit-compiled, only that point kept): a
                        chunk is `buffer_sequences` random windows, every (window, position) a row,
                        shuffled, so that a batch mixes many contexts (SAELens's activation store
                        mixes its buffer for the same reason)
  ArrayActivations      an .npy or .safetensors array a user brings (rows x d_in, from any model); a
                        chunk is an epoch of its training rows in a new order; the last
                        `validation_fraction` of the rows are held out for evaluation
  SyntheticActivations  rows in superposition whose features are known (transformer.data.superposition)

`ActivationStore(source, batch_size, seed)` serves training batches from chunk after chunk. Its
position ({"chunk", "served"}) is saved with each checkpoint; restoring it recomputes that chunk, so a
resumed run sees exactly the rows a straight one would.
"""

from __future__ import annotations

import functools
import math
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

from transformer.data import pipeline
from transformer.data.prepare import Prepared
from transformer.data.superposition import Superposition
from transformer.errors import ConfigError, DataError, InputWarning
from transformer.interp import interventions


def point_shapes(model, params) -> dict[str, tuple[int, ...]]:
  """{name: shape} of every named point of a run of `model` on a 3 x 5 batch of tokens (traced, not
  run): a block's points have a leading layer axis."""
  tokens = jax.ShapeDtypeStruct((3, 5), jnp.int32)
  shapes = jax.eval_shape(lambda p, t: dict(interventions.run_with_cache(model, p, t)[1]), params, tokens)
  return {name: s.shape for name, s in shapes.items()}


def locate(model, params, point: str, layer: int) -> tuple[int, int | None]:
  """(the width of one token's activation at `point` of block `layer`, a head axis flattened: `z` is
  H x K; the layer, None for a point outside the blocks); one clear error for a point the model does
  not have, a layer beyond it, or a point that is not a vector per token (an attention pattern)."""
  shapes = point_shapes(model, params)
  if point not in shapes:
    raise ConfigError(
      f"--config.point={point!r} is not a named point of this model; choose one of {', '.join(sorted(shapes))}"
    )
  shape, in_block = shapes[point], shapes[point][1:3] == (3, 5)
  if in_block:  # a block's point: L x B x T x ...
    if not 0 <= layer < shape[0]:
      raise ConfigError(f"--config.layer={layer} is beyond the model's {shape[0]} layers; choose 0 to {shape[0] - 1}")
    shape = shape[1:]
  if shape[:2] != (3, 5):
    raise ConfigError(
      f"--config.point={point!r} is not a vector per token (its shape is B x {' x '.join(map(str, shape[1:]))}); "
      f"choose a point shaped B x T x ..., e.g. resid_pre, resid_post, mlp_out, z"
    )
  return math.prod(shape[2:]), layer if in_block else None


def middle_layer(model, layer: int) -> int:
  """The block a config's `layer` names: -1 is the middle one."""
  return model.config.num_layers // 2 if layer < 0 else layer


class ModelActivations:
  """A trained GPT's activations at (`point`, `layer`) on windows of `seq_len` tokens of its text; with a
  `target_point`, a transcoder's rows: each token's activation at the point and at the target (the point
  it writes, of the same block) side by side, d_in + d_out wide, shuffled together."""

  def __init__(
    self,
    model,
    params,
    text: Prepared,
    *,
    point: str,
    layer: int,
    seq_len: int,
    buffer_sequences: int,
    batch_sequences: int,
    eval_sequences: int,
    seed: int,
    target_point: str = "",
    all_layers: bool = False,
  ):
    self.model, self.params, self.text, self.point, self.layer = model, params, text, point, layer
    # all_layers: a cross-layer transcoder's rows, every layer's point (then every layer's target) side by side
    self.layers = model.config.num_layers if all_layers else 0
    # point_layer: the patch key's layer (run_with_patches), None for a point outside the blocks.
    self.d_in, self.point_layer = locate(model, params, point, layer)
    self.target_point = target_point
    self.d_out = locate(model, params, target_point, layer)[0] if target_point else 0
    self.seq_len, self.batch_sequences = seq_len, batch_sequences
    self.buffer_batches = max(1, buffer_sequences // batch_sequences)
    self.windows = pipeline.lm_train_dataset(text, seq_len=seq_len, global_batch=batch_sequences, seed=seed)
    self.eval_windows_BxL1 = pipeline.lm_eval_batches(text, seq_len=seq_len, batch_size=eval_sequences, num_batches=1)[
      0
    ]
    self.seed = seed

  def at_point(self, tokens_BxT, *points: str) -> jax.Array | tuple:
    """B x T x ...: the activation at the point (of its block) on these tokens; given `points` (of the
    same block), the activation at each, from one run."""
    names = points or (self.point,)
    _, cache = interventions.run_with_cache(self.model, self.params, jnp.asarray(tokens_BxT), names=names)
    at = lambda n: cache[n] if self.point_layer is None or self.layers else cache[n][self.point_layer]
    found = tuple(map(at, names))  # all_layers: L x B x T x ...
    return found if points else found[0]

  def rows(self, tokens_BxT) -> np.ndarray:
    """(B * T) x d_in: each token's activation at the point; a transcoder's (B * T) x (d_in + d_out)."""
    if not self.target_point:
      return np.asarray(self.at_point(tokens_BxT), np.float32).reshape(-1, self.d_in)
    x, y = self.at_point(tokens_BxT, self.point, self.target_point)
    flat = lambda a, d: np.asarray(a, np.float32).reshape(-1, d)
    if self.layers:  # L x B x T x D -> (B * T) x (L * D): a token's every layer in one row
      flat = lambda a, d: np.moveaxis(np.asarray(a, np.float32), 0, -2).reshape(-1, self.layers * d)
    return np.concatenate([flat(x, self.d_in), flat(y, self.d_out)], axis=1)

  def chunk(self, index: int) -> np.ndarray:
    first = index * self.buffer_batches
    rows = np.concatenate([self.rows(self.windows[first + i][:, :-1]) for i in range(self.buffer_batches)])
    return rows[np.random.default_rng([self.seed, index]).permutation(len(rows))]

  def eval_tokens_BxT(self) -> np.ndarray:
    return self.eval_windows_BxL1[:, :-1]

  @functools.cached_property
  def reference_losses(self) -> tuple[float, float]:
    """The model's next-token loss on the evaluation windows as it is, and with the point zeroed: what
    an SAE spliced in is scored between (computed once: neither changes while an SAE trains)."""
    tokens_BxT = jnp.asarray(self.eval_tokens_BxT())
    loss = lambda patches: float(interventions.next_token_losses(self.model, self.params, tokens_BxT, patches).mean())
    zeroed = self.target_point or self.point  # a transcoder replaces the point it writes: that, zeroed
    layers = range(self.layers) if self.layers else (self.point_layer,)  # a cross-layer one's: every layer's
    return loss(None), loss({(zeroed, layer): interventions.Patch.ablate() for layer in layers})

  def eval_rows(self) -> np.ndarray:
    return self.rows(self.eval_tokens_BxT())


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
