"""The named points: activations where transformer.interp.interventions reads and patches a run.

A module calls `point(self, name, x)` where an activation it computes has a name its users know
(TransformerLens's hook points); a run that neither reads nor patches compiles to the same program.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp


def point(module: nn.Module, name: str, x: jax.Array) -> jax.Array:
  """A named activation (`module`'s `name`), where transformer.interp.interventions acts: changed where the
  "patches" collection has an entry of this name ({"replace": bool, "value": x's values where replace
  is True, "add": added}, each of x's shape: `Patch.collection_entry`), then recorded in
  "activations" when a run asks for that collection. Otherwise x itself: a run that asks for neither
  compiles to the same program."""
  if module.has_variable("patches", name):
    patch = module.get_variable("patches", name)
    x = jnp.where(patch["replace"], patch["value"].astype(x.dtype), x) + patch["add"].astype(x.dtype)
  if module.is_mutable_collection("activations"):
    module.put_variable("activations", name, x)
  return x


def intervened(module: nn.Module) -> bool:
  """Whether a run reads or patches this module's named points (`point`): then attention takes the
  reference path, whose scores and probabilities exist to pass through them."""
  return module.is_mutable_collection("activations") or bool(module.variables.get("patches"))


def points_of(module: nn.Module):
  """The attention module's named points for `mix` (`at`) when a run reads or patches them; otherwise
  None, and no score is materialised for them."""
  if not intervened(module):
    return None
  return functools.partial(point, module)
