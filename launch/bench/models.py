"""Our model's own speed, the tables `launch.bench` prints for --what=forward, generate, train, profile,
profile_generate and mechanisms, and what the other benchmark modules measure with: the model of the
options (`model_config`), its random params, and a forward pass, a `generate` call and a training step timed.
Each table is a function of launch.bench's `Options` (`o`).
"""

from __future__ import annotations

import collections
import functools
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer import benchmark, layers, metrics, optim, train
from transformer.config import OptimizerConfig
from transformer.generation import sampling
from transformer.models import gpt
from transformer.tasks.lm import lm_loss


def model_config(o) -> gpt.GPTConfig:
  sizes = {k: getattr(o, k) for k in ("d_model", "max_len") if getattr(o, k)}
  return gpt.preset(
    o.preset,
    vocab_size=o.vocab_size,
    attention=o.attention,
    dtype=o.dtype,
    kernels=o.kernels,
    **sizes,
  )


def header(o, what: str, cfg: gpt.GPTConfig) -> str:
  return (
    f"{what}: {o.preset} ({gpt.count_params(cfg):,} params, vocab {cfg.vocab_size}, {cfg.block.dtype}, "
    f"attention={cfg.block.attention}, kernels={cfg.kernels}) on {jax.device_count()}x "
    f"{jax.devices()[0].device_kind}, median of {o.repeats}"
  )


def params_of(cfg):
  return jax.jit(lambda: nn.unbox(gpt.GPT(cfg).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]))()


def serving_params(cfg):
  """Random weights cast to the compute dtype, as a server would hold them for generation."""
  return jax.tree.map(lambda x: x.astype(cfg.block.dtype), params_of(cfg))


def forward_seconds(o, cfg, params, batch: int) -> float:
  apply = jax.jit(gpt.GPT(cfg).apply)
  tokens = jax.random.randint(jax.random.key(batch), (batch, o.seq_len), 0, cfg.vocab_size)
  return benchmark.median_seconds(lambda: apply({"params": params}, tokens), repeats=o.repeats)


def generate_seconds(o, cfg, params, batch: int, new_tokens: int = 0, fixed_trips: bool | None = None) -> float:
  """One `sampling.generate` call, greedy, exactly new_tokens (default --new_tokens) per sequence
  (no stop token; `fixed_trips`: the decode loop's form, by default the kernels')."""
  prompts = np.random.default_rng(batch).integers(0, cfg.vocab_size, (batch, o.prompt_len)).tolist()
  run = lambda: sampling.generate(
    gpt.GPT(cfg),
    params,
    prompts,
    max_new_tokens=new_tokens or o.new_tokens,
    sampling=sampling.Sampling(temperature=0),
    fixed_trips=fixed_trips,
  )
  # `generate` returns host lists, complete when it returns: time it without median_seconds' wait on
  # the result, which walks a list of lists as a pytree (~1.7 ms for 32 x 96 ids, ~4% of the main
  # job's batch-32 call; the peers' times include no such walk).
  return benchmark.median_seconds(lambda: len(run()), repeats=o.repeats)


def train_step_seconds(o, cfg, params, batch_size: int = 0, seq_len: int = 0, microbatches: int = 0) -> float:
  """One jit-compiled `train.train_step` (AdamW, clipping at 1.0) on batch_size x seq_len tokens
  in `microbatches` (defaults: --train_batch x --seq_len, --microbatches), after --train_warmup_s of steps."""
  run, _ = train_step_program(o, cfg, params, batch_size, seq_len, microbatches)
  return benchmark.median_seconds(run, repeats=o.repeats, warmup_seconds=o.train_warmup_s)


def train_step_program(o, cfg, params, batch_size: int = 0, seq_len: int = 0, microbatches: int = 0):
  """(a function that runs one training step and returns its loss, the step's optimised HLO text)."""
  opt = OptimizerConfig(lr=1e-4, schedule="constant", warmup_steps=0)
  tx, schedule = optim.make_optimizer(opt, 1000), optim.learning_rate(opt, 1000)
  state = train.TrainState(
    step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=jax.random.key_data(jax.random.key(0))
  )
  loss_fn = functools.partial(lm_loss, gpt.GPT(cfg))
  step = jax.jit(
    functools.partial(
      train.train_step,
      loss_fn=loss_fn,
      tx=tx,
      schedule=schedule,
      accumulation_steps=microbatches or o.microbatches,
    ),
    donate_argnums=0,
  )
  batch = jax.random.randint(
    jax.random.key(1), (batch_size or o.train_batch, (seq_len or o.seq_len) + 1), 0, cfg.vocab_size
  )
  compiled = step.lower(state, batch).compile()  # run as is: calling `step` would compile it again
  holder = [state]

  def run():
    holder[0], step_metrics = compiled(holder[0], batch)
    return step_metrics["loss"]

  return run, compiled.as_text()


def forward_table(o) -> str:
  cfg = model_config(o)
  params = params_of(cfg)
  rows = []
  for b in map(int, o.batch_sizes):
    seconds = forward_seconds(o, cfg, params, b)
    rows.append([b, o.seq_len, seconds * 1000, b * o.seq_len / seconds])
  return header(o, "forward pass", cfg) + "\n" + benchmark.table(["batch", "seq", "ms/forward", "tokens/s"], rows)


def roofline_ms(o, cfg, weight_bytes: int, batch: int, bandwidth: float) -> float:
  """The fastest a decoding step can be: every weight and the KV cache up to the mean position of
  the --prompt_len + --new_tokens run read once, at the chip's bandwidth."""
  mean_position = o.prompt_len + o.new_tokens / 2
  cache_bytes = 2 * cfg.num_layers * batch * mean_position * cfg.block.d_model * jnp.dtype(cfg.block.dtype).itemsize
  return (weight_bytes + cache_bytes) / bandwidth * 1000


def generate_table(o) -> str:
  """New tokens/s; on a chip with a known memory bandwidth also the HBM roofline: each decoding step
  must read every weight (in the compute dtype: the weights are cast to it first, as a server
  would) and the KV cache up to the current position once, so bytes / bandwidth is the fastest a
  step can be."""
  cfg = model_config(o)
  params = serving_params(cfg)
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  bandwidth = metrics.peak_bandwidth(jax.devices()[0])
  rows = []
  for b in map(int, o.batch_sizes):
    seconds = generate_seconds(o, cfg, params, b)
    ms_token = seconds * 1000 / o.new_tokens
    row = [b, o.prompt_len, o.new_tokens, seconds * 1000, ms_token, b * o.new_tokens / seconds]
    if bandwidth:
      bound_ms = roofline_ms(o, cfg, weight_bytes, b, bandwidth)
      row += [bound_ms, f"{bound_ms / ms_token:.1%}"]
    rows.append(row)
  headers = ["batch", "prompt", "new", "ms/call", "ms/token", "new tokens/s"]
  if bandwidth:
    headers += ["roofline ms/token", "of roofline"]
  note = f"\nweights {weight_bytes / 1e6:,.0f} MB in {cfg.block.dtype}" + (
    f"; roofline at {bandwidth / 1e12:.2f} TB/s (data sheet)" if bandwidth else ""
  )
  return header(o, "KV-cache generation (greedy, prefill included)", cfg) + note + "\n" + benchmark.table(headers, rows)


def train_table(o) -> str:
  """The training step (AdamW, clipping; float32 master weights) for each scan_layers x remat policy
  x batch size: tokens/s, model FLOP/s (6N + 12·L·d·T per token, as the training loop counts them)
  and MFU against the chip's dense bf16 peak."""
  rows = []
  for scan in (s.lower() in ("true", "1") for s in o.scan_layers):
    for remat in o.remat_policies:
      cfg = model_config(o).replace(scan_layers=scan, remat_policy=remat)
      flops_token = metrics.flops_per_token(gpt.count_params(cfg), cfg.num_layers, cfg.block.d_model, o.seq_len)
      for b in map(int, o.batch_sizes):
        try:
          seconds = train_step_seconds(o, cfg, params_of(cfg), b)
        except jax.errors.JaxRuntimeError as e:  # out of memory: a row that says so, then the next
          rows.append([scan, remat, b, str(e).split(":")[0][:40], "", "", ""])
          continue
        tokens_s = b * o.seq_len / seconds
        util = metrics.mfu(tokens_s, flops_token, jax.devices()[:1])
        rows.append(
          [
            scan,
            remat,
            b,
            seconds * 1000,
            tokens_s,
            tokens_s * flops_token / 1e12,
            "n/a" if util is None else f"{util:.1%}",
          ]
        )
  return (
    header(o, f"training step, seq {o.seq_len}", model_config(o))
    + "\n"
    + benchmark.table(["scan", "remat", "batch", "ms/step", "tokens/s", "TFLOP/s", "MFU"], rows)
  )


def profile_table(o) -> str:
  """The training step of --train_batch x --seq_len tokens (first of --remat_policies and
  --scan_layers), its time split by XLA op."""
  cfg = model_config(o).replace(scan_layers=o.scan_layers[0].lower() in ("true", "1"), remat_policy=o.remat_policies[0])
  run, hlo = train_step_program(o, cfg, params_of(cfg))
  if o.hlo_out:
    Path(o.hlo_out).write_text(hlo)
  rows = benchmark.op_profile(run, hlo, calls=o.repeats)
  library = benchmark.library_calls(hlo)
  by_primitive = collections.defaultdict(lambda: [0.0, 0])
  for op, what, ms, _ in rows:  # a library call by its routine, else "layer_0/attn/qkv/dot_general" -> "dot_general"
    primitive = by_primitive[library.get(op) or what.rsplit("/", 1)[-1] or "?"]
    primitive[0] += ms
    primitive[1] += 1
  total = sum(ms for _, _, ms, _ in rows)
  grouped = sorted(([p, n, ms, f"{ms / total:.1%}"] for p, (ms, n) in by_primitive.items()), key=lambda r: -r[2])
  return (
    header(
      o,
      f"training step by XLA op, batch {o.train_batch} x seq {o.seq_len}, remat "
      f"{cfg.remat_policy}, scan {cfg.scan_layers}",
      cfg,
    )
    + f"\nsum of the ops' times: {total:.1f} ms/step (the {o.top_ops} largest, then by the JAX primitive "
    "each op was fused around, or the library routine it calls)\n"
    + benchmark.table(["HLO op", "JAX operation", "ms/step", "share"], rows[: o.top_ops])
    + "\n\n"
    + benchmark.table(["library routine or JAX primitive", "ops", "ms/step", "share"], grouped[: o.top_ops])
  )


def profile_generate_table(o) -> str:
  """One `generate` call (first of --batch_sizes; --prompt_len + --new_tokens, greedy, weights in
  the compute dtype), its time split by XLA op."""
  cfg = model_config(o)
  params = serving_params(cfg)
  b = int(o.batch_sizes[0])
  prompt_BxP = jax.random.randint(jax.random.key(b), (b, o.prompt_len), 0, cfg.vocab_size)
  args = (params, prompt_BxP, jnp.ones_like(prompt_BxP, bool), jax.random.key(0))
  kwargs = dict(model=gpt.GPT(cfg), max_new_tokens=o.new_tokens, sampling=sampling.Sampling(temperature=0))
  compiled = sampling.jitted_sampler(kwargs["model"]).lower(*args, **kwargs).compile()
  rows = benchmark.op_profile(lambda: compiled(*args), compiled.as_text(), calls=o.repeats)
  total = sum(ms for _, _, ms, _ in rows)
  return (
    header(o, f"generate by XLA op, batch {b}, {o.prompt_len}+{o.new_tokens} tokens", cfg)
    + f"\nsum of the ops' times: {total:.1f} ms/call\n"
    + benchmark.table(["HLO op", "JAX operation", "ms/call", "share"], rows[: o.top_ops])
  )


def mechanisms_table(o) -> str:
  """The training step and the forward pass with each self-attention mechanism (layers.MECHANISMS)."""
  rows, base = [], None
  for mechanism in layers.MECHANISMS:
    cfg = model_config(o).replace(attention_mechanism=mechanism)
    params = params_of(cfg)
    forward_s = forward_seconds(o, cfg, params, o.train_batch)
    train_s = train_step_seconds(o, cfg, params)  # donates the params: last
    base = base or train_s
    rows.append(
      [
        mechanism,
        f"{gpt.count_params(cfg):,}",
        train_s * 1000,
        o.train_batch * o.seq_len / train_s,
        forward_s * 1000,
        f"{base / train_s:.2f}x",
      ]
    )
  return (
    header(o, f"attention mechanisms, batch {o.train_batch} x seq {o.seq_len}", model_config(o))
    + "\n"
    + benchmark.table(
      ["mechanism", "params", "ms/train step", "train tokens/s", "ms/forward", "speed vs dot_product"], rows
    )
  )
