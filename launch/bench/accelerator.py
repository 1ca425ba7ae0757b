"""`launch.bench --what=accelerator`: the whole accelerator path in one table and --check_json, for the few
minutes a chip is lent (launch/accelerator_check.sh): the kernel tests on the chip, cuDNN attention on
packed rows, GPT-2 training at the batch the planner fits, and decoding against the HBM roofline.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp

from experiments import base
from experiments import gpt2 as gpt2_experiment
from launch.bench import models as bench_models
from transformer import benchmark, metrics, plan, tasks, tokenizers, train
from transformer.models import gpt


def _check_tests(o) -> list[list]:
  """The kernel-equivalence (and decoding, attention) tests, on this machine's devices: a pytest
  process of the --check_tests selection, not marked slow."""
  if not o.check_tests.strip():
    return []
  start = time.perf_counter()
  # On a GPU, four workers that take memory as they need it: one pytest process took 167 s of an H200's
  # few minutes, and four that each preallocate three quarters of the chip ran out of memory.
  workers = ["-n", "4"] if jax.default_backend() == "gpu" else []
  try:
    proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "-m", "not slow", *workers]
      + o.check_tests.split(),
      capture_output=True,
      text=True,
      timeout=o.check_tests_s,
      env={**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    )
  except subprocess.TimeoutExpired as e:
    lines = (e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or "").strip().splitlines()
    progress = lines[-1] if lines else "no output"
    return [["tests", o.check_tests, f"stopped after {o.check_tests_s} s at: {progress}", "all pass", False]]
  lines = proc.stdout.strip().splitlines() or ["no output"]
  for line in lines:
    if line.startswith("FAILED"):  # which, for the reader
      print(line, flush=True)
  summary = lines[-1]
  seconds = time.perf_counter() - start
  return [["tests", o.check_tests, f"{summary} ({seconds:.0f} s in all)", "all pass", proc.returncode == 0]]


def _check_cudnn_segments() -> list[list]:
  """cuDNN attention on packed rows (segment ids: each document attends to itself only) against the
  einsum reference, GPT-2-shaped heads, bf16."""
  if jax.default_backend() != "gpu":
    return [["cuDNN, packed rows", "max |logits - einsum's|", "skipped: cuDNN attention needs an NVIDIA GPU", "", None]]
  cfg = gpt.preset("gpt2", num_layers=2, max_len=1024, dtype="bfloat16", vocab_size=50304)
  params = bench_models.params_of(cfg)
  tokens_BxT = jax.random.randint(jax.random.key(0), (4, 1024), 0, cfg.vocab_size)
  segments_BxT = jnp.cumsum(jax.random.bernoulli(jax.random.key(1), 0.005, (4, 1024)), axis=1)
  # The reference forms run attention by its einsum whatever block.attention; the accelerators' by cuDNN.
  forms = {"einsum": "reference", "cudnn": "accelerator"}
  logits = {
    attention: jax.jit(gpt.GPT(cfg.replace(attention=attention, kernels=kernels)).apply)(
      {"params": params}, tokens_BxT, segments_BxT=segments_BxT
    )
    for attention, kernels in forms.items()
  }
  diff = float(jnp.abs(logits["cudnn"] - logits["einsum"]).max())
  return [["cuDNN, packed rows", "max |logits - einsum's|", f"{diff:.3g}", "bf16: < 0.5", diff < 0.5]]


def _check_run(preset: str, batch: int, remat: str) -> train.Run:
  """A training run of experiments/gpt2.py's `preset` (another GPT preset, e.g. cpu-tiny for a smoke
  check: base.lm_config's recipe) on random tokens, one microbatch of `batch` sequences a step. No
  data: the device may reach nothing, and the step's speed does not depend on the tokens."""
  if preset in gpt2_experiment.PRESETS:
    config = gpt2_experiment.get_config(preset)
  else:
    config = base.lm_config()
    config.model = base.model_fields(preset, vocab_size=50304)
    config.seq_len = min(config.seq_len, config.model.max_len)
  config.batch_size, config.optimizer.accumulation_steps, config.model.remat_policy = batch, 1, remat
  if jax.default_backend() == "gpu":  # as the README's GPU command: the presets say xla, which runs anywhere
    config.model.block.attention = "cudnn"
  run_config = tasks.resolve(config, num_devices=jax.device_count())
  no_data = types.SimpleNamespace(tokenizer=tokenizers.CharTokenizer(" abcdefghijklmnopqrstuvwxyzEMOR:"))
  return train.build(run_config, no_data)


def _fitting_run(o, preset: str, device) -> tuple:
  """(run, its plan, batch, remat) of the recipe's microbatch, else remat "dots", else halved, until
  the planner fits it into the chip's memory (--check_memory_gib, else 90% of its limit)."""
  stats = device.memory_stats() or {}
  budget = int(o.check_memory_gib * plan.GIB) or int(0.9 * stats.get("bytes_limit", 0)) or 2 * plan.GIB
  batch = gpt2_experiment.MICROBATCH.get(preset, 8)
  while True:
    for remat in ("none", "dots"):
      run = _check_run(preset, batch, remat)
      planned = plan.plan_train(run)
      if planned.total <= budget:
        break
    if planned.total <= budget or batch == 1:
      return run, planned, batch, remat
    batch //= 2


def _check_train(o, preset: str) -> list[list]:
  """Training MFU at the batch and remat the planner fits into the chip's memory (the recipe's
  microbatch, else remat "dots", else halved), the median step of real steps, and the planner's
  per-device bytes against the chip's peak after them."""
  device = jax.devices()[0]
  run, planned, batch, remat = _fitting_run(o, preset, device)
  tokens_BxL1 = jax.device_put(
    jax.random.randint(jax.random.key(0), (batch, run.config.task_config.seq_len + 1), 0, 50257),
    run.task.batch_sharding,
  )
  num_params = sum(x.size for x in jax.tree.leaves(train.abstract_state(run).params))
  name = f"train {preset}, batch {batch} x {run.config.task_config.seq_len}, remat {remat}"

  def measure(options: dict | None) -> tuple[float, float | None]:
    """(median step seconds, MFU) of the step compiled with XLA's `options`."""
    holder = [train.init_state(run)]
    step_fn, _ = train.jit_steps(run, options)

    def step():
      holder[0], step_metrics = step_fn(holder[0], tokens_BxL1)
      return step_metrics["loss"]

    with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.config.mesh.rules):  # as the training loop runs it
      seconds = benchmark.median_seconds(step, repeats=o.repeats, warmup=3)
    tokens_s = batch * run.config.task_config.seq_len / seconds
    return seconds, metrics.mfu(tokens_s, run.task.flops_per_token(num_params), jax.devices())

  seconds, util = measure(None)
  peak = (device.memory_stats() or {}).get("peak_bytes_in_use")  # the default step's, before any variant
  tokens_s = batch * run.config.task_config.seq_len / seconds
  rows = [
    [name, "median step, tokens/s", f"{seconds * 1000:.1f} ms, {tokens_s:,.0f}", "", None],
    [name, "MFU", "n/a" if util is None else f"{util:.1%}", ">= 55%", None if util is None else util >= 0.55],
  ]
  variants = [o for o in o.check_xla_options if o] if preset == o.check_train[0] else []
  for option in variants if jax.default_backend() == "gpu" else []:
    tried, tried_util = measure({option: True})
    mfu_text = "" if tried_util is None else f", MFU {tried_util:.1%}"
    rows.append(
      [name, f"{option}=true", f"{tried * 1000:.1f} ms{mfu_text}", "faster than the default", tried < seconds]
    )
  ratio = None if not peak else planned.total / peak
  rows.append(
    [
      name,
      "planner / peak_bytes_in_use",
      f"{plan.human_bytes(planned.total)} / " + ("n/a" if not peak else f"{plan.human_bytes(peak)} = {ratio:.2f}"),
      "within 10%",
      None if ratio is None else abs(ratio - 1) <= 0.10,
    ]
  )
  return rows


def _check_decode(o, preset: str) -> list[list]:
  """Greedy KV-cache decoding at each --batch_sizes: new tokens/s and the share of the HBM roofline
  (every weight and the cache read once a token), with the decode loop the kernels choose (on an
  accelerator: a fixed trip count) and, at batch 1, the stopping loop beside it (before/after)."""
  cfg = gpt.preset(preset, vocab_size=50257, dtype="bfloat16" if jax.default_backend() != "cpu" else "float32")
  params = bench_models.serving_params(cfg)
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  bandwidth = metrics.peak_bandwidth(jax.devices()[0])
  rows = []
  runs = [(b, None) for b in map(int, o.batch_sizes)] + [(1, False)]
  for b, fixed in runs:
    ms_token = bench_models.generate_seconds(o, cfg, params, b, fixed_trips=fixed) * 1000 / o.new_tokens
    loop = "the stopping loop" if fixed is False else "the kernels' loop"
    row = [
      f"decode {preset}, batch {b}, {loop}",
      "ms/token, new tokens/s",
      f"{ms_token:.3f}, {b * 1000 / ms_token:,.0f}",
    ]
    if bandwidth:
      share = bench_models.roofline_ms(o, cfg, weight_bytes, b, bandwidth) / ms_token
      target = b == 1 and fixed is None and preset == "gpt2-xl"
      row += [f"{share:.1%} of the HBM roofline" + (" (>= 60%)" if target else ""), share >= 0.6 if target else None]
    else:
      row += ["no bandwidth on the data sheet", None]
    rows.append(row)
  return rows


def accelerator_table(o) -> str:
  """The accelerator path in one table (and --check_json): the tests on the chip, cuDNN attention
  on packed rows, GPT-2 training MFU with the planner's batch and its memory against the chip's,
  and decoding against the HBM roofline. Each section runs whatever the ones before it found: one
  lending gives every number. A lending is short and its first try (2026-11-28, an H200) ended at
  its time limit with nothing printed: so each row is printed as it is measured and the JSON
  rewritten after each section, and a section that runs past --check_stack_s prints every thread's
  stack (stderr), so that a run cut short still says what it measured and where it was."""
  headers = ["check", "what", "measured", "target", "ok"]
  rows, start = [], time.perf_counter()
  faulthandler.dump_traceback_later(o.check_stack_s, repeat=True)
  sections = [functools.partial(_check_tests, o), _check_cudnn_segments]
  sections += [functools.partial(_check_train, o, p) for p in o.check_train]
  sections += [functools.partial(_check_decode, o, p) for p in o.check_decode]
  try:
    for section in sections:
      for row in section():
        rows.append(row)
        print(f"[{time.perf_counter() - start:.0f} s] " + " | ".join(map(str, row)), flush=True)
      if o.check_json:
        record = {"device": metrics.device_summary(), "jax": jax.__version__}
        record["rows"] = [dict(zip(headers, r)) for r in rows]
        Path(o.check_json).write_text(json.dumps(record, indent=1) + "\n")
  finally:
    faulthandler.cancel_dump_traceback_later()
  table = benchmark.table(headers, [[*r[:4], "" if r[4] is None else ("yes" if r[4] else "NO")] for r in rows])
  return f"accelerator check on {metrics.device_summary()}, jax {jax.__version__}\n{table}"
