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
  python -m launch.bench --what=graph --preset=gpt2 --seq_len=64 --repeats=3  # an attribution graph vs circuit-tracer
  python -m launch.bench --what=graph_published --hf_shape=qwen3-0.6b --seq_len=32 --graph_l0=64  # at a published width
  python -m launch.bench --what=hf --hf_shape=smollm2-135m   # an open family vs transformers (launch/bench/hf.py)
  python -m launch.bench --what=load --hf_shape=llama3.2-1b  # host memory opening a checkpoint (launch/bench/load.py)

--what=accelerator is the whole accelerator path in one table and --check_json, for the few minutes a
chip is lent (launch/accelerator_check.sh carries what the machine lacks and runs it): the kernel
tests on the chip, cuDNN attention on packed rows, GPT-2 training MFU at the batch the planner fits
(its bytes against the chip's peak after real steps), and decoding against the HBM roofline.

--what=vs_hf runs, on one random-weight config (default: cpu-small with GPT-2's vocabulary):
KV-cache generation (greedy, --prompt_len prompt tokens + --new_tokens new ones, batch sizes
--batch_sizes) and one training step (forward, backward, AdamW with clipping; --train_batch x
--seq_len tokens), here in JAX and in HF transformers' PyTorch GPT-2 (eager, `generate` with its
KV cache). --what=vs_torch does the same on the README main job's shape and on cpu-small, with a
minimal nanoGPT-style PyTorch GPT beside HF's. The peers (launch/bench/peers/torch_peer.py) run in a Python 3.11
venv with torch's CPU wheel, created on first use under the asset cache
($TRANSFORMER_CACHE/torch-peer-venv) or given by --peer_python.

Every table is a function of one `Options` (a field per flag, the flags' defaults), so Python and a
notebook call them with the settings they change:

    >>> from launch import bench
    >>> print(bench.generate_table(bench.Options(preset="cpu-tiny", batch_sizes=("1", "8"))))
"""

import dataclasses

from absl import flags

from launch.bench import accelerator as bench_accelerator
from launch.bench import ceilings as bench_ceilings
from launch.bench import graph as bench_graph
from launch.bench import hf as bench_hf
from launch.bench import load as bench_load
from launch.bench import models as bench_models
from launch.bench import patching as bench_patching
from launch.bench import prepare as bench_prepare
from launch.bench import sae as bench_sae
from launch.bench import vs_torch as bench_torch

# Each benchmark's table, in the module that measures it (what --what names).
TABLES = {
  "forward": bench_models.forward_table,
  "generate": bench_models.generate_table,
  "train": bench_models.train_table,
  "profile": bench_models.profile_table,
  "profile_generate": bench_models.profile_generate_table,
  "vs_hf": bench_torch.vs_hf_table,
  "vs_torch": bench_torch.vs_torch_table,
  "mechanisms": bench_models.mechanisms_table,
  "ceilings": bench_ceilings.ceilings_table,
  "prepare": bench_prepare.prepare_table,
  "accelerator": bench_accelerator.accelerator_table,
  "patching": bench_patching.patching_table,
  "sae": bench_sae.sae_table,
  "graph": bench_graph.graph_table,
  "graph_published": bench_graph.published_table,
  "hf": bench_hf.hf_table,
  "load": bench_load.load_table,
}
# For Python and notebooks: `bench.generate_table(bench.Options(...))`.
forward_table, generate_table, train_table = TABLES["forward"], TABLES["generate"], TABLES["train"]

_WHAT = flags.DEFINE_multi_enum(
  "what",
  ["vs_hf"],
  list(TABLES),
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
_HF_SHAPE = flags.DEFINE_string(
  "hf_shape", "smollm2-135m", "--what=hf, load: a published shape (experiments/shapes.py)."
)
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
_GRAPH_EXPANSION = flags.DEFINE_integer("graph_expansion", 8, "--what=graph: the transcoders' latents per d_model.")
_GRAPH_L0 = flags.DEFINE_integer("graph_l0", 16, "--what=graph: the transcoders' active latents a position.")
_GRAPH_BATCH = flags.DEFINE_integer("graph_batch", 256, "--what=graph: backward passes a batch (both).")
_GRAPH_LATENTS = flags.DEFINE_integer(
  "graph_latents", 163_840, "--what=graph_published: each layer's transcoder's latents (Qwen3-0.6B's published set's)."
)
_GRAPH_CAP = flags.DEFINE_integer("graph_cap", 1024, "--what=graph_published: max_feature_nodes (both).")
_GRAPH_DIR = flags.DEFINE_string(
  "graph_dir", None, "--what=graph_published: where the model and transcoders are written (kept); default a temp dir."
)
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


def main(argv):
  del argv
  options = options_from_flags()
  for i, what in enumerate(_WHAT.value):
    print(("\n" if i else "") + TABLES[what](options), flush=True)
