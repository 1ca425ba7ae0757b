"""A call's arguments split for `jax.jit`: the Python values that configure it (flags, names, layer
numbers, token ids) as static arguments, part of the compiled program, and the arrays (and trees of
them: params, caches) traced. What `interventions` runs a model with, and `ActivationCache` its algebra."""


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
