"""The optimizer from `config.OptimizerConfig`: AdamW with a weight-decay mask, or Muon for the blocks'
matrices beside AdamW for the rest (optax.contrib.muon); warmup + decay; clipping.

Gradient accumulation is done in the train step (a scan over microbatches, so the step sees one
averaged gradient); this module only builds the optax transformation and the schedule.
"""

from __future__ import annotations

import flax.traverse_util
import jax
import jax.numpy as jnp
import optax

from transformer.config import OptimizerConfig


def learning_rate(opt_config: OptimizerConfig, num_train_steps: int) -> optax.Schedule:
  """Linear warmup to `lr`, then `cosine` or `linear` decay to lr*min_lr_ratio at the last step,
  `wsd` (constant, then linear to lr*min_lr_ratio over the last decay_fraction of the steps),
  `constant`, or `inverse_sqrt` (the 2017 Transformer's lr * min(step/warmup, sqrt(warmup/step)))."""
  opt_config.check()
  lr, warmup = opt_config.lr, opt_config.warmup_steps
  kind, low = opt_config.schedule, lr * float(opt_config.min_lr_ratio)
  if kind == "inverse_sqrt":
    w = max(warmup, 1)
    return lambda step: lr * jnp.minimum((step + 1) / w, jnp.sqrt(w / (step + 1)))
  warm = optax.linear_schedule(0.0, lr, max(warmup, 1))
  decay_steps = max(num_train_steps - warmup, 1)
  if kind == "constant":
    after = optax.constant_schedule(lr)
  elif kind == "linear":
    after = optax.linear_schedule(lr, low, decay_steps)
  elif kind == "wsd":
    decay = max(round(num_train_steps * opt_config.decay_fraction), 1)
    stable = max(decay_steps - decay, 0)
    after = optax.join_schedules([optax.constant_schedule(lr), optax.linear_schedule(lr, low, decay)], [stable])
  else:
    after = optax.cosine_decay_schedule(lr, decay_steps, alpha=float(opt_config.min_lr_ratio))
  return optax.join_schedules([warm, after], [warmup]) if warmup else after


def muon_dimensions(names: tuple) -> optax.contrib.MuonDimensionNumbers | None:
  """How Muon sees a parameter with these logical axis names (transformer.layers) as matrices: a
  block's projection, its input axes x its output axes; every other axis (a scanned stack's layers,
  the q/k/v of a fused projection) indexes a batch of matrices. None (AdamW instead) for the
  embeddings, the output head, norms, biases and a task's own head, as in modded-nanogpt."""
  if "embed" not in names or {"vocab", "position"} & set(names):
    return None
  matrix = [i for i, name in enumerate(names) if name not in (None, "layers")]
  if len(matrix) < 2 or not {names[i] for i in matrix} <= {"embed", "heads", "kv", "mlp"}:
    return None
  embed = names.index("embed")
  axes = lambda group: group[0] if len(group) == 1 else tuple(group)
  if embed == matrix[0]:  # into the block: embed -> heads x kv, or mlp
    return optax.contrib.MuonDimensionNumbers(reduction_axis=embed, output_axis=axes(matrix[1:]))
  return optax.contrib.MuonDimensionNumbers(reduction_axis=axes(matrix[:-1]), output_axis=embed)


def decay_mask(params, opt_config: OptimizerConfig):
  """True where weight decay applies: matrices (kernels). Biases, LayerNorm scales and the
  embeddings are not decayed unless the config says so (as in nanoGPT / GPT-2 practice)."""
  flat = flax.traverse_util.flatten_dict(params)

  def decays(path) -> bool:
    name = path[-1]
    if name == "kernel":
      return True
    if name in ("embedding",) or path[-1] in ("wpe",):
      return bool(opt_config.decay_embeddings)
    return bool(opt_config.decay_norms_and_biases)

  return flax.traverse_util.unflatten_dict({k: decays(k) for k in flat})


def make_optimizer(
  opt_config: OptimizerConfig, num_train_steps: int, update_scale=None, axis_names=None
) -> optax.GradientTransformation:
  """AdamW or Muon per `opt_config`. `update_scale(params)`, when given, is a tree of multipliers of
  each parameter's update (weight decay included): e.g. 0.1 for a pretrained body, 0 to freeze it.
  Muon needs `axis_names`: the params' tree of logical axis names, which say what is a matrix."""
  schedule = learning_rate(opt_config, num_train_steps)
  parts = []
  if opt_config.grad_clip_norm:
    parts.append(optax.clip_by_global_norm(float(opt_config.grad_clip_norm)))
  if opt_config.name == "muon":
    if axis_names is None:
      raise ValueError("Muon needs the parameters' logical axis names (axis_names) to tell matrices apart")
    dimensions = jax.tree.map(muon_dimensions, axis_names, is_leaf=lambda x: isinstance(x, tuple))
    ratio = opt_config.muon_lr / opt_config.lr  # the matrices follow the same schedule, scaled
    parts.append(
      optax.contrib.muon(
        lambda step: schedule(step) * ratio,
        beta=float(opt_config.muon_momentum),
        weight_decay=float(opt_config.weight_decay),  # every matrix is a kernel: all decayed
        adam_learning_rate=schedule,
        adam_b1=float(opt_config.b1),
        adam_b2=float(opt_config.b2),
        eps=float(opt_config.eps),
        muon_weight_dimension_numbers=dimensions,
      )
    )
  else:
    parts.append(
      optax.adamw(
        schedule,
        b1=float(opt_config.b1),
        b2=float(opt_config.b2),
        eps=float(opt_config.eps),
        weight_decay=float(opt_config.weight_decay),
        mask=lambda p: decay_mask(p, opt_config),
      )
    )
  if update_scale is not None:
    parts.append(optax.stateless(lambda updates, params: jax.tree.map(jnp.multiply, updates, update_scale(params))))
  return optax.chain(*parts)
