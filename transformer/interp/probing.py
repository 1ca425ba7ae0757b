"""What a point of the model encodes: linear probes (with a control task) and distributed alignment
search (interchange interventions on a learned subspace).

A linear probe asks whether a variable can be read off an activation by a linear map; its held-out
accuracy alone says little (a probe can memorise), so it is reported beside a control task: the
same probe trained to predict a random label fixed per input token (Hewitt & Liang 2019); the
difference is the probe's selectivity.

Distributed alignment search (Geiger et al. 2023; pyvene's `RotatedSpaceIntervention`) asks whether
the model *uses* a variable there: it learns an orthonormal rank-r subspace R (D x r) of a point such
that the interchange intervention base + (source - base) R Rᵀ (the source run's coordinates in R put
into the base run) makes the model output what it would if the variable took the source's value.
Its interchange-intervention accuracy is reported beside a random subspace of the same rank.

    >>> probe = probing.linear_probe(model, params, tokens_BxT, labels_BxT, point="resid_post", layer=0)
    >>> probe.test_accuracy, probe.control_accuracy, probe.selectivity
    >>> found = probing.distributed_alignment_search(model, params, base_BxT, source_BxT, counterfactual_BxT,
    ...                                              point="k_input", layer=1, rank=4, where=where)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer.interp.interventions import Patch, run_with_cache
from transformer.interp.patching import jax_params, patched_logits
from transformer.layers.points import Point


@dataclasses.dataclass
class Probe:
  """A trained linear probe: logits = features @ weight + bias over the labels that occur
  (`classes_C`: column c predicts classes_C[c]); accuracies on held-out rows, and the control task's
  (random labels fixed per token type) with the same probe and data."""

  classes_C: np.ndarray
  weight_DxC: np.ndarray
  bias_C: np.ndarray
  train_accuracy: float
  test_accuracy: float
  control_accuracy: float

  @property
  def selectivity(self) -> float:
    return self.test_accuracy - self.control_accuracy


def _fit(features_NxD, labels_N, num_classes: int, train_N, steps: int, learning_rate: float, seed: int):
  """(weight, bias) of a softmax regression fitted on the rows `train_N` (AdamW, full batch)."""
  x_NxD, y_N = jnp.asarray(features_NxD)[train_N], jnp.asarray(labels_N)[train_N]
  return _fitted(x_NxD, y_N, jax.random.key(seed), num_classes, steps, learning_rate)


@functools.partial(jax.jit, static_argnames=("num_classes", "steps", "learning_rate"))
def _fitted(x_NxD, y_N, key, num_classes: int, steps: int, learning_rate: float):
  """`_fit`'s training, compiled once per shape (a probe at each layer, and its control, share it)."""
  params = {"weight": jax.random.normal(key, (x_NxD.shape[1], num_classes)) * 0.01, "bias": jnp.zeros(num_classes)}
  tx = optax.adamw(learning_rate, weight_decay=1e-4)

  def loss(p):
    logits_NxC = x_NxD @ p["weight"] + p["bias"]
    return optax.softmax_cross_entropy_with_integer_labels(logits_NxC, y_N).mean()

  def step(carry, _):
    p, state = carry
    updates, state = tx.update(jax.grad(loss)(p), state, p)
    return (optax.apply_updates(p, updates), state), None

  return jax.lax.scan(step, (params, tx.init(params)), None, length=steps)[0][0]


def _accuracy(p, features_NxD, labels_N) -> float:
  return float(jnp.mean(jnp.argmax(features_NxD @ p["weight"] + p["bias"], -1) == labels_N))


def fit_probe(
  features_NxD,
  labels_N,
  token_types_N,
  *,
  groups_N=None,
  test_fraction: float = 0.25,
  steps: int = 1000,
  learning_rate: float = 3e-2,
  seed: int = 0,
) -> Probe:
  """A linear probe from features to labels, tested on a held-out `test_fraction` of the rows (of the
  groups `groups_N`, e.g. the sequence each row comes from, when given: no group on both sides, so
  that a pair seen in training is not a test row of the same sequence), and its control task: each
  token type (`token_types_N`, e.g. the input token at each row) given a random label drawn from the
  labels' own distribution, the same for every occurrence."""
  features_NxD = jnp.asarray(features_NxD, jnp.float32)
  token_types_N = np.asarray(token_types_N)
  # Columns for the labels that occur only: a token's id among 50,257 needs no 50,257-way probe.
  classes_C, labels_N = np.unique(np.asarray(labels_N), return_inverse=True)
  N, num_classes = len(labels_N), len(classes_C)
  if N < 8:
    raise ValueError(f"a probe needs rows to train and test on; got {N}")
  rng = np.random.default_rng(seed)
  groups_N = np.arange(N) if groups_N is None else np.asarray(groups_N)
  groups = rng.permutation(np.unique(groups_N))
  held_out = np.isin(groups_N, groups[: max(1, int(len(groups) * test_fraction))])
  test_N, train_N = np.flatnonzero(held_out), np.flatnonzero(~held_out)
  fitted = _fit(features_NxD, jnp.asarray(labels_N), num_classes, train_N, steps, learning_rate, seed)
  types = np.unique(token_types_N)
  control_of_type = dict(zip(types, rng.choice(labels_N, size=len(types))))
  control_N = jnp.asarray([control_of_type[t] for t in token_types_N])
  control = _fit(features_NxD, control_N, num_classes, train_N, steps, learning_rate, seed)
  return Probe(
    classes_C=classes_C,
    weight_DxC=np.asarray(fitted["weight"]),
    bias_C=np.asarray(fitted["bias"]),
    train_accuracy=_accuracy(fitted, features_NxD[train_N], labels_N[train_N]),
    test_accuracy=_accuracy(fitted, features_NxD[test_N], labels_N[test_N]),
    control_accuracy=_accuracy(control, features_NxD[test_N], control_N[test_N]),
  )


def linear_probe(model, params, tokens_BxT, labels_BxT, *, point: str, layer: int | None = None, mask_BxT=None, **fit):
  """`fit_probe` on a point's activations (B x T x D; `layer`: which block's), one row per position
  where `mask_BxT` is True (default: all), held out by sequence, the control task's token types the
  input tokens there. `point` in our words or TransformerLens's (`Point.parse`); one that names its block
  (`blocks.2.hook_resid_post`) needs no `layer`."""
  at = Point.parse(point)
  if at.layer is not None and layer not in (None, at.layer):
    raise ValueError(f"point={point!r} is in block {at.layer}, and layer={layer}: name the block once")
  layer = at.layer if layer is None else layer
  _, cache = run_with_cache(model, params, tokens_BxT, names=(at.name,))
  x_BxTxD = cache[at.name] if layer is None else cache[at.name][layer]
  if x_BxTxD.ndim != 3:
    raise ValueError(f"a probe reads a point of B x T x D; {point!r} is {tuple(x_BxTxD.shape)}")
  mask_BxT = np.ones(tokens_BxT.shape, bool) if mask_BxT is None else np.asarray(mask_BxT)
  features_NxD = np.asarray(x_BxTxD)[mask_BxT]
  rows_BxT = np.broadcast_to(np.arange(tokens_BxT.shape[0])[:, None], tokens_BxT.shape)
  labels_N, tokens_N = np.asarray(labels_BxT)[mask_BxT], np.asarray(tokens_BxT)[mask_BxT]
  return fit_probe(features_NxD, labels_N, tokens_N, groups_N=rows_BxT[mask_BxT], **fit)


@dataclasses.dataclass
class Alignment:
  """A distributed alignment search: the subspace found (D x r, orthonormal columns), the
  interchange-intervention accuracy with it, with a random subspace of the same rank, and with the
  whole point (the ceiling: every coordinate interchanged)."""

  subspace_Dxr: np.ndarray
  accuracy: float
  random_accuracy: float
  full_accuracy: float
  losses: list[float]


def _orthonormal(w_Dxr) -> jax.Array:
  """An orthonormal basis of w's columns (QR; signs fixed so the map is smooth)."""
  q, r = jnp.linalg.qr(w_Dxr)
  return q * jnp.sign(jnp.diagonal(r))


def interchange(model, params, base_BxT, base_act, source_act, subspace_Dxr, *, point: str, layer: int, where=True):
  """The base run's logits with its `point` at `layer` moved to the source run's coordinates inside
  the subspace: base + (source - base) R Rᵀ, where `where` is True (broadcast to the point)."""
  projection_DxD = subspace_Dxr @ subspace_Dxr.T
  value = base_act + (source_act - base_act) @ projection_DxD
  return patched_logits(model, params, {(point, layer): Patch.replace(value, where=where)}, base_BxT)


def _adam_fitted(loss, w, steps: int, learning_rate: float) -> tuple[jax.Array, list[float]]:
  """`w` after `steps` Adam steps on `loss(w)` (one compiled step), and the loss before each."""
  tx = optax.adam(learning_rate)
  state = tx.init(w)

  @jax.jit
  def step(w, state):
    value, grads = jax.value_and_grad(loss)(w)
    updates, state = tx.update(grads, state, w)
    return optax.apply_updates(w, updates), state, value

  losses = []
  for _ in range(steps):
    w, state, value = step(w, state)
    losses.append(float(value))
  return w, losses


def distributed_alignment_search(
  model,
  params,
  base_BxT,
  source_BxT,
  counterfactual_BxT,
  *,
  point: str,
  layer: int,
  rank: int,
  where=True,
  loss_mask_BxT=None,
  steps: int = 200,
  learning_rate: float = 1e-2,
  seed: int = 0,
) -> Alignment:
  """Learn a rank-`rank` subspace of `point` at `layer` (trained with jax.grad through the patched
  run) such that the interchange intervention from `source_BxT` into `base_BxT` makes the model
  predict `counterfactual_BxT` (the next token it should give if the variable took the source's
  value) at the positions `loss_mask_BxT`. Accuracy: argmax == counterfactual there."""
  params = jax_params(params)
  _, base = run_with_cache(model, params, base_BxT, names=(point,))
  _, source = run_with_cache(model, params, source_BxT, names=(point,))
  base_act, source_act = base[point][layer], source[point][layer]
  D = base_act.shape[-1]
  if not 0 < rank <= D:
    raise ValueError(f"rank={rank}: a subspace of {point!r} has rank 1 to {D}")
  mask_BxT = jnp.ones(base_BxT.shape, bool) if loss_mask_BxT is None else jnp.asarray(loss_mask_BxT)
  targets_BxT = jnp.asarray(counterfactual_BxT)

  def logits_with(subspace_Dxr):
    return interchange(
      model, params, base_BxT, base_act, source_act, subspace_Dxr, point=point, layer=layer, where=where
    )

  def loss(w_Dxr):
    logits_BxTxV = logits_with(_orthonormal(w_Dxr))
    nll_BxT = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV.astype(jnp.float32), targets_BxT)
    return jnp.sum(nll_BxT * mask_BxT) / jnp.maximum(mask_BxT.sum(), 1)

  def accuracy(subspace_Dxr) -> float:
    right_BxT = jnp.argmax(logits_with(subspace_Dxr), -1) == targets_BxT
    return float(jnp.sum(right_BxT * mask_BxT) / jnp.maximum(mask_BxT.sum(), 1))

  key_train, key_random = jax.random.split(jax.random.key(seed))
  w_Dxr, losses = _adam_fitted(loss, jax.random.normal(key_train, (D, rank)), steps, learning_rate)
  found_Dxr = _orthonormal(w_Dxr)
  random_Dxr = _orthonormal(jax.random.normal(key_random, (D, rank)))
  full = accuracy(jnp.eye(D))
  return Alignment(np.asarray(found_Dxr), accuracy(found_Dxr), accuracy(random_Dxr), full, losses)
