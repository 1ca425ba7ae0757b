"""Training: the pure train/eval steps and `train_and_evaluate(config, workdir)`.

    from experiments import shakespeare
    from transformer.train import train_and_evaluate
    train_and_evaluate(shakespeare.get_config("char"), "workdirs/char")   # what launch/train.py does

The loop: prepare the data set if needed -> build mesh, model and optimizer -> restore the latest
checkpoint of the workdir (state, data position, RNG) or initialise -> jit-compiled sharded steps
with periodic evaluation, async Orbax checkpoints and metrics -> final evaluation, a generated
sample and a loss plot. SIGTERM saves a checkpoint and returns cleanly.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import signal
import time
from pathlib import Path
from typing import Any

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

from transformer import checkpoints, data, decode, metrics, optim, sharding
from transformer.data import pipeline
from transformer.layers import ConfigError
from transformer.models.gpt import GPT, GPTConfig
from transformer.tokenizers import load_tokenizer


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # raw key data (uint32), so that checkpoints hold plain arrays


# ---------------------------------------------------------------------------------------------
# Pure steps.


def lm_loss(params, model: nn.Module, batch_BxL1: jax.Array, dropout_rng, deterministic: bool):
  """Mean next-token cross-entropy of a batch of (seq_len + 1)-token examples."""
  inputs_BxL, targets_BxL = batch_BxL1[:, :-1], batch_BxL1[:, 1:]
  logits_BxLxV = model.apply({"params": params}, inputs_BxL, deterministic=deterministic,
                             rngs={"dropout": dropout_rng})
  return optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, targets_BxL).mean()


def train_step(state: TrainState, batch_BxL1: jax.Array, *, model, tx, schedule, accumulation_steps: int):
  """One optimizer update; the batch is split into `accumulation_steps` microbatches whose gradients
  are averaged (a scan, so memory is that of one microbatch)."""
  rng = jax.random.wrap_key_data(state.rng)
  rng, step_rng = jax.random.split(rng)
  grad_fn = jax.value_and_grad(lm_loss)
  if accumulation_steps == 1:
    loss, grads = grad_fn(state.params, model, batch_BxL1, step_rng, False)
  else:
    micro_AxMxL1 = batch_BxL1.reshape(accumulation_steps, -1, batch_BxL1.shape[-1])

    def accumulate(carry, xs):
      loss_sum, grad_sum = carry
      micro_MxL1, i = xs
      loss, grads = grad_fn(state.params, model, micro_MxL1, jax.random.fold_in(step_rng, i), False)
      return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    (loss, grads), _ = jax.lax.scan(accumulate, (jnp.zeros(()), zeros),
                                    (micro_AxMxL1, jnp.arange(accumulation_steps)))
    loss, grads = loss / accumulation_steps, jax.tree.map(lambda g: g / accumulation_steps, grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                            rng=jax.random.key_data(rng))
  return new_state, {"loss": loss, "grad_norm": optax.tree.norm(grads), "lr": schedule(state.step)}


def eval_step(params, batch_BxL1, *, model):
  return lm_loss(params, model, batch_BxL1, jax.random.key(0), True)


# ---------------------------------------------------------------------------------------------
# Config -> pieces.


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> GPTConfig:
  fields = {f.name for f in dataclasses.fields(GPTConfig)}
  given = dict(config.model)
  unknown = set(given) - fields
  if unknown:
    raise ConfigError(f"unknown config.model field(s) {sorted(unknown)}; GPT fields are {sorted(fields)}")
  if not given.get("vocab_size"):
    given["vocab_size"] = vocab_size
  elif given["vocab_size"] < vocab_size:
    raise ConfigError(f"config.model.vocab_size={given['vocab_size']} is smaller than the tokenizer's "
                      f"{vocab_size}; set it to 0 (take the tokenizer's) or at least {vocab_size}")
  return GPTConfig(**given).check()


def check_config(config, cfg: GPTConfig, mesh) -> None:
  rules = sharding.rules(config)
  dp = sharding.data_parallel_size(mesh, rules)
  accum = int(config.optimizer.accumulation_steps)
  if config.seq_len > cfg.context_length:
    raise ConfigError(f"seq_len={config.seq_len} is longer than model.context_length={cfg.context_length}; "
                      f"lower --config.seq_len or raise --config.model.context_length")
  if accum < 1 or config.batch_size % accum:
    raise ConfigError(f"batch_size={config.batch_size} is not divisible by optimizer.accumulation_steps={accum}")
  if (config.batch_size // accum) % dp:
    raise ConfigError(f"batch_size={config.batch_size} (microbatch {config.batch_size // accum}) is not "
                      f"divisible by the data-parallel size {dp} (mesh data*fsdp); use a multiple of {dp}")
  if config.eval_batch_size % dp:
    raise ConfigError(f"eval_batch_size={config.eval_batch_size} is not divisible by the data-parallel "
                      f"size {dp}; use a multiple of {dp}")
  for name in ("num_train_steps", "eval_every_steps", "checkpoint_every_steps", "log_every_steps"):
    if int(config[name]) <= 0:
      raise ConfigError(f"{name} must be positive, got {config[name]}")


def prepared_data(config) -> data.Prepared:
  """The config's data set, prepared now if it has not been (one command does it all)."""
  d = config.data
  if d.input_files:
    source = data.file_source(list(d.input_files), "text")
  else:
    source = data.named_source(d.dataset)
  options = data.PrepareOptions(tokenizer=d.tokenizer, vocab_size=d.vocab_size or None, seed=d.split_seed,
                                validation_fraction=d.validation_fraction, piece_chars=d.piece_chars)
  directory = Path(d.dir) if d.get("dir") else data.default_dir(source, options, root=d.root)
  manifest = directory / "manifest.json"
  stale = not manifest.exists() or json.loads(manifest.read_text()).get("request", {}).get("options") != dataclasses.asdict(options)
  if stale and jax.process_index() == 0:  # one writer; the other processes wait for it below
    logging.info("preparing %s into %s", source.name, directory)
    data.prepare(source, directory, options, overwrite=manifest.exists())
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"prepared {directory}")
  return data.load_prepared(directory)


@dataclasses.dataclass
class Run:
  """Everything built from the config that the loop, evaluation and sampling share."""
  config: ml_collections.ConfigDict
  prepared: data.Prepared
  model_cfg: GPTConfig
  model: GPT
  mesh: Any
  rules: tuple
  tx: optax.GradientTransformation
  schedule: Any
  state_shardings: TrainState
  batch_sharding: Any


def build(config) -> Run:
  prepared = prepared_data(config)
  cfg = model_config(config, prepared.tokenizer.vocab_size)
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.rules(config)
  check_config(config, cfg, mesh)
  model = GPT(cfg)
  tx = optim.make_optimizer(config.optimizer, config.num_train_steps)
  schedule = optim.learning_rate(config.optimizer, config.num_train_steps)
  dummy = jnp.zeros((1, config.seq_len), jnp.int32)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), dummy)["params"])
    param_sh = sharding.logical_shardings(mesh, boxed, rules)
    opt_shapes = jax.eval_shape(lambda: tx.init(nn.unbox(model.init(jax.random.key(0), dummy)["params"])))
  sharding.check_divisible(nn.unbox(boxed), param_sh)  # outside the rules: no constraints on shapes
  repl = sharding.replicated(mesh)
  # Optimizer state is sharded like the params it tracks (Adam's mu/nu), scalars replicated.
  opt_sh = optax.tree_map_params(tx, lambda _, s: s, opt_shapes, param_sh,
                                 transform_non_params=lambda _: repl,
                                 is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
  state_sh = TrainState(step=repl, params=param_sh, opt_state=opt_sh, rng=repl)
  return Run(config, prepared, cfg, model, mesh, rules, tx, schedule, state_sh,
             sharding.batch_sharding(mesh, rules))


def _init_fn(run: Run):
  dummy = jnp.zeros((1, run.config.seq_len), jnp.int32)

  def init(seed):
    init_rng, train_rng = jax.random.split(jax.random.key(seed))
    params = nn.unbox(run.model.init(init_rng, dummy)["params"])
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=run.tx.init(params),
                      rng=jax.random.key_data(train_rng))
  return init


def init_state(run: Run) -> TrainState:
  with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
    return jax.jit(_init_fn(run), out_shardings=run.state_shardings)(run.config.seed)


def abstract_state(run: Run) -> TrainState:
  """The state's shapes, dtypes and shardings: the target Orbax restores into."""
  shapes = jax.eval_shape(_init_fn(run), run.config.seed)
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


def evaluate(run: Run, params, eval_fn, eval_batches) -> dict:
  # Every process holds the same fixed batches; each puts in the shards its devices own.
  global_batch = lambda b: jax.make_array_from_callback(b.shape, run.batch_sharding, lambda idx: b[idx])
  losses = [float(eval_fn(params, global_batch(b))) for b in eval_batches]
  loss = float(np.mean(losses))
  return {"val_loss": loss, "val_perplexity": float(np.exp(min(loss, 50.0)))}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
  """Trains per `config`, resuming from `workdir` if it holds checkpoints. Returns final metrics."""
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  lead = jax.process_index() == 0
  run = build(config)
  if lead:
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2) + "\n")
    run.prepared.tokenizer.save(workdir / "tokenizer")  # so the workdir alone can be sampled from
    print(f"devices: {metrics.device_summary()}\nmodel: {run.model_cfg}")

  ckpt = checkpoints.Checkpointer(workdir / "checkpoints", keep=config.keep_checkpoints,
                                  async_save=config.async_checkpointing)
  train_ds = pipeline.lm_train_dataset(run.prepared, seq_len=config.seq_len, global_batch=config.batch_size,
                                       seed=config.seed, sampling=config.data.sampling,
                                       process_index=jax.process_index(), process_count=jax.process_count())
  train_iter = iter(train_ds.to_iter_dataset())
  start_step = 0
  if ckpt.latest_step() is not None:
    step = ckpt.latest_step()
    state, data_state, _ = ckpt.restore(step, abstract_state(run))
    train_iter.set_state(data_state)
    start_step = int(state.step)
    print(f"resumed from {ckpt.directory} at step {start_step}")
  else:
    state = init_state(run)
  eval_batches = pipeline.lm_eval_batches(run.prepared, seq_len=config.seq_len, batch_size=config.eval_batch_size,
                                          num_batches=config.eval_batches)

  step_fn = jax.jit(functools.partial(train_step, model=run.model, tx=run.tx, schedule=run.schedule,
                                      accumulation_steps=int(config.optimizer.accumulation_steps)),
                    in_shardings=(run.state_shardings, run.batch_sharding),
                    out_shardings=(run.state_shardings, None), donate_argnums=0)
  eval_fn = jax.jit(functools.partial(eval_step, model=run.model),
                    in_shardings=(run.state_shardings.params, run.batch_sharding))

  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  flops_token = metrics.flops_per_token(num_params, run.model_cfg.num_layers, run.model_cfg.d_model,
                                        config.seq_len)
  writer = metrics.MetricsWriter(workdir, enabled=lead)
  if start_step:
    writer.write(start_step, {"event": "resumed"})
  preemption = _Preemption()
  tokens_per_step = config.batch_size * config.seq_len
  last_eval: dict = {}
  bar = tqdm(total=config.num_train_steps, initial=start_step, disable=not lead, desc="train",
             dynamic_ncols=True)
  t_last, steps_since = time.perf_counter(), 0
  try:
    with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
      for step in range(start_step, config.num_train_steps):
        local = next(train_iter)
        batch = jax.make_array_from_process_local_data(run.batch_sharding, local)
        state, step_metrics = step_fn(state, batch)
        steps_since += 1
        done = step + 1
        if done % config.log_every_steps == 0 or done == config.num_train_steps:
          step_metrics = jax.device_get(step_metrics)  # waits for the step: timings are real
          elapsed = time.perf_counter() - t_last
          tps = steps_since * tokens_per_step / elapsed
          util = metrics.mfu(tps, flops_token, jax.devices())
          record = {**{k: float(v) for k, v in step_metrics.items()}, "tokens_per_s": tps,
                    "step_time_s": elapsed / steps_since, "mfu": util}
          writer.write(done, record)
          bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{tps:,.0f}",
                          mfu="n/a" if util is None else f"{util:.1%}")
          t_last, steps_since = time.perf_counter(), 0
        bar.update(1)
        is_eval = done % config.eval_every_steps == 0 or done == config.num_train_steps
        if is_eval:
          last_eval = evaluate(run, state.params, eval_fn, eval_batches)
          writer.write(done, last_eval)
          bar.write(f"step {done}: validation loss {last_eval['val_loss']:.4f} "
                    f"(perplexity {last_eval['val_perplexity']:.2f})")
        if done % config.checkpoint_every_steps == 0 or done == config.num_train_steps or preemption.requested:
          ckpt.save(done, state, train_iter.get_state(), {"tokens_seen": done * tokens_per_step},
                    val_loss=last_eval.get("val_loss") if is_eval else None, force=preemption.requested)
        if preemption.requested:
          ckpt.wait()
          logging.warning("stopped at step %d after SIGTERM; checkpoint saved", done)
          return {"step": done, "preempted": True, **last_eval}
  finally:
    bar.close()
    preemption.restore()
    ckpt.close()
    writer.close()

  result = {"step": config.num_train_steps, **last_eval}
  if lead:
    metrics.plot_losses(workdir / "metrics.jsonl", workdir / "loss.png",
                        title=f"{run.prepared.manifest['source']}, {run.model_cfg.num_layers}x{run.model_cfg.d_model}")
    if config.sample.max_new_tokens > 0:
      text = sample_text(run, state.params, config.sample)
      (workdir / "samples.txt").write_text(text + "\n")
      print(f"\n--- sample (temperature {config.sample.temperature}) ---\n{text}\n---")
      result["sample"] = text
  return result


@dataclasses.dataclass
class Trained:
  """A trained model restored from a workdir: what sampling and evaluation need, no optimizer."""
  model: GPT
  params: Any
  tokenizer: Any
  mesh: Any
  rules: tuple
  step: int


def restore_trained(workdir: str | Path, step: str | int = "latest") -> Trained:
  """The params of a workdir's checkpoint `step` ("latest", "best" by validation loss, or a number),
  sharded over this machine's devices with the run's logical axis rules."""
  workdir = Path(workdir)
  files = {"config": workdir / "config.json", "tokenizer": workdir / "tokenizer",
           "checkpoints": workdir / "checkpoints"}
  missing = [str(p) for p in files.values() if not p.exists()]
  if missing:
    raise checkpoints.CheckpointError(f"{workdir} is not a training workdir: looked for {', '.join(missing)} "
                                      f"(launch.train writes them); check the --workdir path")
  config = ml_collections.ConfigDict(json.loads(files["config"].read_text()))
  tokenizer = load_tokenizer(files["tokenizer"])
  cfg = model_config(config, tokenizer.vocab_size)
  rules = sharding.rules(config)
  try:
    mesh = sharding.make_mesh(config.mesh)
  except ConfigError:  # trained on another number of devices: data-parallel over these
    mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  model = GPT(cfg)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"])
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), nn.unbox(boxed),
                          sharding.logical_shardings(mesh, boxed, rules))
  ckpt = checkpoints.Checkpointer(files["checkpoints"], async_save=False)
  try:
    if step in ("latest", "best"):
      chosen = ckpt.latest_step() if step == "latest" else ckpt.best_step()
    elif str(step).isdigit():
      chosen = int(step)
    else:
      raise checkpoints.CheckpointError(f"step must be 'latest', 'best' or a step number, got {step!r}")
    if chosen is None:
      what = "checkpoints" if step == "latest" else "checkpoint with a validation loss"
      raise checkpoints.CheckpointError(f"no {what} in {files['checkpoints']}; train longer or pass --step")
    params = ckpt.restore_params(chosen, abstract)
  finally:
    ckpt.close()
  return Trained(model, params, tokenizer, mesh, rules, chosen)


def sample_text(run: Run, params, sample_config) -> str:
  tok = run.prepared.tokenizer
  prompt = tok.encode(sample_config.prompt) if sample_config.prompt else [tok.eot_id]
  sampling = decode.Sampling(temperature=sample_config.temperature, top_k=sample_config.top_k,
                             top_p=sample_config.get("top_p", 1.0))
  [ids] = decode.generate(run.model, params, [prompt], max_new_tokens=sample_config.max_new_tokens,
                          sampling=sampling, seed=sample_config.seed, stop_id=tok.eot_id, mesh=run.mesh,
                          rules=run.rules, sliding_window=True)
  return sample_config.prompt + tok.decode(ids)
