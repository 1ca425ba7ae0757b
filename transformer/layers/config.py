"""The block's configuration and every check of it: what a model config nests as `config.model.block`,
and what a model config with blocks checks (`check_model_config`)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from transformer import kernels
from transformer.errors import ConfigError
from transformer.layers.mechanisms import MECHANISMS

# Who computes dot-product attention once the fast forms are on (config.model.kernels != "reference"):
# our einsum, XLA's fused kernel, or cuDNN's flash attention (NVIDIA GPUs). Under the reference forms,
# and in any run that reads or patches the attention's named points, the einsum runs whatever this says.
ATTENTION_IMPLEMENTATIONS = ("einsum", "xla", "cudnn")
# "gpt2": kernels ~ normal(0.02), projections into the residual stream 0.02/sqrt(2 * layers);
# "xavier": Glorot uniform (the 2017 paper's tensor2tensor, flax's wmt example).
KERNEL_INITS = ("gpt2", "xavier")
NORMS = ("layer_norm", "rms_norm", "none")


def dtype(name: str):
  """jnp.dtype(name), or one error naming the dtypes that work."""
  try:
    return jnp.dtype(name)
  except TypeError:
    raise ConfigError(f"unknown dtype {name!r}; use float32, bfloat16 or float16") from None


ACTIVATIONS = {
  "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
  "gelu": jax.nn.gelu,  # (jax's default: the tanh approximation)
  "gelu_erf": lambda x: jax.nn.gelu(x, approximate=False),  # exact, with erf: GPT-NeoX/Pythia's
  "relu": jax.nn.relu,
  "relu2": lambda x: jnp.square(jax.nn.relu(x)),
  "swiglu": jax.nn.silu,  # of the gate, which multiplies the MLP's hidden layer (MLP)
  "swish": jax.nn.silu,  # x * sigmoid(x) (Ramachandran et al. 2017): Marian's (OPUS-MT) MLP
  "geglu": lambda x: jax.nn.gelu(x, approximate=True),  # of the gate, as swiglu's silu (Gemma)
}
GATED = ("swiglu", "geglu")  # activations of a gate that multiplies the MLP's hidden layer (MLP)
ROTARY_LAYOUTS = ("halves", "interleaved")
ROTARY_SCALINGS = ("none", "linear", "llama3", "yarn")
BRANCH_NORMS = ("pre", "pre_post", "post")
QK_NORMS_OVER = ("head", "heads")


@dataclasses.dataclass(frozen=True)
class RotaryConfig:
  """Rotary positions (`positions="rope"`) as the released checkpoints set them
  (`transformer.layers.positions.rotary_frequencies` computes what each field changes)."""

  theta: float = 10000.0  # the base: channel pair i turns at theta^(-2i/R) radians a position
  fraction: float = 1.0  # of each head's channels rotated, the first R = fraction * K (GPT-NeoX's rotary_pct)
  # Which channels pair up: i with i + R/2 ("halves": Llama, GPT-NeoX) or 2i with 2i + 1 ("interleaved": GPT-J)
  layout: str = "halves"
  # Longer contexts than trained: frequencies divided by `factor` ("linear"), the low ones alone with
  # a smooth band ("llama3", Llama 3.1/3.2), or YaRN's ramp and attention factor ("yarn", Qwen's)
  scaling: str = "none"
  factor: float = 1.0
  original_max_len: int = 0  # llama3 and yarn: the context the base model trained on
  low_freq_factor: float = 1.0  # llama3
  high_freq_factor: float = 4.0  # llama3
  beta_fast: float = 32.0  # yarn
  beta_slow: float = 1.0  # yarn
  attention_factor: float = 0.0  # yarn: cos and sin multiplied by it (0: 0.1 ln(factor) + 1)
  local_theta: float = 0.0  # > 0: the sliding-window layers' own base, unscaled (Gemma 3's 10,000)


@dataclasses.dataclass(frozen=True)
class BlockConfig:
  """One transformer block: what every model with blocks nests as `config.model.block` (its width
  is also the embeddings'). The defaults are GPT-2's; each model family's config sets its own (the
  2017 paper's blocks are post-LN, ReLU, Glorot-initialised)."""

  d_model: int = 768
  num_heads: int = 12
  d_mlp: int = 0  # 0: 4 * d_model, GPT-2's ratio (`mlp_width`)
  dropout_rate: float = 0.0  # the residual branches' (and the embeddings'); GPT-2 trained with 0.1
  attention_dropout_rate: float = 0.0  # needs attention="einsum"
  layer_norm_epsilon: float = 1e-5
  use_bias: bool = True
  dtype: str = "float32"  # compute ("bfloat16" on accelerators)
  param_dtype: str = "float32"
  attention: str = "xla"  # the implementation of dot-product attention (ATTENTION_IMPLEMENTATIONS)
  attention_mechanism: str = "dot_product"  # how self-attention's scores are made (MECHANISMS)
  pre_layer_norm: bool = True  # GPT-2; the 2017 paper normalises after the residual instead
  # GPT-2's; "rms_norm" (Zhang & Sennrich 2019) scales only: no mean, no bias; "none": no normalisation
  # anywhere, no parameters (Nanda et al. 2023's grokking transformer)
  norm: str = "layer_norm"
  # The MLP's: GPT-2's approximate GELU; the 2017 paper's relu; "relu2" (ReLU squared, So et al. 2021,
  # modded-nanogpt); "swiglu" (Shazeer 2020: silu(x W_gate) * x W_fc, a third projection).
  activation: str = "gelu_tanh"
  qk_norm: bool = False  # RMS-normalise each head's queries and keys before their product (OLMo 2, Gemma 3)
  # True: blocks of attention alone, no MLP (the toy models of Elhage et al. 2021 and Olsson et al. 2022).
  attention_only: bool = False
  # "gpt2": kernels ~ normal(0.02), projections into the residual stream 0.02/sqrt(2 * layers);
  # "xavier": Glorot uniform (the 2017 paper's tensor2tensor, flax's wmt example), whose larger
  # scale at small widths lets attention learn from the first steps.
  kernel_init: str = "gpt2"
  # The open families' attention and block shapes (transformer.models.formats sets them from a
  # checkpoint's config.json; each defaults to GPT-2's, which changes nothing in its program).
  num_kv_heads: int = 0  # 0: num_heads. Fewer: grouped-query attention (1: multi-query); the cache holds these
  d_head: int = 0  # 0: d_model / num_heads. Gemma's heads are wider (256 at d_model 3072)
  qkv_bias: bool = False  # biases on q, k and v even without use_bias (Qwen2: none on the output or MLP)
  qk_norm_over: str = "head"  # qk_norm over each head's channels (Qwen3, Gemma 3) or all heads' at once (OLMo 2)
  attention_scale: float = 0.0  # the scores' factor; 0: 1/sqrt(head width). Gemma 2/3: query_pre_attn_scalar^-1/2
  attention_softcap: float = 0.0  # > 0: scores = cap * tanh(scores / cap) before the mask (Gemma 2)
  # > 0: a query sees the keys less than this many positions before it (itself included): Mistral's
  # layers, Gemma's local ones (the model's `global_layers` see every key)
  sliding_window: int = 0
  parallel: bool = False  # attention and MLP read the same stream, both added to it (GPT-NeoX/Pythia, GPT-J)
  # Where a pre-LN block normalises: each branch's input ("pre", GPT-2), its input and its output
  # ("pre_post", Gemma 2 and 3), its output alone ("post", OLMo 2)
  branch_norms: str = "pre"
  norm_offset: float = 0.0  # the norms multiply by (offset + scale): Gemma's RMSNorm (1 + w)
  rotary: RotaryConfig = RotaryConfig()  # with the model's positions="rope"

  @property
  def head_dim(self) -> int:
    return self.d_head or self.d_model // self.num_heads

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def mlp_width(self) -> int:
    return self.d_mlp or 4 * self.d_model

  def replace(self, **changes) -> BlockConfig:
    return dataclasses.replace(self, **changes)


def replace_model(model_config, changes: dict):
  """`dataclasses.replace` of a model config, where the block's own fields (d_model=..., ...) change
  its nested block: a shorthand for Python callers (the config keys are model.block.*)."""
  changes = dict(changes)
  model_names = {f.name for f in dataclasses.fields(model_config)}
  block_names = {f.name for f in dataclasses.fields(BlockConfig)} - model_names
  block_changes = {name: changes.pop(name) for name in list(changes) if name in block_names}
  if block_changes:
    changes["block"] = dataclasses.replace(changes.get("block", model_config.block), **block_changes)
  return dataclasses.replace(model_config, **changes)


def check_block_config(cfg: BlockConfig) -> None:
  """Raises ConfigError naming the field (config.model.block.*) for values that cannot work."""
  if cfg.d_model <= 0 or cfg.num_heads <= 0 or cfg.d_mlp < 0:
    raise ConfigError(
      f"block.d_model and block.num_heads must be positive and block.d_mlp >= 0 (0: 4 * d_model), "
      f"got {cfg.d_model}, {cfg.num_heads}, {cfg.d_mlp}"
    )
  if cfg.d_model % cfg.num_heads and not cfg.d_head:
    raise ConfigError(
      f"block.d_model={cfg.d_model} is not divisible by block.num_heads={cfg.num_heads}; every "
      f"head gets d_model/num_heads channels, so pick e.g. num_heads="
      f"{math.gcd(cfg.d_model, cfg.num_heads) or 1} or d_model="
      f"{cfg.num_heads * max(1, round(cfg.d_model / cfg.num_heads))}"
    )
  for name, allowed in (
    ("attention implementation", ATTENTION_IMPLEMENTATIONS),
    ("attention_mechanism", MECHANISMS),
    ("kernel_init", KERNEL_INITS),
    ("activation", ACTIVATIONS),
    ("norm", NORMS),
    ("branch_norms", BRANCH_NORMS),
    ("qk_norm_over", QK_NORMS_OVER),
    ("rotary.layout", ROTARY_LAYOUTS),
    ("rotary.scaling", ROTARY_SCALINGS),
  ):
    value = cfg
    for part in name.split()[0].split("."):
      value = getattr(value, part)
    if value not in allowed:
      registered = " (one registered from Python: name its module in --config.imports)" if allowed is MECHANISMS else ""
      raise ConfigError(f"unknown block.{name} {value!r}; choose one of {', '.join(allowed)}{registered}")
  if cfg.attention_dropout_rate > 0 and cfg.attention != "einsum":
    raise ConfigError(
      f"block.attention_dropout_rate={cfg.attention_dropout_rate} needs block.attention='einsum' "
      f"(jax.nn.dot_product_attention has no dropout); set one or the other"
    )
  for name in ("dropout_rate", "attention_dropout_rate"):
    if not 0.0 <= getattr(cfg, name) < 1.0:
      raise ConfigError(f"block.{name} must be in [0, 1), got {getattr(cfg, name)}")
  if cfg.layer_norm_epsilon <= 0:
    raise ConfigError(f"block.layer_norm_epsilon must be positive, got {cfg.layer_norm_epsilon}")
  if cfg.qk_norm and not MECHANISMS[cfg.attention_mechanism].keys:
    raise ConfigError(
      f"block.attention_mechanism={cfg.attention_mechanism!r} has no keys to normalise: block.qk_norm "
      f"needs a mechanism with queries and keys (dot_product)"
    )
  _check_families_fields(cfg)
  dtype(cfg.dtype), dtype(cfg.param_dtype)


def _check_families_fields(cfg: BlockConfig) -> None:
  """The open families' fields (num_kv_heads ... rotary): each error names the field."""
  if cfg.num_kv_heads < 0 or cfg.d_head < 0 or cfg.sliding_window < 0:
    raise ConfigError(
      f"block.num_kv_heads, block.d_head and block.sliding_window must be >= 0 (0: off), got "
      f"{cfg.num_kv_heads}, {cfg.d_head}, {cfg.sliding_window}"
    )
  if cfg.num_heads % cfg.kv_heads:
    raise ConfigError(
      f"block.num_heads={cfg.num_heads} is not a multiple of block.num_kv_heads={cfg.num_kv_heads}: each "
      f"key/value head serves num_heads/num_kv_heads query heads"
    )
  if cfg.num_kv_heads and not MECHANISMS[cfg.attention_mechanism].keys:
    raise ConfigError(f"block.num_kv_heads needs a mechanism with keys (dot_product), not {cfg.attention_mechanism!r}")
  for name in ("attention_scale", "attention_softcap"):
    if getattr(cfg, name) < 0:
      raise ConfigError(f"block.{name} must be >= 0 (0: off), got {getattr(cfg, name)}")
  if cfg.parallel and not cfg.pre_layer_norm:
    raise ConfigError("block.parallel=True needs block.pre_layer_norm=True: both branches read the stream itself")
  if cfg.branch_norms != "pre" and not cfg.pre_layer_norm:
    raise ConfigError(f"block.branch_norms={cfg.branch_norms!r} is for pre-LN blocks (block.pre_layer_norm=True)")
  r = cfg.rotary
  if not 0 < r.fraction <= 1 or r.theta <= 0 or r.factor <= 0:
    raise ConfigError(
      f"block.rotary.fraction must be in (0, 1] and block.rotary.theta and .factor positive, got "
      f"{r.fraction}, {r.theta}, {r.factor}"
    )
  if r.scaling in ("llama3", "yarn") and r.original_max_len <= 0:
    raise ConfigError(f"block.rotary.scaling={r.scaling!r} needs block.rotary.original_max_len (the trained context)")


REMAT_POLICIES = {
  "none": None,  # keep every activation (fastest, most memory)
  "full": jax.checkpoint_policies.nothing_saveable,  # recompute the whole block in the backward pass
  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep matmul outputs only
}


def check_remat_policy(name: str) -> None:
  if name not in REMAT_POLICIES:
    raise ConfigError(f"unknown remat_policy {name!r}; choose one of {', '.join(REMAT_POLICIES)}")


def check_model_config(cfg, positive: tuple[str, ...]) -> None:
  """What every model config with blocks checks: the `positive` fields, the block, the remat policy,
  the kernels, and what the block asks of the model (rotary positions need keys of even width)."""
  for name in positive:
    if getattr(cfg, name) <= 0:
      raise ConfigError(f"{name} must be positive, got {getattr(cfg, name)}")
  check_block_config(cfg.block)
  check_remat_policy(cfg.remat_policy)
  kernels.check(cfg.kernels)
  if getattr(cfg, "positions", None) == "rope":
    if not MECHANISMS[cfg.block.attention_mechanism].keys:
      raise ConfigError(
        f"block.attention_mechanism={cfg.block.attention_mechanism!r} has no keys to rotate: rotary "
        f"positions need a mechanism with queries and keys (dot_product); set positions or the mechanism"
      )
    rotated = int(cfg.block.head_dim * cfg.block.rotary.fraction)
    if rotated % 2 or not rotated:
      raise ConfigError(
        f"rotary positions rotate pairs of channels: the rotated part of a head, {rotated} of its "
        f"{cfg.block.head_dim} channels (block.rotary.fraction={cfg.block.rotary.fraction}), must be even and not 0"
      )
