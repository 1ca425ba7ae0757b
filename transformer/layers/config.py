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
  "gelu": jax.nn.gelu,
  "relu": jax.nn.relu,
  "relu2": lambda x: jnp.square(jax.nn.relu(x)),
  "swiglu": jax.nn.silu,  # of the gate, which multiplies the MLP's hidden layer (MLP)
  "swish": jax.nn.silu,  # x * sigmoid(x) (Ramachandran et al. 2017): Marian's (OPUS-MT) MLP
}


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

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

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
  if cfg.d_model % cfg.num_heads:
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
  ):
    value = getattr(cfg, name.split()[0])
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
  dtype(cfg.dtype), dtype(cfg.param_dtype)


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
    if cfg.block.head_dim % 2:
      raise ConfigError(
        f"rotary positions rotate pairs of channels: the head width d_model/num_heads={cfg.block.head_dim} must be even"
      )
