"""A call's arguments shaped for `jax.jit`: split into the Python values that configure it (flags, names,
layer numbers, token ids), static arguments, part of the compiled program, and the arrays (and trees of
them: params, caches) traced: what `interventions` runs a model with, and `ActivationCache` its algebra;
and sizes rounded up to buckets, so that a new prompt's sizes fall in programs already compiled (the
graph's, the patching sweeps')."""

import numpy as np

from transformer.errors import UserError


def is_static(x) -> bool:
  """A Python value (bool, int, str, None, ...) that configures a call rather than carrying data:
  passed to jit as static (`decode=False` stays a Python bool, not a traced array)."""
  return x is None or isinstance(x, (bool, int, float, str))


def split_static(args: tuple, kwargs: dict):
  """(the array arguments, the static ones as a hashable description) of a model call."""
  static = tuple((i, a) for i, a in enumerate(args) if is_static(a)) + tuple(
    sorted((k, v) for k, v in kwargs.items() if is_static(v))
  )
  arrays = (tuple(a for a in args if not is_static(a)), {k: v for k, v in kwargs.items() if not is_static(v)})
  return arrays, static


def join_static(array_args: tuple, array_kwargs: dict, static: tuple):
  """The inverse of `split_static`: (args, kwargs) as the call had them."""
  positional = {i: a for i, a in static if isinstance(i, int)}
  rest = iter(array_args)
  args = tuple(positional[i] if i in positional else next(rest) for i in range(len(array_args) + len(positional)))
  return args, {**array_kwargs, **{k: v for k, v in static if isinstance(k, str)}}


def bucket(count: int, per_octave: int = 1) -> int:
  """`count` rounded up to one of `per_octave` sizes an octave (a power of 2 by default)."""
  step = 1 << max(0, count.bit_length() - per_octave.bit_length())
  return max(1, -(-count // step) * step)


def prompt_bucket(T: int, max_len: int) -> int:
  """The length a prompt of T tokens runs at: T rounded up to one of 4 sizes an octave (8, 10, 12, 14, 16, 20,
  ...), at most the model's context."""
  return max(T, min(max_len, bucket(T, per_octave=4)))


def padded_prompt(tokens_xT, max_len: int, length: int | None) -> np.ndarray:
  """`tokens_xT` (the last axis the positions) padded to `length` (None: `prompt_bucket`'s) with filler token 0
  after the prompt: a causal model's outputs before the filler are those of the prompt alone."""
  tokens_xT = np.asarray(tokens_xT)
  T = tokens_xT.shape[-1]
  if T > max_len:
    raise UserError(f"a prompt of {T} tokens is longer than the model's context ({max_len})")
  length = prompt_bucket(T, max_len) if length is None else length
  if not T <= length <= max_len:
    raise UserError(f"padded_length={length}: give one from the prompt's {T} tokens to the context's {max_len}")
  return np.pad(tokens_xT, [(0, 0)] * (tokens_xT.ndim - 1) + [(0, length - T)]).astype(tokens_xT.dtype)
