"""The named points: activations where transformer.interp.interventions reads and patches a run.

A module calls `point(self, name, x)` where an activation it computes has a name its users know
(TransformerLens's hook points); a run that neither reads nor patches compiles to the same program.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp

# Functions of a point's value, applied while a model is traced (`functions_at`): TransformerLens's
# forward hooks, for computations a patch's fixed value cannot say (a value that depends on another
# point of the same run, e.g. a transcoder's live skip path).
# With the names of the points they act on (None: every point).
_FUNCTIONS: contextvars.ContextVar[tuple[Callable, frozenset | None] | None] = contextvars.ContextVar(
  "point_functions", default=None
)


@contextlib.contextmanager
def functions_at(
  fn: Callable[[tuple[str, ...], jax.Array], jax.Array], names: Iterable[str] | None = None
) -> Iterator[None]:
  """While the model is traced inside this block, every named point's value x becomes fn(path, x), where
  path is the point's place in the activations tree (the module's path and the point's name: ("h",
  "layer_3", "mlp_out")). `names`: the points' names (a path's last part) fn acts on, the others left as they
  are; then a point that costs work only to exist (attention's per-head `result`: the output projection head
  by head) is not made unless named. For a function you trace yourself (jax.jit of a function that calls
  `model.apply` inside the block): a compiled program does not know the block it was traced in."""
  token = _FUNCTIONS.set((fn, None if names is None else frozenset(names)))
  try:
    yield
  finally:
    _FUNCTIONS.reset(token)


def point(module: nn.Module, name: str, x: jax.Array) -> jax.Array:
  """A named activation (`module`'s `name`), where transformer.interp.interventions acts: changed where the
  "patches" collection has an entry of this name ({"replace": bool, "value": x's values where replace
  is True, "add": added}, each of x's shape: `Patch.collection_entry`), then recorded in
  "activations" when a run asks for that collection. Otherwise x itself: a run that asks for neither
  compiles to the same program."""
  if module.has_variable("patches", name):
    patch = module.get_variable("patches", name)
    x = jnp.where(patch["replace"], patch["value"].astype(x.dtype), x) + patch["add"].astype(x.dtype)
  fn = _function(name)
  if fn is not None:
    x = fn((*module.path, name), x)
  if module.is_mutable_collection("activations"):
    module.put_variable("activations", name, x)
  return x


def _function(name: str) -> Callable | None:
  """The function of `functions_at` that acts on points called `name`, if any."""
  active = _FUNCTIONS.get()
  if active is None or (active[1] is not None and name not in active[1]):
    return None
  return active[0]


def acts_on(module: nn.Module, name: str) -> bool:
  """Whether a run reads, patches or applies a function to `module`'s point `name`."""
  return (
    module.is_mutable_collection("activations") or module.has_variable("patches", name) or _function(name) is not None
  )


def intervened(module: nn.Module, names: Iterable[str]) -> bool:
  """Whether a run reads, patches or applies a function to any of `module`'s points `names`: then attention
  takes the reference path, whose scores and probabilities exist to pass through them, and a norm makes its
  divisor and normalised input."""
  return any(acts_on(module, name) for name in names)


# Attention's points that exist only on its reference path (the scores and probabilities, B x H x T x S).
MIXING_POINTS = ("attn_scores", "pattern")


def points_of(module: nn.Module):
  """The attention module's named points for `mix` (`at`) when a run reads or patches them; otherwise
  None, and no score is materialised for them."""
  if not intervened(module, MIXING_POINTS):
    return None
  return functools.partial(point, module)
