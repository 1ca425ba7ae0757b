"""A trained GPT's activations as an SAE's training rows, computed on the fly.

`ModelActivations` is the model-run source beside transformer.data.activations' others (an array a
user brings, synthetic rows in superposition), with their interface: `chunk(i)`, the i-th refill of
training rows (a pure function of i), `eval_rows()`, the fixed rows every evaluation scores, `d_in`.
It runs the model through `run_with_cache` (jit-compiled, only the point kept): a chunk is
`buffer_sequences` random windows, every (window, position) a row, shuffled, so that a batch mixes
many contexts (SAELens's activation store mixes its buffer for the same reason). It lives here, not in
transformer.data, because it runs a model at a named point: the data package stands below the instrument.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from transformer.data import pipeline
from transformer.data.prepare import Prepared
from transformer.errors import ConfigError
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
