r"""Benchmarks that print tables (medians of several runs). Speed is measured here, never in tests.

  python -m launch.bench --what=vs_torch --batch_sizes=1,8,32   # ours vs a minimal PyTorch GPT and HF, 2 shapes
  python -m launch.bench --what=vs_hf                           # ours vs HF transformers, one config
  python -m launch.bench --what=forward --preset=gpt2 --batch_sizes=1,8 --seq_len=1024
  python -m launch.bench --what=generate --preset=gpt2 --batch_sizes=1,64     # new tokens/s (+ HBM roofline)
  python -m launch.bench --what=train --preset=gpt2 --vocab_size=50304 --dtype=bfloat16 --attention=cudnn \
      --seq_len=1024 --batch_sizes=16,32 --remat_policies=none,dots --scan_layers=false,true  # MFU
  python -m launch.bench --what=ceilings                                      # bf16 product FLOP/s, copy GB/s
  python -m launch.bench --what=profile --train_batch=16 --seq_len=256        # the training step by XLA op
  python -m launch.bench --what=profile_generate --batch_sizes=8              # a generate call by XLA op
  python -m launch.bench --what=mechanisms --d_model=128 --max_len=128 --vocab_size=85 \
      --train_batch=32 --seq_len=128                                          # shakespeare.py:char_gpt2's model
  python -m launch.bench --what=generate --what=train --preset=gpt2           # several tables, one process
  python -m launch.bench --what=prepare --prepare_mb=10,100,1000 --repeats=1  # launch.prepare vs raw tiktoken
  python -m launch.bench --what=accelerator --batch_sizes=1,8,32 --new_tokens=256  # the accelerator check (a GPU)
  python -m launch.bench --what=patching --preset=gpt2 --seq_len=64  # patching sweeps vs TransformerLens
  python -m launch.bench --what=sae    # a TopK SAE's training vs SAELens on the same activations
  python -m launch.bench --what=hf --hf_shape=smollm2-135m   # an open family vs transformers (bench_hf.py)
  python -m launch.bench --what=load --hf_shape=llama3.2-1b  # host memory opening a checkpoint (bench_load.py)

--what=accelerator is the whole accelerator path in one table and --check_json, for the few minutes a
chip is lent (launch/accelerator_check.sh carries what the machine lacks and runs it): the kernel
tests on the chip, cuDNN attention on packed rows, GPT-2 training MFU at the batch the planner fits
(its bytes against the chip's peak after real steps), and decoding against the HBM roofline.

--what=vs_hf runs, on one random-weight config (default: cpu-small with GPT-2's vocabulary):
KV-cache generation (greedy, --prompt_len prompt tokens + --new_tokens new ones, batch sizes
--batch_sizes) and one training step (forward, backward, AdamW with clipping; --train_batch x
--seq_len tokens), here in JAX and in HF transformers' PyTorch GPT-2 (eager, `generate` with its
KV cache). --what=vs_torch does the same on the README main job's shape and on cpu-small, with a
minimal nanoGPT-style PyTorch GPT beside HF's. The peers (launch/torch_peer.py) run in a Python 3.11
venv with torch's CPU wheel, created on first use under the asset cache
($TRANSFORMER_CACHE/torch-peer-venv) or given by --peer_python.

Every table is a function of one `Options` (a field per flag, the flags' defaults), so Python and a
notebook call them with the settings they change:

    >>> from launch import bench
    >>> print(bench.generate_table(bench.Options(preset="cpu-tiny", batch_sizes=("1", "8"))))
"""

import collections
import dataclasses
import faulthandler
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from experiments import base, shakespeare
from experiments import gpt2 as gpt2_experiment
from launch import bench_hf, bench_load, bench_patching, bench_sae, peer_env
from transformer import benchmark, cli, data, layers, metrics, optim, plan, tasks, tokenizers, train
from transformer.config import OptimizerConfig
from transformer.data import pipeline
from transformer.data.prepare import BATCH_CHARS
from transformer.generation import sampling
from transformer.models import gpt
from transformer.tasks.lm import lm_loss

_WHAT = flags.DEFINE_multi_enum(
  "what",
  ["vs_hf"],
  [
    "forward",
    "generate",
    "train",
    "profile",
    "profile_generate",
    "vs_hf",
    "vs_torch",
    "mechanisms",
    "ceilings",
    "prepare",
    "accelerator",
    "patching",
    "sae",
    "hf",
    "load",
  ],
  "Which benchmark; repeat the flag for several in one process (tables in the order given, a blank line apart).",
)
_PRESET = flags.DEFINE_string("preset", "cpu-small", "GPT preset (random weights).")
_VOCAB = flags.DEFINE_integer("vocab_size", 50257, "Vocabulary size (GPT-2's by default).")
_D_MODEL = flags.DEFINE_integer("d_model", 0, "Model width instead of the preset's (0: the preset's).")
_CONTEXT = flags.DEFINE_integer("max_len", 0, "Context length instead of the preset's (0: the preset's).")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "8"], "Batch sizes (forward, generate, train).")
_REMAT = flags.DEFINE_list("remat_policies", ["none"], "--what=train: remat policies to try.")
_SCAN = flags.DEFINE_list("scan_layers", ["false"], "--what=train: scan_layers values to try.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 256, "Sequence length (forward, train).")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 32, "Generation: prompt tokens.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 128, "Generation: new tokens per sequence.")
_TRAIN_BATCH = flags.DEFINE_integer("train_batch", 16, "Training step: sequences per batch (0: skip it).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats (the median is reported).")
# The first steps of a process still grow its host heap (transformer/hostmem.py; launch/BENCHMARKS.md
# has the counts); a run's steps are in the steady state, and so are the timed ones, ours and the peers'.
_TRAIN_WARMUP = flags.DEFINE_float(
  "train_warmup_s", 5.0, "Training steps, ours and the peers': untimed steps for at least this many seconds first."
)
_MICROBATCHES = flags.DEFINE_integer(
  "microbatches",
  1,
  "Training steps: the batch in this many microbatches (optimizer.accumulation_steps; vs_torch: the main job's own).",
  lower_bound=1,
)
_ATTENTION = flags.DEFINE_string("attention", "xla", "Attention implementation.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Compute dtype (bfloat16 on accelerators).")
_KERNELS = flags.DEFINE_string(
  "kernels",
  "auto",
  "config.model.kernels: auto (the platform's fast forms), reference "
  "(plain JAX), cpu or accelerator (transformer.kernels).",
)
_HLO_OUT = flags.DEFINE_string("hlo_out", None, "--what=profile: also write the step's optimised HLO here.")
_TOP_OPS = flags.DEFINE_integer("top_ops", 15, "--what=profile/profile_generate: rows of the op tables.")
_ROUNDS = flags.DEFINE_integer(
  "rounds",
  1,
  lower_bound=1,
  help="--what=vs_torch: measure the peers and ours this many times, alternating, and "
  "report each cell's median over the rounds (a machine's speed can drift over "
  "minutes: alternating puts both sides in the same minutes).",
)
_PREPARE_MB = flags.DEFINE_list(
  "prepare_mb", ["10", "100"], "--what=prepare: sizes (MB) of the text files, Shakespeare repeated."
)
_PREPARE_DIR = flags.DEFINE_string(
  "prepare_dir", None, "--what=prepare: where the text files and preparations are written (default: a temp dir)."
)
_CHECK_TRAIN = flags.DEFINE_list(
  "check_train", ["gpt2", "gpt2-medium"], "--what=accelerator: the GPT-2 presets (experiments/gpt2.py) it trains."
)
_CHECK_DECODE = flags.DEFINE_list(
  "check_decode", ["gpt2", "gpt2-xl"], "--what=accelerator: the presets it decodes (at --batch_sizes)."
)
_CHECK_TESTS = flags.DEFINE_string(
  "check_tests",
  "tests/test_kernels.py tests/test_attention.py tests/test_sampling.py tests/test_beam_search.py",
  "--what=accelerator: the pytest selection run on this machine's devices first ('' skips it).",
)
_CHECK_BUDGET = flags.DEFINE_float(
  "check_memory_gib",
  0.0,
  "--what=accelerator: per-device memory the planner fits the training batch into (0: the chip's, 90% of it).",
)
_CHECK_XLA = flags.DEFINE_list(
  "check_xla_options",
  [],
  "--what=accelerator, on a GPU: XLA options each tried on the first --check_train preset's step, beside the "
  "default (e.g. xla_gpu_enable_cudnn_layer_norm,xla_gpu_enable_cublaslt: each a compile of a minute or more).",
)
_CHECK_STACK_S = flags.DEFINE_integer(
  "check_stack_s", 120, "--what=accelerator: print every thread's stack each time this many seconds pass."
)
_CHECK_TESTS_S = flags.DEFINE_integer(
  "check_tests_s", 240, "--what=accelerator: the chip's pytest run is stopped (and reported) after this long."
)
_CHECK_JSON = flags.DEFINE_string("check_json", "accelerator_check.json", "--what=accelerator: the table as JSON.")
_HF_SHAPE = flags.DEFINE_string("hf_shape", "smollm2-135m", "--what=hf, load: a published shape (hf_families.SHAPES).")
_LOAD_DIR = flags.DEFINE_string(
  "load_dir", None, "--what=load: where the checkpoint is written (kept); default a temp dir."
)
_SAE_D_IN = flags.DEFINE_integer("sae_d_in", 256, "--what=sae: the activations' width.")
_SAE_D_SAE = flags.DEFINE_integer("sae_d_sae", 2048, "--what=sae: the SAE's latents.")
_SAE_K = flags.DEFINE_integer("sae_k", 32, "--what=sae: TopK's k.")
_SAE_BATCH = flags.DEFINE_integer("sae_batch", 4096, "--what=sae: rows a step.")
_SAE_BATCHES = flags.DEFINE_integer("sae_batches", 16, "--what=sae: distinct batches in the activations file.")
_SAE_STEPS = flags.DEFINE_integer("sae_steps", 200, "--what=sae: training steps (the file's batches cycled).")
_SAE_LR = flags.DEFINE_float("sae_lr", 4e-4, "--what=sae: Adam's learning rate.")
_PEER_PYTHON = flags.DEFINE_string(
  "peer_python",
  None,
  "A Python with torch + transformers for the PyTorch peers (default: a venv made once under the asset cache).",
)


# Every setting above but --what, as one value the table functions take: `Options` has a field per
# flag, its default the flag's, so that Python (a notebook) calls a table with the settings it
# changes, e.g. `bench.train_table(bench.Options(preset="cpu-tiny", batch_sizes=("8",)))`, and `main`
# reads the flags into one (`options_from_flags()`). Lists are tuples.
_SETTINGS = {h.name: h for h in list(globals().values()) if isinstance(h, flags.FlagHolder) and h is not _WHAT}


def _frozen(value):
  return tuple(value) if isinstance(value, list) else value


Options = dataclasses.make_dataclass(
  "Options",
  [(name, object, dataclasses.field(default=_frozen(flag.default))) for name, flag in _SETTINGS.items()],
  frozen=True,
)


def options_from_flags() -> Options:
  """The parsed flags as one Options (main's only read of them)."""
  return Options(**{name: _frozen(flag.value) for name, flag in _SETTINGS.items()})


def model_config(o: Options) -> gpt.GPTConfig:
  sizes = {k: getattr(o, k) for k in ("d_model", "max_len") if getattr(o, k)}
  return gpt.preset(
    o.preset,
    vocab_size=o.vocab_size,
    attention=o.attention,
    dtype=o.dtype,
    kernels=o.kernels,
    **sizes,
  )


def _header(o: Options, what: str, cfg: gpt.GPTConfig) -> str:
  return (
    f"{what}: {o.preset} ({gpt.count_params(cfg):,} params, vocab {cfg.vocab_size}, {cfg.block.dtype}, "
    f"attention={cfg.block.attention}, kernels={cfg.kernels}) on {jax.device_count()}x "
    f"{jax.devices()[0].device_kind}, median of {o.repeats}"
  )


def _params(cfg):
  return jax.jit(lambda: nn.unbox(gpt.GPT(cfg).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]))()


def _serving_params(cfg):
  """Random weights cast to the compute dtype, as a server would hold them for generation."""
  return jax.tree.map(lambda x: x.astype(cfg.block.dtype), _params(cfg))


def forward_seconds(o: Options, cfg, params, batch: int) -> float:
  apply = jax.jit(gpt.GPT(cfg).apply)
  tokens = jax.random.randint(jax.random.key(batch), (batch, o.seq_len), 0, cfg.vocab_size)
  return benchmark.median_seconds(lambda: apply({"params": params}, tokens), repeats=o.repeats)


def generate_seconds(
  o: Options, cfg, params, batch: int, new_tokens: int = 0, fixed_trips: bool | None = None
) -> float:
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


def train_step_seconds(o: Options, cfg, params, batch_size: int = 0, seq_len: int = 0, microbatches: int = 0) -> float:
  """One jit-compiled `train.train_step` (AdamW, clipping at 1.0) on batch_size x seq_len tokens
  in `microbatches` (defaults: --train_batch x --seq_len, --microbatches), after --train_warmup_s of steps."""
  run, _ = _train_step(o, cfg, params, batch_size, seq_len, microbatches)
  return benchmark.median_seconds(run, repeats=o.repeats, warmup_seconds=o.train_warmup_s)


def _train_step(o: Options, cfg, params, batch_size: int = 0, seq_len: int = 0, microbatches: int = 0):
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


def forward_table(o: Options) -> str:
  cfg = model_config(o)
  params = _params(cfg)
  rows = []
  for b in map(int, o.batch_sizes):
    seconds = forward_seconds(o, cfg, params, b)
    rows.append([b, o.seq_len, seconds * 1000, b * o.seq_len / seconds])
  return _header(o, "forward pass", cfg) + "\n" + benchmark.table(["batch", "seq", "ms/forward", "tokens/s"], rows)


def _roofline_ms(o: Options, cfg, weight_bytes: int, batch: int, bandwidth: float) -> float:
  """The fastest a decoding step can be: every weight and the KV cache up to the mean position of
  the --prompt_len + --new_tokens run read once, at the chip's bandwidth."""
  mean_position = o.prompt_len + o.new_tokens / 2
  cache_bytes = 2 * cfg.num_layers * batch * mean_position * cfg.block.d_model * jnp.dtype(cfg.block.dtype).itemsize
  return (weight_bytes + cache_bytes) / bandwidth * 1000


def generate_table(o: Options) -> str:
  """New tokens/s; on a chip with a known memory bandwidth also the HBM roofline: each decoding step
  must read every weight (in the compute dtype: the weights are cast to it first, as a server
  would) and the KV cache up to the current position once, so bytes / bandwidth is the fastest a
  step can be."""
  cfg = model_config(o)
  params = _serving_params(cfg)
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  bandwidth = metrics.peak_bandwidth(jax.devices()[0])
  rows = []
  for b in map(int, o.batch_sizes):
    seconds = generate_seconds(o, cfg, params, b)
    ms_token = seconds * 1000 / o.new_tokens
    row = [b, o.prompt_len, o.new_tokens, seconds * 1000, ms_token, b * o.new_tokens / seconds]
    if bandwidth:
      roofline_ms = _roofline_ms(o, cfg, weight_bytes, b, bandwidth)
      row += [roofline_ms, f"{roofline_ms / ms_token:.1%}"]
    rows.append(row)
  headers = ["batch", "prompt", "new", "ms/call", "ms/token", "new tokens/s"]
  if bandwidth:
    headers += ["roofline ms/token", "of roofline"]
  note = f"\nweights {weight_bytes / 1e6:,.0f} MB in {cfg.block.dtype}" + (
    f"; roofline at {bandwidth / 1e12:.2f} TB/s (data sheet)" if bandwidth else ""
  )
  return (
    _header(o, "KV-cache generation (greedy, prefill included)", cfg) + note + "\n" + benchmark.table(headers, rows)
  )


def train_table(o: Options) -> str:
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
          seconds = train_step_seconds(o, cfg, _params(cfg), b)
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
    _header(o, f"training step, seq {o.seq_len}", model_config(o))
    + "\n"
    + benchmark.table(["scan", "remat", "batch", "ms/step", "tokens/s", "TFLOP/s", "MFU"], rows)
  )


def _peer_shape(cfg: gpt.GPTConfig) -> dict:
  """The model's shape as launch/torch_peer.py builds its PyTorch GPT-2."""
  return {
    "vocab_size": cfg.vocab_size,
    "max_len": cfg.max_len,
    "num_layers": cfg.num_layers,
    "num_heads": cfg.block.num_heads,
    "d_model": cfg.block.d_model,
  }


def vs_hf_table(o: Options) -> str:
  cfg = model_config(o)
  batch_sizes = [int(b) for b in o.batch_sizes]
  spec = {
    "model": _peer_shape(cfg),
    "generate": {"batch_sizes": batch_sizes, "prompt_len": o.prompt_len, "new_tokens": o.new_tokens},
    "train": o.train_batch and {"batch_size": o.train_batch, "seq_len": o.seq_len, "warmup_seconds": o.train_warmup_s},
    "repeats": o.repeats,
  }
  result = peer_env.run_peers(peer_env.peer_python(o.peer_python), spec)
  peer = result["hf"]
  params = _params(cfg)
  rows = []
  for b in batch_sizes:
    ours = b * o.new_tokens / generate_seconds(o, cfg, params, b)
    theirs = b * o.new_tokens / peer["generate"][str(b)]
    rows.append(
      [
        f"generate, {o.prompt_len}+{o.new_tokens} tokens",
        b,
        "new tokens/s",
        ours,
        theirs,
        f"{ours / theirs:.2f}x",
      ]
    )
  if o.train_batch:
    tokens = o.train_batch * o.seq_len
    ours, theirs = tokens / train_step_seconds(o, cfg, params), tokens / peer["train"]
    rows.append([f"train step, seq {o.seq_len}", o.train_batch, "tokens/s", ours, theirs, f"{ours / theirs:.2f}x"])
  header = (
    _header(o, "ours (JAX, jit) vs HF transformers (PyTorch eager)", cfg)
    + f"\npeer: torch {result['torch']}, transformers {result['transformers']}, {result['threads']} threads; "
    f"ours: jax {jax.__version__}"
  )
  return header + "\n" + benchmark.table(["benchmark", "batch", "unit", "ours", "HF", "ours/HF"], rows)


def profile_table(o: Options) -> str:
  """The training step of --train_batch x --seq_len tokens (first of --remat_policies and
  --scan_layers), its time split by XLA op."""
  cfg = model_config(o).replace(scan_layers=o.scan_layers[0].lower() in ("true", "1"), remat_policy=o.remat_policies[0])
  run, hlo = _train_step(o, cfg, _params(cfg))
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
    _header(
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


def profile_generate_table(o: Options) -> str:
  """One `generate` call (first of --batch_sizes; --prompt_len + --new_tokens, greedy, weights in
  the compute dtype), its time split by XLA op."""
  cfg = model_config(o)
  params = _serving_params(cfg)
  b = int(o.batch_sizes[0])
  prompt_BxP = jax.random.randint(jax.random.key(b), (b, o.prompt_len), 0, cfg.vocab_size)
  args = (params, prompt_BxP, jnp.ones_like(prompt_BxP, bool), jax.random.key(0))
  kwargs = dict(model=gpt.GPT(cfg), max_new_tokens=o.new_tokens, sampling=sampling.Sampling(temperature=0))
  compiled = sampling.jitted_sampler(kwargs["model"]).lower(*args, **kwargs).compile()
  rows = benchmark.op_profile(lambda: compiled(*args), compiled.as_text(), calls=o.repeats)
  total = sum(ms for _, _, ms, _ in rows)
  return (
    _header(o, f"generate by XLA op, batch {b}, {o.prompt_len}+{o.new_tokens} tokens", cfg)
    + f"\nsum of the ops' times: {total:.1f} ms/call\n"
    + benchmark.table(["HLO op", "JAX operation", "ms/call", "share"], rows[: o.top_ops])
  )


# --what=vs_torch's two shapes: the README main job's (shakespeare.py:char_gpt2, its batch in the config's
# microbatches) and cpu-small with GPT-2's vocabulary. (name, preset, overrides, train batch, train
# seq, microbatches, new tokens after a 32-token prompt)
VS_TORCH_SHAPES = (
  ("main job", "cpu-small", dict(d_model=128, max_len=128, vocab_size=85), 32, 128, shakespeare.GPT_MICROBATCHES, 96),
  ("cpu-small", "cpu-small", dict(vocab_size=50257), 16, 256, 1, 128),
)


def vs_torch_table(o: Options) -> str:
  """Ours beside the minimal PyTorch GPT and HF's GPT-2 (launch/torch_peer.py) on both shapes:
  a training step, and greedy generation at --batch_sizes; --rounds times, alternating."""
  batch_sizes = [int(b) for b in o.batch_sizes]
  python = peer_env.peer_python(o.peer_python)
  rows, versions = [], ""
  for name, preset, overrides, train_batch, seq_len, microbatches, new_tokens in VS_TORCH_SHAPES:
    cfg = gpt.preset(preset, attention=o.attention, dtype=o.dtype, kernels=o.kernels, **overrides)
    spec = {
      "peers": ["minimal", "hf"],
      "model": _peer_shape(cfg),
      "generate": {"batch_sizes": batch_sizes, "prompt_len": o.prompt_len, "new_tokens": new_tokens},
      "train": {"batch_size": train_batch, "seq_len": seq_len, "warmup_seconds": o.train_warmup_s},
      "repeats": o.repeats,
    }
    # seconds[(benchmark, batch)][side]: one median per round
    seconds = collections.defaultdict(lambda: collections.defaultdict(list))
    for _ in range(o.rounds):
      peers = peer_env.run_peers(python, spec)
      versions = f"torch {peers['torch']}, transformers {peers['transformers']}, {peers['threads']} threads"
      params = _params(cfg)
      for b in batch_sizes:
        cell = seconds[("generate", b)]
        cell["ours"].append(generate_seconds(o, cfg, params, b, new_tokens))
        for peer in ("minimal", "hf"):
          cell[peer].append(peers[peer]["generate"][str(b)])
      cell = seconds[("train", train_batch)]
      cell["ours"].append(train_step_seconds(o, cfg, params, train_batch, seq_len, microbatches))  # donates: last
      for peer in ("minimal", "hf"):
        cell[peer].append(peers[peer]["train"])
    shape = f"{name}: d {cfg.block.d_model}, {cfg.num_layers} layers, vocab {cfg.vocab_size}"
    for (what, batch), cell in sorted(seconds.items(), key=lambda kv: (kv[0][0] != "train", kv[0][1])):
      work = batch * (seq_len if what == "train" else new_tokens)
      ours, minimal, hf = (work / float(np.median(cell[side])) for side in ("ours", "minimal", "hf"))
      label = (
        f"train step, seq {seq_len}" + (f", {microbatches} microbatches" if microbatches > 1 else "")
        if what == "train"
        else f"generate {o.prompt_len}+{new_tokens}"
      )
      rows.append(
        [
          shape,
          label,
          batch,
          "tokens/s" if what == "train" else "new tokens/s",
          ours,
          minimal,
          hf,
          f"{ours / minimal:.2f}x",
          f"{ours / hf:.2f}x",
        ]
      )
  header = (
    f"ours (JAX, jit) vs a minimal PyTorch GPT and HF transformers' GPT-2 (PyTorch eager) on "
    f"{jax.devices()[0].device_kind}, median of {o.repeats}"
    + (f", then the median of {o.rounds} alternating rounds" if o.rounds > 1 else "")
    + f"\npeers: {versions}; ours: jax {jax.__version__}"
  )
  return (
    header
    + "\n"
    + benchmark.table(
      ["shape", "benchmark", "batch", "unit", "ours", "minimal torch", "HF", "ours/minimal", "ours/HF"], rows
    )
  )


def mechanisms_table(o: Options) -> str:
  """The training step and the forward pass with each self-attention mechanism (layers.MECHANISMS)."""
  rows, base = [], None
  for mechanism in layers.MECHANISMS:
    cfg = model_config(o).replace(attention_mechanism=mechanism)
    params = _params(cfg)
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
    _header(o, f"attention mechanisms, batch {o.train_batch} x seq {o.seq_len}", model_config(o))
    + "\n"
    + benchmark.table(
      ["mechanism", "params", "ms/train step", "train tokens/s", "ms/forward", "speed vs dot_product"], rows
    )
  )


def ceilings_table(o: Options) -> str:
  """The chip's two ceilings, measured: a large bf16 matrix product's FLOP/s (random data: zeros
  run faster) and a large copy's memory bandwidth (bytes read plus bytes written), beside the data
  sheet's peaks that `metrics` divides by. A step's MFU over the measured product rate says how far
  it is from what the chip's matrix units really deliver."""
  device = jax.devices()[0]
  accelerator = device.platform != "cpu"
  n, copy_bytes = (8192, 2**32) if accelerator else (1024, 2**27)
  a_NxN, b_NxN = (jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16) for i in (0, 1))
  x_N = jax.random.normal(jax.random.key(2), (copy_bytes // 4,), jnp.float32)
  matmul, copy = jax.jit(lambda a, b: a @ b), jax.jit(lambda x: x + 1)  # + 1: a plain copy could be elided
  # Each timed sample is `calls` launches waited on once: one ~1 ms launch waited on alone would
  # count the host's dispatch and wait too (an 8192^3 product on an H200 read 664 TFLOP/s that way).
  calls = 20 if accelerator else 2

  def seconds(fn, *args):
    def sample():
      for _ in range(calls):  # each result freed when the next replaces it: 20 copies would not fit
        result = fn(*args)
      return result

    return benchmark.median_seconds(sample, repeats=o.repeats, warmup=2) / calls

  matmul_s, copy_s = seconds(matmul, a_NxN, b_NxN), seconds(copy, x_N)
  peak_flops, peak_bytes = metrics.peak_flops(device), metrics.peak_bandwidth(device)
  rows = [
    [
      f"bf16 product {n}x{n}x{n}",
      "TFLOP/s",
      f"{2 * n**3 / matmul_s / 1e12:.3g}",
      f"{peak_flops / 1e12:.0f}" if peak_flops else "n/a",
    ],
    [
      f"float32 x + 1 over {copy_bytes / 2**30:g} GiB (read + write)",
      "TB/s",
      f"{2 * copy_bytes / copy_s / 1e12:.3g}",
      f"{peak_bytes / 1e12:.2f}" if peak_bytes else "n/a",
    ],
  ]
  return (
    f"ceilings of 1x {device.device_kind}, jax {jax.__version__}, median of {o.repeats} samples of "
    f"{calls} calls\n" + benchmark.table(["what", "unit", "measured", "data sheet"], rows)
  )


def _repeated_text(path: Path, megabytes: float) -> Path:
  """A text file of `megabytes` MB: the Shakespeare corpus's files, repeated, cut at a line end."""
  want = int(megabytes * 1e6)
  if path.exists() and path.stat().st_size >= want:
    return path
  corpus = b"".join(f.read_bytes() for f in data.named_source("shakespeare").files)
  with open(path, "wb") as f:
    for _ in range(want // len(corpus)):
      f.write(corpus)
    f.write(corpus[: corpus.rfind(b"\n", 0, want % len(corpus)) + 1])
  return path


def _raw_tiktoken_seconds(path: Path, threads: int) -> tuple[float, int]:
  """Seconds tiktoken's `encode_ordinary_batch` spends on the file's text (read as `launch.prepare`
  reads it: pieces of ~16 KB cut at line ends, 4 MB of them a call) on `threads` threads, and the
  token count. Only the calls are timed; reading is not."""
  encoding = tokenizers.get_tokenizer("gpt2").encoding
  seconds, tokens = 0.0, 0
  with open(path, encoding="utf-8") as f:
    while text := f.read(BATCH_CHARS) + f.readline():
      pieces, at = [], 0
      while at < len(text):
        end = text.find("\n", at + data.PrepareOptions().piece_chars) + 1 or len(text)
        pieces.append(text[at:end])
        at = end
      start = time.perf_counter()
      ids = encoding.encode_ordinary_batch(pieces, num_threads=threads)
      seconds += time.perf_counter() - start
      tokens += sum(map(len, ids))
  return seconds, tokens


def _prepare_process(path: Path, out_dir: Path) -> tuple[float, int]:
  """Wall seconds and peak RSS (bytes) of `python -m launch.prepare` on the file, a process of its own."""
  command = [sys.executable, "-m", "launch.prepare", f"--input_files={path}", "--tokenizer=gpt2"]
  command += [f"--output_dir={out_dir}"]
  shutil.rmtree(out_dir, ignore_errors=True)  # else an identical preparation is reused, not redone
  start = time.perf_counter()
  process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  _, status, usage = os.wait4(process.pid, 0)
  seconds = time.perf_counter() - start
  if os.waitstatus_to_exitcode(status):
    raise RuntimeError(f"{' '.join(command)} failed:\n{process.stderr.read().decode()[-2000:]}")
  return seconds, usage.ru_maxrss * 1024


def prepare_table(o: Options) -> str:
  """launch.prepare (the whole program: start, sha256 of the input, reading, tokenizing on every core,
  writing) against tiktoken's bare batch encoding of the same text on the same cores, per file size;
  then the training loader's tokens/s on the largest preparation, against what a GPT-2 124M step
  consumes on an H200 (64 x 1,024 tokens every 121 ms, README "On accelerators": ~540k tokens/s)."""
  threads = os.cpu_count() or 1
  root = Path(o.prepare_dir or tempfile.mkdtemp(prefix="bench-prepare-"))
  root.mkdir(parents=True, exist_ok=True)
  rows = []
  for mb in map(float, o.prepare_mb):
    path = _repeated_text(root / f"shakespeare-{mb:g}MB.txt", mb)
    raw, prep, rss = [], [], []
    for _ in range(o.repeats):  # alternating: both sides in the same minutes
      seconds, tokens = _raw_tiktoken_seconds(path, threads)
      raw.append(seconds)
      seconds, peak = _prepare_process(path, root / "prepared")
      prep.append(seconds)
      rss.append(peak)
    size = path.stat().st_size
    raw_s, prep_s = statistics.median(raw), statistics.median(prep)
    rows.append(
      [
        f"{size / 1e6:,.0f}",
        f"{tokens / 1e6:,.1f}M",
        f"{size / raw_s / 1e6:.1f}",
        f"{size / prep_s / 1e6:.1f}",
        f"{tokens / prep_s / 1e6:.2f}M",
        f"{raw_s / prep_s:.2f}",
        f"{max(rss) / 2**20:,.0f}",
      ]
    )
  table = benchmark.table(
    ["MB", "tokens", "tiktoken MB/s", "prepare MB/s", "prepare tokens/s", "prepare / tiktoken", "peak RSS MB"], rows
  )
  prepared = data.load_prepared(root / "prepared")
  batch, seq_len = 64, 1024
  batches = pipeline.lm_train_dataset(prepared, seq_len=seq_len, global_batch=batch, seed=0)
  step = lambda: [batches[i] for i in range(20)]
  loader_s = benchmark.median_seconds(step, repeats=o.repeats) / 20
  loader = batch * seq_len / loader_s
  return (
    f"prepare: launch.prepare --tokenizer=gpt2 (a process each: start to exit) vs tiktoken "
    f"encode_ordinary_batch alone, {threads} threads each, median of {o.repeats}\n{table}\n"
    f"training loader (windows, {batch} x {seq_len} tokens a batch, one thread): {loader / 1e6:.2f}M tokens/s, "
    f"{loader / 540e3:.1f}x what a GPT-2 124M step on an H200 reads (~540k tokens/s)"
  )


# ---------------------------------------------------------------------------------------------
# --what=accelerator: the whole accelerator path in one table, for the short time a chip is lent.


def _check_tests(o: Options) -> list[list]:
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
  params = _params(cfg)
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


def _check_train(o: Options, preset: str) -> list[list]:
  """Training MFU at the batch and remat the planner fits into the chip's memory (the recipe's
  microbatch, else remat "dots", else halved), the median step of real steps, and the planner's
  per-device bytes against the chip's peak after them."""
  device = jax.devices()[0]
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
      break
    batch //= 2
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


def _check_decode(o: Options, preset: str) -> list[list]:
  """Greedy KV-cache decoding at each --batch_sizes: new tokens/s and the share of the HBM roofline
  (every weight and the cache read once a token), with the decode loop the kernels choose (on an
  accelerator: a fixed trip count) and, at batch 1, the stopping loop beside it (before/after)."""
  cfg = gpt.preset(preset, vocab_size=50257, dtype="bfloat16" if jax.default_backend() != "cpu" else "float32")
  params = _serving_params(cfg)
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  bandwidth = metrics.peak_bandwidth(jax.devices()[0])
  rows = []
  runs = [(b, None) for b in map(int, o.batch_sizes)] + [(1, False)]
  for b, fixed in runs:
    ms_token = generate_seconds(o, cfg, params, b, fixed_trips=fixed) * 1000 / o.new_tokens
    loop = "the stopping loop" if fixed is False else "the kernels' loop"
    row = [
      f"decode {preset}, batch {b}, {loop}",
      "ms/token, new tokens/s",
      f"{ms_token:.3f}, {b * 1000 / ms_token:,.0f}",
    ]
    if bandwidth:
      share = _roofline_ms(o, cfg, weight_bytes, b, bandwidth) / ms_token
      target = b == 1 and fixed is None and preset == "gpt2-xl"
      row += [f"{share:.1%} of the HBM roofline" + (" (>= 60%)" if target else ""), share >= 0.6 if target else None]
    else:
      row += ["no bandwidth on the data sheet", None]
    rows.append(row)
  return rows


def accelerator_table(o: Options) -> str:
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


def patching_table(o: Options) -> str:
  """Patching sweeps, ours beside TransformerLens's (launch/bench_patching.py)."""
  cfg = model_config(o)
  header = _header(o, f"patching sweeps, one pair of {o.seq_len} tokens", cfg).replace(f", median of {o.repeats}", "")
  return bench_patching.patching_table(o, cfg, _params(cfg), header)


def sae_table(o: Options) -> str:
  """A TopK SAE's training, ours beside SAELens's (launch/bench_sae.py)."""
  header = (
    f"TopK SAE training: d_in {o.sae_d_in}, d_sae {o.sae_d_sae}, k {o.sae_k}, batch {o.sae_batch}, "
    f"{o.sae_steps} steps (median after {bench_sae.WARMUP}), Adam, float32"
  )
  return bench_sae.sae_table(o, header)


def hf_table(o: Options) -> str:
  """An open family's model, ours beside transformers' (launch/bench_hf.py)."""
  return bench_hf.hf_table(o, _params)


def main(argv):
  del argv
  options = options_from_flags()
  tables = {
    "forward": forward_table,
    "generate": generate_table,
    "train": train_table,
    "profile": profile_table,
    "profile_generate": profile_generate_table,
    "vs_hf": vs_hf_table,
    "vs_torch": vs_torch_table,
    "mechanisms": mechanisms_table,
    "ceilings": ceilings_table,
    "prepare": prepare_table,
    "accelerator": accelerator_table,
    "patching": patching_table,
    "sae": sae_table,
    "hf": hf_table,
    "load": bench_load.load_table,
  }
  for i, what in enumerate(_WHAT.value):
    print(("\n" if i else "") + tables[what](options), flush=True)


if __name__ == "__main__":
  cli.run(main)
