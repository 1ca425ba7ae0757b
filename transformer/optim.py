"""The optimizer from `config.OptimizerConfig`: AdamW with a weight-decay mask, warmup + decay, clipping.

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
  """Linear warmup to `lr`, then `cosine` decay to lr*min_lr_ratio at the last step, `constant`, or
  `inverse_sqrt` (the 2017 Transformer's lr * min(step/warmup, sqrt(warmup/step)))."""
  opt_config.check()
  lr, warmup = opt_config.lr, opt_config.warmup_steps
  kind = opt_config.schedule
  if kind == "inverse_sqrt":
    w = max(warmup, 1)
    return lambda step: lr * jnp.minimum((step + 1) / w, jnp.sqrt(w / (step + 1)))
  warm = optax.linear_schedule(0.0, lr, max(warmup, 1))
  if kind == "constant":
    after = optax.constant_schedule(lr)
  else:
    decay_steps = max(num_train_steps - warmup, 1)
    after = optax.cosine_decay_schedule(lr, decay_steps, alpha=float(opt_config.min_lr_ratio))
  return optax.join_schedules([warm, after], [warmup]) if warmup else after


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
  opt_config: OptimizerConfig, num_train_steps: int, update_scale=None
) -> optax.GradientTransformation:
  """AdamW per `opt_config`. `update_scale(params)`, when given, is a tree of multipliers of each
  parameter's update (weight decay included): e.g. 0.1 for a pretrained body, 0 to freeze it."""
  schedule = learning_rate(opt_config, num_train_steps)
  parts = []
  if opt_config.grad_clip_norm:
    parts.append(optax.clip_by_global_norm(float(opt_config.grad_clip_norm)))
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
