"""The named points: activations where transformer.interp.interventions reads and patches a run.

A module calls `point(self, name, x)` where an activation it computes has a name its users know
(TransformerLens's hook points); a run that neither reads nor patches compiles to the same program.

A point as a value is a `Point`: its name, its block and, where one is meant, a head. It is written in
our words (`L3.resid_post`, `L3H5.z`, `embed`) or TransformerLens's (`blocks.3.hook_resid_post`,
`blocks.0.attn.hook_pattern`, `hook_embed`: the names SAELens's `cfg.json` and circuit-tracer's
`config.yaml` carry), and `Point.parse` reads both.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import re
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
  by head) is not made unless named.

  Why a context and not an argument: the function reaches every block's `point` calls without each module's
  `__call__` taking and passing it down (the model's signature stays the one every family shares), and a
  linen module's fields must be hashable data, not closures over traced arrays. The price: a compiled program
  is keyed on its arguments, not on this block. So enter the block inside the function you jit, and make what
  selects `fn` one of that function's static arguments (as transformer.interp.graph and replacement do with
  the transcoders' `static()`): a jitted function called inside the block, but traced outside it, does not
  see it."""
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
  """The attention module's named points for `mix` (its `points`) when a run reads or patches them; otherwise
  None, and no score is materialised for them."""
  if not intervened(module, MIXING_POINTS):
    return None
  return functools.partial(point, module)


# Ours -> TransformerLens's name of each point (within `blocks.{l}.` for a block's points).
TL_NAMES = {
  "resid_pre": "hook_resid_pre",
  "resid_mid": "hook_resid_mid",
  "resid_post": "hook_resid_post",
  "ln_1.scale": "ln1.hook_scale",
  "ln_1.normalized": "ln1.hook_normalized",
  "ln_2.scale": "ln2.hook_scale",
  "ln_2.normalized": "ln2.hook_normalized",
  "q_input": "hook_q_input",
  "k_input": "hook_k_input",
  "v_input": "hook_v_input",
  "q": "attn.hook_q",
  "k": "attn.hook_k",
  "v": "attn.hook_v",
  "rot_q": "attn.hook_rot_q",
  "rot_k": "attn.hook_rot_k",
  "attn_scores": "attn.hook_attn_scores",
  "pattern": "attn.hook_pattern",
  "z": "attn.hook_z",
  "result": "attn.hook_result",
  "attn_out": "hook_attn_out",
  "mlp_out": "hook_mlp_out",
  "mlp_in": "hook_mlp_in",
  # circuit-tracer's names (its ReplacementMLP's hooks on TransformerLens's MLP, whose ln2 is not folded):
  # the MLP's own input, after ln2 and its weight, and its output before any norm after it
  "mlp_input": "mlp.hook_in",
  "mlp_output": "mlp.hook_out",
  "mlp_pre": "mlp.hook_pre",
  "mlp_pre_linear": "mlp.hook_pre_linear",
  "mlp_post": "mlp.hook_post",
}
# The points outside the blocks.
TL_OUTSIDE = {
  "embed": "hook_embed",
  "pos_embed": "hook_pos_embed",
  "ln_f.scale": "ln_final.hook_scale",
  "ln_f.normalized": "ln_final.hook_normalized",
}
_FROM_TL = {tl: ours for ours, tl in TL_NAMES.items()}
_FROM_TL_OUTSIDE = {tl: ours for ours, tl in TL_OUTSIDE.items()}
_OURS = re.compile(r"L(\d+)(?:H(\d+))?\.(.+)")
_TL_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")


@dataclasses.dataclass(frozen=True, order=True)
class Point:
  """A named point of a model: `name` (ours: `resid_post`, `ln_2.normalized`, `encoder.pattern`), its block
  (`layer`; None: outside the blocks, or every block's at once), and a `head` where one is meant (`z`'s,
  `pattern`'s: the heads' axis indexed; None: all of them).

      >>> Point.parse("blocks.3.hook_resid_post") == Point.parse("L3.resid_post") == Point("resid_post", 3)
      >>> Point("z", 3, 5).tl_name()      # 'blocks.3.attn.hook_z' (TransformerLens's names carry no head)
  """

  name: str
  layer: int | None = None
  head: int | None = None

  def __str__(self) -> str:
    where = "" if self.layer is None else f"L{self.layer}" + ("" if self.head is None else f"H{self.head}") + "."
    return where + self.name

  def tl_name(self) -> str:
    """TransformerLens's name of this point (`blocks.{layer}.hook_...`); one clear error for a point it
    has no name for (a decoder's cross-attention, `final_norm`, `logits`)."""
    if self.layer is None and self.name in TL_OUTSIDE:
      return TL_OUTSIDE[self.name]
    if self.layer is not None and self.name in TL_NAMES:
      return f"blocks.{self.layer}.{TL_NAMES[self.name]}"
    where = "outside the blocks" if self.layer is None else f"in block {self.layer}"
    raise KeyError(f"{self.name!r} {where} has no TransformerLens name; its names are {', '.join(_tl_examples())}")

  @classmethod
  def parse(cls, text: str) -> Point:
    """A point written in our words (`resid_post`, `L3.resid_post`, `L3H5.z`) or TransformerLens's
    (`blocks.3.hook_resid_post`, `blocks.0.attn.hook_pattern`, `hook_embed`, `ln_final.hook_normalized`; a
    block's without its block, `hook_mlp_out`, `mlp.hook_in`, as circuit-tracer's hooks are named).
    A TransformerLens-shaped name that is not one of its points is one error naming the ones it has."""
    if isinstance(text, Point):
      return text
    text = str(text).strip()
    if text in _FROM_TL_OUTSIDE:
      return cls(_FROM_TL_OUTSIDE[text])
    block = _TL_BLOCK.fullmatch(text)
    if block and block.group(2) in _FROM_TL:
      return cls(_FROM_TL[block.group(2)], int(block.group(1)))
    if text in _FROM_TL:  # a block's point without its block (`mlp.hook_out`: as circuit-tracer's config.yaml names it)
      return cls(_FROM_TL[text])
    if block or text.startswith("hook_") or ".hook_" in text:
      raise KeyError(f"no named point {text!r}: TransformerLens's names of the points are {', '.join(_tl_examples())}")
    ours = _OURS.fullmatch(text)
    if ours:
      return cls(ours.group(3), int(ours.group(1)), None if ours.group(2) is None else int(ours.group(2)))
    return cls(text)


def _tl_examples() -> list[str]:
  return [*TL_OUTSIDE.values(), *(f"blocks.{{l}}.{tl}" for tl in TL_NAMES.values())]


_LAYER = re.compile(r"layer_(\d+)$")
_SUBMODULES = ("attn", "mlp")  # a point of theirs is named without them: `q`, not `attn.q`


def split_path(path: tuple[str, ...]) -> tuple[str, int | None, str]:
  """A point's path in the "activations" tree -> (its name, its layer (None: scanned, or not in a block),
  the key its block is under: "layer_<i>" unrolled (`layers.Stack`), "layers" scanned, "" outside blocks).
  A GPT's blocks are under `h` and named without it; another stack's name comes first (`encoder.z`)."""
  for i, part in enumerate(path):
    match = _LAYER.match(part)
    if match or part == "layers":
      stack, rest = path[:i], path[i + 1 :]
      name = rest[-1] if len(rest) == 1 or rest[0] in _SUBMODULES else ".".join(rest)
      prefix = "" if stack == ("h",) else ".".join(stack) + "."
      return prefix + name, int(match.group(1)) if match else None, part
  return ".".join(path), None, ""
