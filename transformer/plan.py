"""Ahead-of-time plans: what a config's train step (and a GPT's decode step) costs per device, from
XLA itself, before a parameter is allocated.

    run = train.build(resolve(config, num_devices=jax.device_count()))
    p = plan_train(run)        # lowers and compiles the real train step against abstract arrays
    p.total / GIB, p.flops     # per-device bytes; FLOPs per step over all devices

The train step is the one `train_and_evaluate` runs (`train.jit_steps`): the same shardings,
donation, accumulation and remat, compiled for the state's and one batch's shapes and shardings
(`jax.ShapeDtypeStruct(..., sharding=...)`), so nothing is allocated and N fake CPU devices
(`jax_num_cpu_devices`) stand in for N accelerators. From the compiled program:

  memory    XLA's memory analysis of the per-device program: arguments (params, optimizer state,
            batch), outputs, how much of the outputs reuse donated arguments (aliased), and
            temporaries (activations, gradients, collectives' buffers). Peak ≈ arguments + outputs
            − aliased + temporaries. It is the buffer assignment of the backend that compiled it:
            a CPU plan's temporaries are close to, not equal to, an accelerator's.
  FLOPs     XLA's cost analysis, per device, summed over the devices (work that every device repeats,
            like the optimizer update under pure data parallelism, counts on each). XLA counts a
            loop's body once, so with k accumulation steps the other k - 1 microbatches' loss and
            gradients are added (XLA's count of that program as lowered). Beside it the analytic
            count: 6·N per token + 12·L·d·T for attention (`metrics.flops_per_token`). Remat
            recomputes: "full" adds about a forward pass (~8·N against 6·N), which only XLA's count
            shows.

What is compiled is the program of the platform the run is planned for (`for_platform`): the
accelerators' forms of the ops (transformer.kernels) when a GPU or TPU run is planned on fake CPU
devices, not the CPU's, whose memory and FLOPs differ.
"""

from __future__ import annotations

import dataclasses
import math
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import kernels, train
from transformer.config import RunConfig
from transformer.errors import ConfigError
from transformer.generation import sampling
from transformer.models.gpt import GPT

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Plan:
  """One compiled program's per-device memory (bytes) and its FLOPs per call."""

  program: str  # "train step" | "decode"
  mesh: dict  # {"data": .., "fsdp": .., "tensor": ..}
  batch: int  # global rows (sequences) per call
  arguments: int
  outputs: int
  aliased: int  # outputs written into donated arguments
  temporaries: int
  params: int  # the share of the arguments that is parameters ...
  optimizer: int  # ... and optimizer state
  flops: float | None  # XLA's count, all devices
  analytic_flops: float | None
  compile_s: float
  scanned: bool = False  # the model's layers are one scanned block, which XLA's count has once

  @property
  def total(self) -> int:
    """Peak bytes per device: what must fit in its memory."""
    return self.arguments + self.outputs - self.aliased + self.temporaries

  def consumers(self) -> list[tuple[str, int]]:
    """What the total is made of, largest first."""
    parts = [
      ("temporaries (activations, gradients)", self.temporaries),
      ("parameters", self.params),
      ("optimizer state", self.optimizer),
      ("batch and other arguments", self.arguments - self.params - self.optimizer),
      ("outputs not written in place", self.outputs - self.aliased),
    ]
    return sorted(((name, b) for name, b in parts if b > 0), key=lambda p: -p[1])


def per_device_bytes(tree) -> int:
  """Bytes one device holds of a tree of sharded `jax.ShapeDtypeStruct`s (the most-loaded shard)."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _memory(compiled) -> dict:
  m = compiled.memory_analysis()
  return {
    "arguments": m.argument_size_in_bytes,
    "outputs": m.output_size_in_bytes,
    "aliased": m.alias_size_in_bytes,
    "temporaries": m.temp_size_in_bytes,
  }


def _flops(stage) -> float | None:
  """XLA's FLOPs of a compiled (per device) or lowered (whole program) computation."""
  try:
    cost = stage.cost_analysis()
  except NotImplementedError:  # some backends have no cost model
    return None
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # some jax versions: a dict per program
  return float(cost["flops"]) if cost and "flops" in cost else None


def _microbatch_flops(run: train.Run, params, batch, accumulation: int) -> float | None:
  """All devices' FLOPs of one microbatch's loss and gradients: XLA's count of that program as
  lowered (before partitioning, so for the whole microbatch)."""
  micro = jax.tree.map(lambda s: jax.ShapeDtypeStruct((s.shape[0] // accumulation, *s.shape[1:]), s.dtype), batch)
  grad_fn = jax.value_and_grad(lambda p, b: run.task.loss(p, b, jax.random.key(0), True), has_aux=True)
  with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.config.mesh.rules):
    return _flops(jax.jit(grad_fn).lower(params, micro))


def plan_train(run: train.Run) -> Plan:
  """Compiles `run`'s train step ahead of time; see the module docstring for what is measured."""
  task, rules = run.task, run.config.mesh.rules
  state = train.abstract_state(run)
  batch = jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=task.batch_sharding), task.batch_shapes()
  )
  step_fn, _ = train.jit_steps(run, one_step=True)
  start = time.perf_counter()
  with jax.set_mesh(run.mesh), nn.logical_axis_rules(rules):
    compiled = step_fn.lower(state, batch).compile()
  seconds = time.perf_counter() - start
  flops = _flops(compiled)
  if flops is not None:
    flops *= run.mesh.size
    accumulation = run.config.optimizer.accumulation_steps
    if accumulation > 1:  # the compiled count has the accumulation loop's body once
      micro = _microbatch_flops(run, state.params, batch, accumulation)
      flops = None if micro is None else flops + (accumulation - 1) * micro
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  tokens = task.tokens_per_step()
  return Plan(
    "train step",
    dict(run.mesh.shape),
    jax.tree.leaves(batch)[0].shape[0],
    **_memory(compiled),
    params=per_device_bytes(state.params),
    optimizer=per_device_bytes(state.opt_state),
    flops=flops,
    analytic_flops=None if tokens is None else task.flops_per_token(num_params) * tokens,
    compile_s=seconds,
    scanned=bool(getattr(run.config.model, "scan_layers", False)),
  )


def has_sampler(run: train.Run) -> bool:
  """Whether the run trains a model that the KV-cache sampler decodes (a GPT language model), whose
  decoding `plan_decode` plans."""
  return isinstance(run.task.model, GPT)


def plan_decode(run: train.Run, batch_size: int) -> Plan:
  """Compiles the KV-cache sampler (`sampling.jitted_sampler`) of a GPT for `batch_size` prompts
  of one prompt bucket, generating up to the full context: the params and the cache it fills."""
  task, rules = run.task, run.config.mesh.rules
  if not has_sampler(run):
    raise ConfigError(
      f"the decode plan is of a GPT language model's sampler; this run's model is a {type(task.model).__name__}"
    )
  context = task.model_config.max_len
  dp = run.config.mesh.data_parallel
  if batch_size % dp:
    raise ConfigError(f"--decode_batch_size={batch_size} is not divisible by the data-parallel size {dp}")
  prompt = min(sampling.PROMPT_BUCKET, context - 1)
  params = train.abstract_state(run).params
  tokens = jax.ShapeDtypeStruct((batch_size, prompt), jnp.int32, sharding=task.batch_sharding)
  valid = jax.ShapeDtypeStruct((batch_size, prompt), jnp.bool_, sharding=task.batch_sharding)
  start = time.perf_counter()
  with jax.set_mesh(run.mesh), nn.logical_axis_rules(rules):
    compiled = (
      sampling.jitted_sampler(task.model)
      .lower(
        params,
        tokens,
        valid,
        jax.random.key(0),
        model=task.model,
        max_new_tokens=context - prompt,
        sampling=sampling.Sampling(),
        stop_id=None,
        rules=rules,
      )
      .compile()
    )
  seconds = time.perf_counter() - start
  # XLA counts the generation loop's body once: its FLOPs say nothing about a whole generation.
  return Plan(
    "decode",
    dict(run.mesh.shape),
    batch_size,
    **_memory(compiled),
    params=per_device_bytes(params),
    optimizer=0,
    flops=None,
    analytic_flops=None,
    compile_s=seconds,
  )


def for_platform(run: RunConfig, platform: str) -> tuple[RunConfig, list[str]]:
  """`run` as it compiles on `platform` (cpu, gpu or tpu), whatever devices plan it: config.model.kernels
  "auto" becomes that platform's forms, and cuDNN attention, which only an NVIDIA GPU compiles, is
  planned as XLA's (its memory is then an upper bound: cuDNN's flash attention keeps no T x T scores).
  Returns the run and a line for each change."""
  if platform not in kernels.PLATFORMS:
    raise ConfigError(f"--platform={platform!r} is unknown; choose one of {', '.join(kernels.PLATFORMS)}")
  model, notes = run.model, []
  if model.kernels == "auto":
    model = model.replace(kernels=kernels.for_platform(platform))
    notes.append(f"planned for {platform}: config.model.kernels=auto compiles as {model.kernels!r}")
  block = getattr(model, "block", None)  # (an LSTM or a sparse dictionary has no attention)
  if block is not None and block.attention == "cudnn" and jax.default_backend() != "gpu":
    model = model.replace(attention="xla")
    notes.append(
      "block.attention=cudnn compiles on an NVIDIA GPU only: planned with block.attention=xla, whose "
      "memory is an upper bound (cuDNN keeps no T x T scores)"
    )
  return dataclasses.replace(run, model=model), notes


def largest_batch(build_run, batch_multiple: int, budget_bytes: int, limit: int = 1 << 16, report=None):
  """The largest `batch_size` (a multiple of `batch_multiple`) whose train step fits `budget_bytes`
  per device, by compiling plans: doubling, then bisecting. `build_run(batch_size)` makes the run;
  `report(plan)`, when given, hears of each candidate as it is compiled. Returns (batch_size, its
  plan) or (None, the plan of the smallest batch) when none fits."""
  plans: dict[int, Plan] = {}

  def fits(k: int) -> bool:
    plans[k] = plan_train(build_run(k * batch_multiple))
    if report is not None:
      report(plans[k])
    return plans[k].total <= budget_bytes

  if not fits(1):
    return None, plans[1]
  low, high = 1, None  # low fits; high (when known) does not
  while high is None:
    k = low * 2
    if k * batch_multiple > limit:
      return low * batch_multiple, plans[low]
    if fits(k):
      low = k
    else:
      high = k
  while high - low > 1:
    mid = (low + high) // 2
    if fits(mid):
      low = mid
    else:
      high = mid
  return low * batch_multiple, plans[low]


def candidate(plan: Plan, budget_bytes: int) -> str:
  """One line for a candidate of the batch search."""
  verdict = "fits" if plan.total <= budget_bytes else "does not fit"
  return f"  batch {plan.batch}: {human_bytes(plan.total)} per device, {verdict} (compiled in {plan.compile_s:.1f} s)"


def human_bytes(n: float) -> str:
  for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
    if n >= size:
      return f"{n / size:.2f} {unit}"
  return f"{n:.0f} B"


def describe(plan: Plan, budget_bytes: int | None = None) -> str:
  """A plan as a table: per-device memory, then FLOPs."""
  mesh = " × ".join(f"{axis} {size}" for axis, size in plan.mesh.items())
  share = (plan.params + plan.optimizer) / plan.total if plan.total else 0.0
  rows = [
    ("arguments", plan.arguments),
    ("  parameters", plan.params),
    ("  optimizer state", plan.optimizer),
    ("outputs", plan.outputs),
    ("  written in place", plan.aliased),
    ("temporaries", plan.temporaries),
    ("total", plan.total),
  ]
  lines = [
    f"{plan.program}: batch {plan.batch} on {math.prod(plan.mesh.values())} devices ({mesh}), "
    f"compiled in {plan.compile_s:.1f} s",
    f"  {'per device':<22}{'bytes':>10}",
  ]
  lines += [f"  {name:<22}{human_bytes(b):>10}" for name, b in rows]
  lines[-1] += f"   (parameters + optimizer state: {share:.0%})"
  if budget_bytes is not None:
    verdict = "fits" if plan.total <= budget_bytes else "does NOT fit"
    lines.append(f"  {verdict} in {human_bytes(budget_bytes)}")
  if plan.flops is not None or plan.analytic_flops is not None:
    fmt = lambda f: "n/a" if f is None else f"{f:.3e}"
    ratio = f" (XLA / analytic = {plan.flops / plan.analytic_flops:.3f})" if plan.flops and plan.analytic_flops else ""
    lines.append(
      f"  FLOPs per step, all devices: XLA {fmt(plan.flops)}, analytic 6·N+12·L·d·T {fmt(plan.analytic_flops)}{ratio}"
    )
    if plan.scanned:
      lines.append("  (scan_layers: XLA counts the scanned block once, not once a layer; the analytic count is whole)")
  return "\n".join(lines)


def does_not_fit(plan: Plan, budget_bytes: int) -> str:
  """Why the smallest batch does not fit, and what to change."""
  parts = ", ".join(f"{name} {human_bytes(b)}" for name, b in plan.consumers())
  return (
    f"does not fit: batch {plan.batch} needs {human_bytes(plan.total)} per device, more than "
    f"{human_bytes(budget_bytes)}; the biggest consumers: {parts}. Shard the parameters and optimizer "
    f"state over more devices (--config.mesh.fsdp), recompute activations "
    f"(--config.model.remat_policy=dots or full), or use a smaller model"
  )


def check_batch_rows(run: RunConfig) -> int:
  """The multiple a searched batch_size must be: data-parallel size times accumulation steps."""
  if not hasattr(run.task_config, "batch_size"):
    raise ConfigError(
      f"the batch search varies config.batch_size, which config.task={run.task!r} does not have; "
      f"plan without --device_memory_gib"
    )
  return run.mesh.data_parallel * run.optimizer.accumulation_steps
