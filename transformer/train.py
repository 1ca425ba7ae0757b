"""Training: the pure train/eval steps and `train_and_evaluate(config, workdir)`, the one loop for
every task.

    from experiments import shakespeare
    from transformer.train import train_and_evaluate
    train_and_evaluate(shakespeare.get_config("char"), "workdirs/char")   # what launch/train.py does

The loop: resolve the config (transformer.config: every value checked, nothing built yet) -> the
task's data (prepared on first use), the mesh, the task (transformer.tasks: its model, loss, batches
and evaluation) and the optimizer -> restore the latest checkpoint of the workdir (state, data
position, RNG) or initialise -> jit-compiled sharded steps with periodic evaluation, async Orbax
checkpoints and metrics -> a loss plot and the task's final output (a generated sample; test BLEU).
SIGTERM saves a checkpoint and returns cleanly. The loop never asks which task it trains.
"""

from __future__ import annotations

import dataclasses
import functools
import signal
import time
from pathlib import Path
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import logging
from tqdm import tqdm

from transformer import checkpoints, metrics, optim, sharding, tasks
from transformer.config import RunConfig, resolve, to_config_dict


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # raw key data (uint32), so that checkpoints hold plain arrays


# ---------------------------------------------------------------------------------------------
# Pure steps. `loss_fn(params, batch, rng, train) -> (summed loss, number of target tokens)` is the
# task's (see transformer.tasks); a batch is an array or a dict of arrays, batch-major.


def train_step(state: TrainState, batch, *, loss_fn, tx, schedule, accumulation_steps: int):
  """One optimizer update on the mean loss per target token. The batch is split into
  `accumulation_steps` microbatches (a scan, so memory is that of one microbatch) whose summed
  losses and gradients are divided by the batch's total tokens: every token weighs the same."""
  rng = jax.random.wrap_key_data(state.rng)
  rng, step_rng = jax.random.split(rng)
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if accumulation_steps == 1:
    (loss_sum, tokens), grads = grad_fn(state.params, batch, step_rng, True)
  else:
    micro = jax.tree.map(lambda x: x.reshape(accumulation_steps, -1, *x.shape[1:]), batch)

    def accumulate(carry, xs):
      loss_sum, tokens, grad_sum = carry
      micro_batch, i = xs
      (loss, n), grads = grad_fn(state.params, micro_batch, jax.random.fold_in(step_rng, i), True)
      return (loss_sum + loss, tokens + n, jax.tree.map(jnp.add, grad_sum, grads)), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    (loss_sum, tokens, grads), _ = jax.lax.scan(accumulate, (jnp.zeros(()), jnp.zeros(()), zeros),
                                                (micro, jnp.arange(accumulation_steps)))
  tokens = jnp.maximum(tokens, 1.0)
  grads = jax.tree.map(lambda g: g / tokens, grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                            rng=jax.random.key_data(rng))
  return new_state, {"loss": loss_sum / tokens, "grad_norm": optax.tree.norm(grads), "lr": schedule(state.step)}


def eval_step(params, batch, *, loss_fn):
  """(summed loss, number of target tokens) without dropout."""
  return loss_fn(params, batch, jax.random.key(0), False)


# ---------------------------------------------------------------------------------------------
# The resolved config -> what the loop works with.


@dataclasses.dataclass
class Run:
  """Everything built from the resolved config that the loop and evaluation share."""
  config: RunConfig
  task: tasks.Task
  mesh: jax.sharding.Mesh
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  state_shardings: TrainState


def build(run_config: RunConfig) -> Run:
  task_cls = tasks.get(run_config.task)
  task_data = task_cls.load_data(run_config)
  mesh = sharding.make_mesh(run_config.mesh.shape)
  task = task_cls(run_config, task_data.tokenizer, mesh, task_data)
  rules, steps = run_config.mesh.rules, run_config.loop.num_train_steps
  tx = optim.make_optimizer(run_config.optimizer, steps)
  schedule = optim.learning_rate(run_config.optimizer, steps)
  boxed, param_sh = sharding.param_shardings(task.model, task.init_inputs(), mesh, rules)
  sharding.check_divisible(nn.unbox(boxed), param_sh)  # outside the rules: no constraints on shapes
  opt_shapes = jax.eval_shape(tx.init, nn.unbox(boxed))
  repl = sharding.replicated(mesh)
  # Optimizer state is sharded like the params it tracks (Adam's mu/nu), scalars replicated.
  opt_sh = optax.tree_map_params(tx, lambda _, s: s, opt_shapes, param_sh,
                                 transform_non_params=lambda _: repl,
                                 is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
  state_sh = TrainState(step=repl, params=param_sh, opt_state=opt_sh, rng=repl)
  return Run(run_config, task, mesh, tx, schedule, state_sh)


def _init_fn(run: Run):
  def init(seed):
    init_rng, train_rng = jax.random.split(jax.random.key(seed))
    params = nn.unbox(run.task.model.init(init_rng, *run.task.init_inputs())["params"])
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=run.tx.init(params),
                      rng=jax.random.key_data(train_rng))
  return init


def init_state(run: Run) -> TrainState:
  with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.config.mesh.rules):
    return jax.jit(_init_fn(run), out_shardings=run.state_shardings)(run.config.loop.seed)


def abstract_state(run: Run) -> TrainState:
  """The state's shapes, dtypes and shardings: the target Orbax restores into."""
  shapes = jax.eval_shape(_init_fn(run), run.config.loop.seed)
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes,
                      run.state_shardings)


# ---------------------------------------------------------------------------------------------
# The loop.


class _Preemption:
  """SIGTERM -> finish the current step, save a checkpoint, return normally (exit status 0)."""

  def __init__(self):
    self.requested = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    logging.warning("SIGTERM: saving a checkpoint after this step, then stopping")
    self.requested = True

  def restore(self):
    signal.signal(signal.SIGTERM, self._previous)


def train_and_evaluate(config_dict: ml_collections.ConfigDict, workdir: str | Path) -> dict:
  """Trains per `config_dict`, resuming from `workdir` if it holds checkpoints. Returns final metrics."""
  config = resolve(config_dict, num_devices=jax.device_count())  # every check, before anything is built
  loop = config.loop
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  lead = jax.process_index() == 0
  run = build(config)
  task = run.task
  if lead:
    (workdir / "config.json").write_text(to_config_dict(config).to_json_best_effort(indent=2) + "\n")
    task.tokenizer.save(workdir / "tokenizer")  # so the workdir alone can be sampled from
    print(f"devices: {metrics.device_summary()}\nmodel: {task.model_config}")

  ckpt = checkpoints.Checkpointer(workdir / "checkpoints", keep=loop.keep_checkpoints,
                                  async_save=loop.async_checkpointing)
  train_batches = task.train_batches()
  start_step, tokens_seen = 0, 0
  if ckpt.latest_step() is not None:
    step = ckpt.latest_step()
    state, data_state, meta = ckpt.restore(step, abstract_state(run))
    train_batches.set_state(data_state)
    tokens_seen = int(meta.get("tokens_seen", 0))
    start_step = int(state.step)
    print(f"resumed from {ckpt.directory} at step {start_step}")
  else:
    state = init_state(run)
  eval_batches = task.eval_batches()

  # Batches are arrays or dicts of arrays: one sharding is a prefix of either.
  step_fn = jax.jit(functools.partial(train_step, loss_fn=task.loss, tx=run.tx, schedule=run.schedule,
                                      accumulation_steps=config.optimizer.accumulation_steps),
                    in_shardings=(run.state_shardings, task.batch_sharding),
                    out_shardings=(run.state_shardings, None), donate_argnums=0)
  eval_fn = jax.jit(functools.partial(eval_step, loss_fn=task.loss),
                    in_shardings=(run.state_shardings.params, task.batch_sharding))

  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  flops_token = task.flops_per_token(num_params)
  writer = metrics.MetricsWriter(workdir, enabled=lead)
  if start_step:
    writer.write(start_step, {"event": "resumed"})
  preemption = _Preemption()
  last_eval: dict = {}
  final: dict = {}
  steps = loop.num_train_steps
  bar = tqdm(total=steps, initial=start_step, disable=not lead, desc="train", dynamic_ncols=True)
  t_last, steps_since, tokens_since = time.perf_counter(), 0, 0
  try:
    with jax.set_mesh(run.mesh), nn.logical_axis_rules(config.mesh.rules):
      for step in range(start_step, steps):
        host_batch = next(train_batches)
        state, step_metrics = step_fn(state, task.put(host_batch))
        steps_since += 1
        tokens = task.count_tokens(host_batch)
        tokens_since, tokens_seen = tokens_since + tokens, tokens_seen + tokens
        done = step + 1
        if done % loop.log_every_steps == 0 or done == steps:
          step_metrics = jax.device_get(step_metrics)  # waits for the step: timings are real
          elapsed = time.perf_counter() - t_last
          tps = tokens_since / elapsed
          util = metrics.mfu(tps, flops_token, jax.devices())
          record = {**{k: float(v) for k, v in step_metrics.items()}, "tokens_per_s": tps,
                    "step_time_s": elapsed / steps_since, "mfu": util}
          writer.write(done, record)
          bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{tps:,.0f}",
                          mfu="n/a" if util is None else f"{util:.1%}")
          t_last, steps_since, tokens_since = time.perf_counter(), 0, 0
        bar.update(1)
        is_eval = done % loop.eval_every_steps == 0 or done == steps
        if is_eval:
          last_eval = task.evaluate(state.params, eval_fn, eval_batches)
          writer.write(done, last_eval)
          bar.write(f"step {done}: {task.describe(last_eval)}")
          t_last = time.perf_counter()  # evaluation time is not training time
        if done % loop.checkpoint_every_steps == 0 or done == steps or preemption.requested:
          ckpt.save(done, state, train_batches.get_state(), {"tokens_seen": tokens_seen, "task": task.name},
                    val_loss=last_eval.get("val_loss") if is_eval else None, force=preemption.requested)
        if preemption.requested:
          ckpt.wait()
          logging.warning("stopped at step %d after SIGTERM; checkpoint saved", done)
          return {"step": done, "preempted": True, **last_eval}
      bar.close()
      if lead:
        metrics.plot_losses(workdir / "metrics.jsonl", workdir / "loss.png", title=f"{workdir.name} ({task.name})")
      final = task.finish(state.params, workdir)  # e.g. a sample; test BLEU
      if final:
        writer.write(steps, {k: v for k, v in final.items() if not isinstance(v, str)})
  finally:
    bar.close()
    preemption.restore()
    ckpt.close()
    writer.close()
  return {"step": steps, **last_eval, **final}
