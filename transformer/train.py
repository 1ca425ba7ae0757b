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
SIGTERM saves a checkpoint and returns cleanly; a non-finite step is never applied, and stops the
run (or is skipped: config.on_nonfinite); a launch writes nothing into an existing workdir before it
is known to fit it (transformer.workdir). The loop never asks which task it trains.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import signal
import time
from pathlib import Path
from typing import Any, NamedTuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.experimental import multihost_utils
from tqdm import tqdm

from transformer import checkpoints, data, inference, kernels, metrics, optim, sharding, tasks
from transformer import workdir as workdir_files
from transformer.config import LoopConfig, RunConfig
from transformer.errors import ConfigError, TrainingError, WorkdirError


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # raw key data (uint32), so that checkpoints hold plain arrays


# ---------------------------------------------------------------------------------------------
# Pure steps. `loss_fn(params, batch, rng, train) -> (summed loss, number of target tokens)` is the
# task's (see transformer.tasks); a batch is an array or a dict of arrays, batch-major. A task whose
# params include values that each step sets rather than learns (an SAE's firing statistics) returns
# (summed loss, (tokens, {name: value})): those top-level params are set after the update.


def train_step(state: TrainState, batch, *, loss_fn, tx, schedule, accumulation_steps: int):
  """One optimizer update on the mean loss per target token. The batch is split into
  `accumulation_steps` microbatches (a scan, so memory is that of one microbatch) whose summed
  losses and gradients are divided by the batch's total tokens: every token weighs the same."""
  rng = jax.random.wrap_key_data(state.rng)
  rng, step_rng = jax.random.split(rng)
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  set_params = {}
  if accumulation_steps == 1:
    (loss_sum, tokens), grads = grad_fn(state.params, batch, step_rng, True)
    if isinstance(tokens, tuple):
      tokens, set_params = tokens
  else:
    micro = jax.tree.map(lambda x: x.reshape(accumulation_steps, -1, *x.shape[1:]), batch)

    def accumulate(carry, xs):
      loss_sum, tokens, grad_sum = carry
      micro_batch, i = xs
      (loss, n), grads = grad_fn(state.params, micro_batch, jax.random.fold_in(step_rng, i), True)
      return (loss_sum + loss, tokens + n, jax.tree.map(jnp.add, grad_sum, grads)), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    (loss_sum, tokens, grads), _ = jax.lax.scan(
      accumulate, (jnp.zeros(()), jnp.zeros(()), zeros), (micro, jnp.arange(accumulation_steps))
    )
  tokens = jnp.maximum(tokens, 1.0)
  grads = jax.tree.map(lambda g: g / tokens, grads)
  loss, grad_norm = loss_sum / tokens, optax.tree.norm(grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  if set_params:
    params = {**params, **set_params}
  # A step whose loss or gradients are not finite is not applied (the step and the RNG advance, the
  # batch is consumed): the state stays the last finite one, whatever the host decides when it reads
  # `finite` (see _NonFiniteGuard). The norm is finite only if every gradient is, and an update of
  # finite gradients is bounded (AdamW: about lr per coordinate), so the new params are finite too.
  # Known before the update, `finite` selects inside the update's one fused pass over params and
  # moments; checking the new params would take two more passes over them.
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  params, opt_state = jax.tree.map(
    lambda new, old: jnp.where(finite, new, old), (params, opt_state), (state.params, state.opt_state)
  )
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, rng=jax.random.key_data(rng))
  return new_state, {"loss": loss, "grad_norm": grad_norm, "lr": schedule(state.step), "finite": finite}


def train_steps(state: TrainState, batches, **step):
  """`train_step` on each of a stack of batches (leading axis: the steps), as one lax.scan: several
  updates in one compiled call (config.steps_per_call). Returns the state and each step's metrics."""
  return jax.lax.scan(lambda s, batch: train_step(s, batch, **step), state, batches)


def eval_step(params, batch, *, loss_fn):
  """(summed loss, number of target tokens) without dropout."""
  loss_sum, tokens = loss_fn(params, batch, jax.random.key(0), False)
  return loss_sum, tokens[0] if isinstance(tokens, tuple) else tokens


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


def build(run_config: RunConfig, task_data=None) -> Run:
  """The run of `run_config` on this machine's devices; `task_data` is the task's `load_data(run_config)`
  (loaded here when not given)."""
  task_cls = tasks.get(run_config.task)
  task_data = task_data or tasks.load_data(run_config, inference.load)
  mesh = sharding.make_mesh(run_config.mesh.shape)
  task = task_cls(run_config, task_data.tokenizer, mesh, task_data)
  rules, steps = run_config.mesh.rules, run_config.loop.num_train_steps
  boxed, param_sh = sharding.param_shardings(task.model, task.init_inputs(), mesh, rules)
  axis_names = jax.tree.map(lambda x: getattr(x, "names", ()), boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  tx = optim.make_optimizer(run_config.optimizer, steps, update_scale=task.update_scale(), axis_names=axis_names)
  schedule = optim.learning_rate(run_config.optimizer, steps)
  sharding.check_divisible(nn.unbox(boxed), param_sh)  # outside the rules: no constraints on shapes
  opt_shapes = jax.eval_shape(tx.init, nn.unbox(boxed))
  repl = sharding.replicated(mesh)
  # Optimizer state is sharded like the params it tracks (Adam's mu/nu, Muon's momentum), scalars replicated.
  opt_sh = sharding.optimizer_state_shardings(opt_shapes, nn.unbox(boxed), param_sh, mesh)
  state_sh = TrainState(step=repl, params=param_sh, opt_state=opt_sh, rng=repl)
  return Run(run_config, task, mesh, tx, schedule, state_sh)


def jit_steps(run: Run, compiler_options: dict | None = None, one_step: bool = False):
  """The sharded, jit-compiled (train step, eval step) of `run`: what the loop calls, and what
  transformer.plan compiles ahead of time. The train step donates the state it is given; with
  config.steps_per_call > 1 it is `train_steps`, over a stack of that many batches (unless `one_step`:
  a plan's FLOPs and memory are one step's).
  `compiler_options`: XLA's, for the train step (launch.bench's accelerator check tries some)."""
  task, many = run.task, run.config.loop.steps_per_call > 1 and not one_step
  # Batches are arrays or dicts of arrays: one sharding is a prefix of either. A stack of batches
  # (steps_per_call) keeps the sharding each batch was put with.
  step_fn = jax.jit(
    functools.partial(
      train_steps if many else train_step,
      loss_fn=task.loss,
      tx=run.tx,
      schedule=run.schedule,
      accumulation_steps=run.config.optimizer.accumulation_steps,
    ),
    in_shardings=(run.state_shardings, None if many else task.batch_sharding),
    out_shardings=(run.state_shardings, None),
    donate_argnums=0,
    compiler_options=compiler_options,
  )
  eval_fn = jax.jit(
    functools.partial(eval_step, loss_fn=task.loss), in_shardings=(run.state_shardings.params, task.batch_sharding)
  )
  return step_fn, eval_fn


def _init_fn(run: Run):
  def init(seed):
    init_rng, train_rng = jax.random.split(jax.random.key(seed))
    params = nn.unbox(run.task.model.init(init_rng, *run.task.init_inputs())["params"])
    return TrainState(
      step=jnp.zeros((), jnp.int32), params=params, opt_state=run.tx.init(params), rng=jax.random.key_data(train_rng)
    )

  return init


def init_state(run: Run) -> TrainState:
  # The seed a constant of the program, not an argument: XLA folds the key's derivation, a smaller program
  # to compile that gives the same values.
  with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.config.mesh.rules):
    return jax.jit(_init_fn(run), static_argnums=0, out_shardings=run.state_shardings)(run.config.loop.seed)


def abstract_state(run: Run) -> TrainState:
  """The state's shapes, dtypes and shardings: the target Orbax restores into."""
  shapes = jax.eval_shape(_init_fn(run), run.config.loop.seed)
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, run.state_shardings)


# ---------------------------------------------------------------------------------------------
# The loop.


class _Preemption:
  """SIGTERM -> finish the current step, save a checkpoint, return normally (exit status 0). During an
  evaluation (which can take long: BLEU decodes), the evaluation is abandoned at once instead; the
  checkpoint says so, and the next launch evaluates that step before it trains on."""

  class Interrupted(BaseException):
    """A BaseException, as KeyboardInterrupt is: libraries' `except Exception` blocks (jax's persistent
    compilation cache reads, for one) must not swallow it and let the evaluation run on."""

  def __init__(self):
    self.requested = False
    self._evaluating = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    logging.warning("SIGTERM: saving a checkpoint after this step, then stopping")
    self.requested = True
    if self._evaluating:
      self._evaluating = False
      raise self.Interrupted()  # unwinds the evaluation only: it changes no state

  @contextlib.contextmanager
  def interruptible(self):
    if self.requested:
      raise self.Interrupted()
    self._evaluating = True
    try:
      yield
    finally:
      self._evaluating = False
    if self.requested:  # the signal came, but something swallowed what the handler raised
      raise self.Interrupted()

  def restore(self):
    signal.signal(signal.SIGTERM, self._previous)


class _Reported(NamedTuple):
  """What a step reported that the host has not read yet (on the device until `check` reads it)."""

  step: int
  finite: jax.Array
  loss: jax.Array
  grad_norm: jax.Array
  position: dict  # the data position of the step's batch


class _NonFiniteGuard:
  """The host side of the non-finite check. Each step reports `finite` on the device; the host reads
  the flags only where it waits for the device anyway (logging, evaluation, checkpoints), so there is
  no extra sync per step, and always before saving, so no checkpoint follows a step it has not read.
  The step itself never applies a non-finite update (train_step): the policy only decides whether
  training goes on."""

  def __init__(self, loop: LoopConfig, writer: metrics.MetricsWriter, ckpt: checkpoints.Checkpointer):
    self.loop, self.writer, self.ckpt = loop, writer, ckpt
    self.pending: list[_Reported] = []
    self.in_a_row = 0

  def add(self, step: int, step_metrics: dict, position: dict) -> None:
    self.pending.append(
      _Reported(step, step_metrics["finite"], step_metrics["loss"], step_metrics["grad_norm"], position)
    )

  def check(self) -> None:
    read = jax.device_get([(p.finite, p.loss, p.grad_norm) for p in self.pending])
    for (step, *_, position), (finite, loss, grad_norm) in zip(self.pending, read):
      if finite:
        self.in_a_row = 0
        continue
      self.in_a_row += 1
      what = (
        f"step {step} was not finite (loss {float(loss)}, gradient norm {float(grad_norm)}, or the new "
        f"params); its update was not applied"
      )
      batch = f"its batch was training batch {step} of the run (data position {position})"
      if self.loop.on_nonfinite == "skip" and self.in_a_row <= self.loop.max_consecutive_skips:
        self.writer.write(
          step,
          {
            "event": "nonfinite step skipped",
            "loss": float(loss),
            "grad_norm": float(grad_norm),
            "data_position": position,
          },
        )
        logging.warning("%s (skipped, %d in a row); %s", what, self.in_a_row, batch)
        continue
      self.writer.write(
        step,
        {"event": "stopped: nonfinite", "loss": float(loss), "grad_norm": float(grad_norm), "data_position": position},
      )
      self.ckpt.wait()  # a save in flight is of a good state: let it commit, then name it
      latest = self.ckpt.latest_step()
      kept = f"the latest checkpoint, step {latest}, is the last good state" if latest else "no checkpoint was saved"
      if self.loop.on_nonfinite == "skip":
        raise TrainingError(
          f"{self.in_a_row} steps in a row were not finite, more than --config.max_consecutive_skips="
          f"{self.loop.max_consecutive_skips}; the last: {what}; {batch}. Stopped: {kept}. Lower "
          f"--config.optimizer.lr or clip gradients (--config.optimizer.grad_clip_norm)"
        )
      raise TrainingError(
        f"{what}; {batch}. Stopped: {kept}. Lower --config.optimizer.lr or clip gradients "
        f"(--config.optimizer.grad_clip_norm), or skip such steps with --config.on_nonfinite=skip"
      )
    self.pending.clear()


def _lock(workdir: Path, lead: bool) -> workdir_files.Lock | None:
  """Process 0 takes the workdir's lock; in a multi-process run every process learns whether it could."""
  lock, error = None, None
  if lead:
    lock = workdir_files.Lock(workdir)
    try:
      with workdir_files.writable(workdir, "create the lock in"):
        workdir.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except WorkdirError as e:
      error = e
  if jax.process_count() > 1:
    failed = int(multihost_utils.broadcast_one_to_all(np.int32(error is not None)))
    if failed and error is None:
      raise WorkdirError(f"process 0 could not take the lock of {workdir} (its error says why)")
  if error is not None:
    raise error
  return lock


def train_and_evaluate(config_dict: ml_collections.ConfigDict, workdir: str | Path) -> dict:
  """Trains per `config_dict`, resuming from `workdir` if it holds checkpoints. Returns final metrics.

  Nothing in an existing workdir is written before the launch is known to fit it (the lock, the
  saved config and data, the checkpoints' shapes: transformer.workdir)."""
  config = tasks.resolve(config_dict, num_devices=jax.device_count())  # every check, before anything is built
  workdir = Path(workdir)
  lead = jax.process_index() == 0
  with data.removed_if_left_empty(workdir):  # a launch refused (bad data, say) leaves no new directory
    lock = _lock(workdir, lead)
    try:
      return _train(config, workdir, lead)
    finally:
      if lock is not None:
        lock.release()


def _train(config: RunConfig, workdir: Path, lead: bool) -> dict:
  """One launch on `workdir`: its checks, the run restored or initialised, the steps, the end."""
  changes = workdir_files.check_config(workdir, config, inference.saved_run(workdir))
  task_data = tasks.load_data(config, inference.load)  # prepared again if its files changed (sha256)
  fingerprint = task_data.fingerprint if isinstance(task_data, data.Prepared) else None
  workdir_files.check_data(workdir, fingerprint)
  run = build(config, task_data)
  task = run.task
  if lead:
    print(f"devices: {metrics.device_summary()}\nmodel: {task.model_config}\n{kernels.describe(config.model.kernels)}")
    if changes:
      print(f"resuming with changes: {'; '.join(changes)}")
  ckpt = checkpoints.Checkpointer(
    workdir / workdir_files.CHECKPOINTS,
    keep=config.loop.keep_checkpoints,
    async_save=config.loop.async_checkpointing,
    best=task.best_metric,
  )
  train_batches = task.train_batches()
  state, progress = _restore_or_init(run, ckpt, train_batches)
  if progress.step % config.loop.steps_per_call:  # a checkpoint saved under another steps_per_call
    raise ConfigError(
      f"this run resumes at step {progress.step}, not a multiple of --config.steps_per_call="
      f"{config.loop.steps_per_call}; resume with one that divides it (1 always does), change it later"
    )
  if lead:  # the launch fits the workdir: now it may write
    workdir_files.record_run(workdir, config, task.tokenizer, fingerprint, task.labels)
    with workdir_files.writable(workdir):
      task.save_files(workdir)
  loop = _Loop(run, workdir, lead, ckpt, train_batches, state, progress)
  try:
    with jax.set_mesh(run.mesh), nn.logical_axis_rules(config.mesh.rules):
      if not progress.evaluated and not loop.evaluate(progress.step):  # the last launch was stopped during it
        return {"step": progress.step, "preempted": True}  # stopped again: its checkpoint still says so
      if loop.train():
        return {"step": loop.progress.step, "preempted": True, **loop.last_eval}
      return {"step": config.loop.num_train_steps, **loop.last_eval, **loop.finish()}
  finally:
    loop.close()


@dataclasses.dataclass
class _Progress:
  """Where a run stands: saved with each checkpoint (as its metadata), restored on resume."""

  step: int = 0
  tokens_seen: int = 0
  evaluated: bool = True  # the state at `step` was evaluated (SIGTERM may have stopped its evaluation)
  train_seconds: float = 0.0  # training time so far, all launches: steps and compiles, not evaluations


def _restore_or_init(run: Run, ckpt: checkpoints.Checkpointer, train_batches) -> tuple[TrainState, _Progress]:
  """The workdir's latest checkpoint (the state, the data position, the progress), or a new state
  (with the task's pretrained params, e.g. config.init_from)."""
  restored = ckpt.restore_latest(abstract_state(run))
  if restored is None:
    state = init_state(run)
    params = run.task.init_params(state.params, inference.restore)
    if params is not state.params:
      state = state.replace(params=jax.device_put(params, run.state_shardings.params))
    return state, _Progress()
  _, state, data_state, meta = restored
  train_batches.set_state(data_state)
  print(f"resumed from {ckpt.directory} at step {int(state.step)}")
  return state, _Progress(
    step=int(state.step),
    tokens_seen=int(meta.get("tokens_seen", 0)),
    evaluated=meta.get("evaluated", True),
    train_seconds=float(meta.get("train_seconds", 0.0)),
  )


@dataclasses.dataclass
class _Window:
  """The training steps since the last log line: when they started, how many, how many tokens."""

  start: float = dataclasses.field(default_factory=time.perf_counter)
  steps: int = 0
  tokens: int = 0

  def restart_clock(self) -> None:
    """Time spent since (an evaluation) is not training time: the window's clock restarts, its counts stay."""
    self.start = time.perf_counter()


class _Loop:
  """One launch's steps from `progress.step` on: logging, evaluation, checkpoints, SIGTERM, the end.
  Runs inside the run's mesh and logical axis rules."""

  def __init__(self, run: Run, workdir: Path, lead: bool, ckpt, train_batches, state, progress: _Progress):
    self.run, self.task, self.workdir, self.lead, self.ckpt = run, run.task, workdir, lead, ckpt
    self.train_batches, self.state, self.progress = train_batches, state, progress
    self.eval_batches = self.task.eval_batches()
    self.step_fn, self.eval_fn = jit_steps(run)
    self.flops_token = self.task.flops_per_token(sum(x.size for x in jax.tree.leaves(state.params)))
    self.writer = metrics.MetricsWriter(workdir, enabled=lead)
    self.guard = _NonFiniteGuard(run.config.loop, self.writer, ckpt)
    self.writer.write(progress.step, {"event": "resumed" if progress.step else "started", **_launch_record(run.config)})
    self.preemption = _Preemption()
    self.last_eval: dict = {}
    steps = run.config.loop.num_train_steps
    self.bar = tqdm(total=steps, initial=progress.step, disable=not lead, desc="train", dynamic_ncols=True)
    # The steps since the last log line; the batch shapes compiled (bucketed batches make several).
    self.since, self.batch_shapes = _Window(), set()

  def train(self) -> bool:
    """The steps to config.num_train_steps; True if SIGTERM stopped them (a checkpoint is saved)."""
    loop, progress = self.run.config.loop, self.progress
    n = loop.steps_per_call
    for step in range(progress.step, loop.num_train_steps, n):
      position = self.train_batches.get_state()
      host_batches = [next(self.train_batches) for _ in range(n)]
      if n == 1:
        self.state, step_metrics = self.step_fn(self.state, self.task.put(host_batches[0]))
      else:  # the call's steps, stacked; its last step's metrics (finite: all of them)
        self.state, steps_metrics = self.step_fn(self.state, _stacked([self.task.put(b) for b in host_batches]))
        step_metrics = {**jax.tree.map(lambda x: x[-1], steps_metrics), "finite": steps_metrics["finite"].all()}
      self.batch_shapes.add(tuple(np.shape(x) for x in jax.tree.leaves(host_batches[0])))
      progress.step = done = step + n
      self.guard.add(done, step_metrics, position)
      tokens = sum(self.task.count_tokens(b) for b in host_batches)
      progress.tokens_seen += tokens
      self.since.steps, self.since.tokens = self.since.steps + n, self.since.tokens + tokens
      if done % loop.log_every_steps == 0 or done == loop.num_train_steps:
        self.log(done, step_metrics)
      self.bar.update(n)
      is_eval = done % loop.eval_every_steps == 0 or done == loop.num_train_steps
      progress.evaluated = True
      if is_eval:
        self.guard.check()
        progress.evaluated = self.evaluate(done)
        self.since.restart_clock()  # evaluation time is not training time
      if done % loop.checkpoint_every_steps == 0 or done == loop.num_train_steps or self.preemption.requested:
        self.save(done, is_eval)
      if self.preemption.requested:
        self.ckpt.wait()
        logging.warning("stopped at step %d after SIGTERM; checkpoint saved", done)
        return True
    return False

  def log(self, done: int, step_metrics) -> None:
    """One metrics record of the steps since the last: the step's metrics, speed, MFU."""
    self.guard.check()  # waits for the step: timings are real
    step_metrics = jax.device_get(step_metrics)
    steps, tokens = self.since.steps, self.since.tokens
    elapsed = time.perf_counter() - self.since.start
    self.progress.train_seconds += elapsed
    util = metrics.mfu(tokens / elapsed, self.flops_token, jax.devices())
    record = {
      **{k: float(v) for k, v in step_metrics.items() if k != "finite"},
      "tokens_per_s": tokens / elapsed,
      "step_time_s": elapsed / steps,
      "mfu": util,
      "train_step_compiles": len(self.batch_shapes),
      "train_time_s": self.progress.train_seconds,
    }
    self.writer.write(done, record)
    mfu = "n/a" if util is None else f"{util:.1%}"
    self.bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:,.0f}", mfu=mfu)
    self.since = _Window()

  def evaluate(self, step: int) -> bool:
    """Evaluates the state after `step` into `last_eval`; False if SIGTERM interrupted it."""
    try:
      with self.preemption.interruptible():
        self.last_eval = self.task.evaluate(self.state.params, self.eval_fn, self.eval_batches)
    except _Preemption.Interrupted:
      self.writer.write(step, {"event": "evaluation interrupted by SIGTERM"})
      logging.warning("SIGTERM during the evaluation of step %d: abandoned it (the next launch redoes it)", step)
      return False
    self.writer.write(step, {**self.last_eval, "train_time_s": self.progress.train_seconds})
    self.bar.write(f"step {step}: {self.task.describe(self.last_eval)}")
    return True

  def save(self, done: int, is_eval: bool) -> None:
    self.guard.check()  # never save after a step whose flag was not read
    progress = self.progress
    self.ckpt.save(
      done,
      self.state,
      self.train_batches.get_state(),
      {
        "tokens_seen": progress.tokens_seen,
        "task": self.task.name,
        "evaluated": progress.evaluated,
        "train_seconds": progress.train_seconds,
      },
      metrics=self.last_eval if is_eval and progress.evaluated else None,
      force=self.preemption.requested,
    )

  def finish(self) -> dict:
    """After the last step: the loss plot, then the task's final output (a sample, test scores) from
    the final params or, for a task that scores its best checkpoint, that one's."""
    self.bar.close()
    steps, task, workdir = self.run.config.loop.num_train_steps, self.task, self.workdir
    if self.lead:
      title = f"{workdir.name} ({task.name})"
      metrics.plot_losses(workdir / "metrics.jsonl", workdir / "loss.png", title=title, curves=task.curves)
    self.ckpt.wait()  # the final checkpoint is on disk: a task may read it (checkpoint averaging)
    params, best = self.state.params, self.ckpt.best_step() if task.finish_with_best else None
    if best is not None and best != steps:  # early stopping: the best checkpoint is the one scored
      like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)
      params = self.ckpt.restore_params(best, like)
      if self.lead:
        print(f"final scores: the best checkpoint by {task.best_metric[0]}, step {best} of {steps}")
    final = task.finish(params, workdir, lambda count: inference.mean_of_last(workdir, count, self.state.params))
    if best is not None:
      final = {"best_step": best, **final}
    if final:
      self.writer.write(steps, {k: v for k, v in final.items() if not isinstance(v, str)})
    return final

  def close(self) -> None:
    self.bar.close()
    self.preemption.restore()
    self.ckpt.close()
    self.writer.close()


@jax.jit
def _stacked(batches: list):
  """Batches (each a global array or dict of them) -> one, with a leading axis of steps."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *batches)


def _launch_record(config: RunConfig) -> dict:
  """What metrics.jsonl records of each launch: the fast forms its model runs (transformer.kernels)."""
  return {"kernels": kernels.resolve(config.model.kernels), "config_kernels": config.model.kernels}
