"""Device mesh and shardings from the config: the model declares logical axes, this maps them.

Mesh axes (MaxText's names):
  data    pure data parallelism: params replicated, batch split
  fsdp    fully sharded data parallelism: batch split *and* params/optimizer state split on `embed`
  tensor  tensor (model) parallelism: heads, MLP and vocabulary split
The logical axis rules (config.logical_axis_rules, `DEFAULT_RULES`) say which mesh axes each logical name uses;
Flax replicates a dimension whose mesh axis another dimension of the same tensor already took.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer.errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")

DEFAULT_RULES = (
  ("batch", ("data", "fsdp")),
  ("vocab", "tensor"),
  ("embed", "fsdp"),
  ("heads", "tensor"),
  ("mlp", "tensor"),
  ("kv", None),
  ("length", None),
  ("position", None),
  ("layers", None),
)


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor) with at most one -1 ('the rest of the devices'), checked against the devices."""
  shape = [int(mesh_config[a]) for a in MESH_AXES]
  if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
    raise ConfigError(
      f"mesh {dict(zip(MESH_AXES, shape))}: each axis must be a positive size, and at most "
      f"one may be -1 (all remaining devices)"
    )
  if -1 in shape:
    known = math.prod(s for s in shape if s != -1)
    if num_devices % known:
      raise ConfigError(
        f"mesh {dict(zip(MESH_AXES, shape))} cannot fill {num_devices} devices: "
        f"{num_devices} is not divisible by {known}"
      )
    shape[shape.index(-1)] = num_devices // known
  if math.prod(shape) != num_devices:
    raise ConfigError(
      f"mesh {dict(zip(MESH_AXES, shape))} needs {math.prod(shape)} devices but "
      f"{num_devices} are available ({jax.devices()[0].platform}); make data*fsdp*tensor "
      f"= {num_devices}, e.g. --config.mesh.data=-1"
    )
  return tuple(shape)


def make_mesh(shape: tuple[int, int, int], devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh of `shape` (see `mesh_shape`) over `devices` (default: all)."""
  devices = jax.devices() if devices is None else devices
  # Linen's logical partitioning works with Auto axes (jax.make_mesh now defaults to Explicit).
  return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def logical_shardings(mesh: Mesh, boxed_tree, axis_rules):
  """NamedShardings for a tree of `nn.Partitioned` (e.g. from `jax.eval_shape(model.init, ...)`)."""
  specs = nn.get_partition_spec(boxed_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, axis_rules)


def check_divisible(shapes_tree, shardings_tree) -> None:
  """Every sharded dimension must split evenly over its mesh axes; names the parameter if not."""
  flat_shapes = jax.tree_util.tree_flatten_with_path(shapes_tree)[0]
  flat_sh = jax.tree.leaves(shardings_tree, is_leaf=lambda x: isinstance(x, NamedSharding))
  for (path, leaf), sh in zip(flat_shapes, flat_sh):
    for dim, axes in zip(leaf.shape, sh.spec):
      axes = (axes,) if isinstance(axes, str) else (axes or ())
      ways = int(np.prod([sh.mesh.shape[a] for a in axes])) if axes else 1
      if dim % ways:
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        is_vocab = name.startswith(("wte/", "lm_head/"))
        hint = " (pad it: set model.vocab_size to a multiple, e.g. 50304 for GPT-2)" if is_vocab else ""
        raise ConfigError(
          f"parameter '{name}' has a dimension of {dim}, which mesh axes {axes} "
          f"cannot split {ways} ways{hint}; change the mesh or the model size"
        )


def batch_sharding(mesh: Mesh, axis_rules, ndim: int = 2) -> NamedSharding:
  """Batch-major arrays: the leading dimension split like the logical `batch` axis."""
  spec = nn.logical_to_mesh_axes(("batch",) + (None,) * (ndim - 1), axis_rules)
  return NamedSharding(mesh, spec)


def global_array(tree, sharding: NamedSharding):
  """Host arrays (a pytree of them) that every process holds in full -> global arrays (each process
  puts in its own shards)."""

  def put(x):
    x_np = np.asarray(x)
    return jax.make_array_from_callback(x_np.shape, sharding, lambda idx: x_np[idx])

  return jax.tree.map(put, tree)


def param_shardings(model: nn.Module, init_inputs: tuple, mesh: Mesh, axis_rules):
  """(boxed abstract params, their NamedShardings) from the logical axis names `model` declares."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(axis_rules):
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), *init_inputs)["params"])
  return boxed, logical_shardings(mesh, boxed, axis_rules)


def optimizer_state_shardings(state_shapes, param_shapes, param_shardings, mesh: Mesh):
  """Shardings of an optimizer state: each tree of moments sharded like the params it tracks, every
  other leaf (step counts) replicated. A state leaf tracks the param whose path ends its own path
  (`...mu['h']['layer_0']['mlp']['fc']['kernel']`) with the same shape. (optax.tree_map_params
  cannot see through the masked and partitioned states of Muon's optax.contrib.muon.)"""
  params = {
    tuple(k.key for k in path): (x.shape, sh)
    for (path, x), sh in zip(jax.tree_util.tree_flatten_with_path(param_shapes)[0], jax.tree.leaves(param_shardings))
  }

  def sharding(path, leaf):
    keys = tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey))
    for start in range(len(keys)):
      shape, sh = params.get(keys[start:], (None, None))
      if shape == leaf.shape:
        return sh
    return replicated(mesh)

  return jax.tree_util.tree_map_with_path(sharding, state_shapes)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def data_parallel_size(mesh, axis_rules) -> int:
  """How many ways the batch is split: the product of the mesh axes `batch` maps to, for a Mesh or
  a {axis: size} mapping."""
  sizes = mesh.shape if isinstance(mesh, Mesh) else mesh
  spec = nn.logical_to_mesh_axes(("batch",), axis_rules)[0]
  axes = (spec,) if isinstance(spec, str) else (spec or ())
  return int(np.prod([sizes[a] for a in axes])) if axes else 1
