"""The layers both model families are built from: embeddings, attention, MLP, transformer blocks.

Conventions (nanodo's): tensors carry their shapes in their names, with
  B batch, T query length, S key/value length, D model width, H heads, K head width (D = H*K),
  F MLP width, V vocabulary.
Every parameter is created with logical axis names (`nn.with_logical_partitioning`) and the main
activations carry logical constraints, so that sharding is a matter of rules and a mesh
(`transformer.sharding`), never of model edits. Logical names used:
  vocab, embed, heads, kv, mlp, position, layers (params); batch, length, embed, heads, kv, mlp,
  vocab (activations).
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.errors import ConfigError
from transformer.kernels import attention as fast_attention
from transformer.kernels import check as check_kernels
from transformer.kernels import forms as kernel_forms
from transformer.kernels import projection as fast_projection

ATTENTION_IMPLEMENTATIONS = ("einsum", "xla", "cudnn")
# How self-attention scores are made (Tay et al. 2020, "Synthesizer"): query-key dot products, or
# synthesized without keys, from each token alone ("dense") or as learned position-by-position
# scores ("random"; "fixed_random" keeps them at their random initialisation).
ATTENTION_MECHANISMS = ("dot_product", "synthesizer_dense", "synthesizer_random", "synthesizer_fixed_random")


def _dtype(name: str):
  try:
    return jnp.dtype(name)
  except TypeError:
    raise ConfigError(f"unknown dtype {name!r}; use float32, bfloat16 or float16") from None


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
  attention: str = "xla"  # the implementation of dot-product attention: "einsum" | "xla" | "cudnn" (NVIDIA GPUs)
  # Of self-attention (ATTENTION_MECHANISMS); cross-attention is dot-product.
  attention_mechanism: str = "dot_product"
  pre_layer_norm: bool = True  # GPT-2; the 2017 paper normalises after the residual instead
  norm: str = "layer_norm"  # GPT-2's; "rms_norm" (Zhang & Sennrich 2019) scales only: no mean, no bias
  # The MLP's: GPT-2's approximate GELU; the 2017 paper's relu; "relu2" (ReLU squared, So et al. 2021,
  # modded-nanogpt); "swiglu" (Shazeer 2020: silu(x W_gate) * x W_fc, a third projection).
  activation: str = "gelu_tanh"
  qk_norm: bool = False  # RMS-normalise each head's queries and keys before their product (OLMo 2, Gemma 3)
  # "gpt2": kernels ~ normal(0.02), projections into the residual stream 0.02/sqrt(2 * layers);
  # "xavier": Glorot uniform (the 2017 paper's tensor2tensor, flax's wmt example), whose larger
  # scale at small widths lets attention learn from the first steps.
  kernel_init: str = "gpt2"
  # The model's own fields, which its config copies in (`with_model`); not config keys of the block.
  max_len: int = dataclasses.field(default=0, metadata={"derived": True})  # a synthesizer's positions
  kernels: str = dataclasses.field(default="auto", metadata={"derived": True})  # transformer.kernels
  rope: bool = dataclasses.field(default=False, metadata={"derived": True})  # the model's positions == "rope"

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def mlp_width(self) -> int:
    return self.d_mlp or 4 * self.d_model

  def replace(self, **changes) -> BlockConfig:
    return dataclasses.replace(self, **changes)

  def with_model(self, model_config) -> BlockConfig:
    """This block in a model of `model_config` (its max_len, kernels and whether positions rotate)."""
    rope = getattr(model_config, "positions", "learned") == "rope"
    return dataclasses.replace(self, max_len=model_config.max_len, kernels=model_config.kernels, rope=rope)


def nest_block(model_config) -> None:
  """For a model config's `__post_init__`: its `block` takes the model's max_len and kernels, so
  that `config.block` is what the layers build (the config is frozen, hence `object.__setattr__`)."""
  object.__setattr__(model_config, "block", model_config.block.with_model(model_config))


def replace_model(model_config, changes: dict):
  """`dataclasses.replace` of a model config, where the block's own fields (d_model=..., ...) change
  its nested block: a shorthand for Python callers (the config keys are model.block.*)."""
  changes = dict(changes)
  model_names = {f.name for f in dataclasses.fields(model_config)}
  block_names = {f.name for f in dataclasses.fields(BlockConfig) if not f.metadata.get("derived")} - model_names
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
  if cfg.attention not in ATTENTION_IMPLEMENTATIONS:
    raise ConfigError(
      f"unknown block.attention implementation {cfg.attention!r}; choose one of {', '.join(ATTENTION_IMPLEMENTATIONS)}"
    )
  if cfg.attention_mechanism not in ATTENTION_MECHANISMS:
    raise ConfigError(
      f"unknown block.attention_mechanism {cfg.attention_mechanism!r}; choose one of {', '.join(ATTENTION_MECHANISMS)}"
    )
  if cfg.attention_mechanism != "dot_product" and cfg.max_len <= 0:
    raise ConfigError(
      f"block.attention_mechanism={cfg.attention_mechanism!r} makes scores for a fixed number of "
      f"positions; the model must give its longest sequence (max_len), got {cfg.max_len}"
    )
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
  if cfg.kernel_init not in KERNEL_INITS:
    raise ConfigError(f"unknown block.kernel_init {cfg.kernel_init!r}; choose one of {', '.join(KERNEL_INITS)}")
  if cfg.activation not in ACTIVATIONS:
    raise ConfigError(f"unknown block.activation {cfg.activation!r}; choose one of {', '.join(ACTIVATIONS)}")
  if cfg.norm not in NORMS:
    raise ConfigError(f"unknown block.norm {cfg.norm!r}; choose one of {', '.join(NORMS)}")
  if cfg.attention_mechanism != "dot_product" and (cfg.rope or cfg.qk_norm):
    raise ConfigError(
      f"block.attention_mechanism={cfg.attention_mechanism!r} has no keys to rotate or normalise: "
      f"rotary positions and block.qk_norm need dot_product attention"
    )
  if cfg.rope and cfg.head_dim % 2:
    raise ConfigError(
      f"rotary positions rotate pairs of channels: the head width d_model/num_heads={cfg.head_dim} must be even"
    )
  check_kernels(cfg.kernels)
  _dtype(cfg.dtype), _dtype(cfg.param_dtype)


ACTIVATIONS = {
  "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
  "gelu": jax.nn.gelu,
  "relu": jax.nn.relu,
  "relu2": lambda x: jnp.square(jax.nn.relu(x)),
  "swiglu": jax.nn.silu,  # of the gate, which multiplies the MLP's hidden layer (MLP)
}
NORMS = ("layer_norm", "rms_norm")


KERNEL_INITS = ("gpt2", "xavier")


def _kernel_init(kind: str, std: float, names: tuple[str | None, ...], contract: int):
  if kind == "gpt2":
    return nn.with_logical_partitioning(nn.initializers.normal(std), names)
  # Glorot: fans are the contracted dims and the feature dims; a fused q/k/v axis (named None) is a
  # batch axis, so q, k and v each get the scale of a separate projection.
  features = range(contract, len(names))
  init = nn.initializers.variance_scaling(
    1.0,
    "fan_avg",
    "uniform",
    in_axis=tuple(range(contract)),
    out_axis=tuple(i for i in features if names[i] is not None),
    batch_axis=tuple(i for i in features if names[i] is None),
  )
  return nn.with_logical_partitioning(init, names)


def _zeros(names):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def norm(cfg: BlockConfig, name: str | None = None) -> nn.Module:
  """The block's normalisation (`cfg.norm`) over the model width: LayerNorm or RMSNorm."""
  if cfg.norm == "rms_norm":
    return nn.RMSNorm(
      epsilon=cfg.layer_norm_epsilon,
      dtype=_dtype(cfg.dtype),
      param_dtype=_dtype(cfg.param_dtype),
      name=name,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
    )
  # epsilon explicitly: GPT-2 uses 1e-5, Flax's default is 1e-6.
  return nn.LayerNorm(
    epsilon=cfg.layer_norm_epsilon,
    dtype=_dtype(cfg.dtype),
    use_bias=cfg.use_bias,
    param_dtype=_dtype(cfg.param_dtype),
    name=name,
    scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
    bias_init=_zeros(("embed",)),
  )


def sinusoidal_positions(length: int, d_model: int) -> np.ndarray:
  """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)); shape (length, d)."""
  pos_Lx1 = np.arange(length, dtype=np.float64)[:, None]
  freq = np.exp(-math.log(10000.0) * np.arange(0, d_model, 2, dtype=np.float64) / d_model)
  pe_LxD = np.zeros((length, d_model), dtype=np.float32)
  pe_LxD[:, 0::2] = np.sin(pos_Lx1 * freq)
  pe_LxD[:, 1::2] = np.cos(pos_Lx1 * freq)[:, : d_model // 2]
  return pe_LxD


def rotary(x_BxTxHxK: jax.Array, positions_BxT: jax.Array, base: float = 10000.0) -> jax.Array:
  """Rotary position embedding (Su et al. 2021, "RoFormer"): channels i and i + K/2 of every head
  rotated by the angle position * base^(-2i/K), so that a query-key product depends on the two
  positions only through their distance. Computed in float32; the result in x's dtype."""
  K = x_BxTxHxK.shape[-1]
  inv_freq = base ** (-jnp.arange(0, K, 2, dtype=jnp.float32) / K)
  angles_BxTx1xK2 = (positions_BxT.astype(jnp.float32)[..., None] * inv_freq)[:, :, None]
  sin, cos = jnp.sin(angles_BxTx1xK2), jnp.cos(angles_BxTx1xK2)
  x1, x2 = jnp.split(x_BxTxHxK.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x_BxTxHxK.dtype)


def causal_mask(length_q: int, length_k: int | None = None) -> jax.Array:
  """True where query t may attend to key s (s <= t), shape (1, T, S)."""
  length_k = length_q if length_k is None else length_k
  return (jnp.arange(length_k)[None, :] <= jnp.arange(length_q)[:, None])[None]


def segment_positions(valid_BxT: jax.Array | None, segments_BxT: jax.Array | None) -> jax.Array:
  """Each token's position: how many real tokens (valid_BxT; padding takes no position) come before
  it in its segment. Segments are runs of equal `segments_BxT` ids: the documents (or sentences)
  packed into one row, each of which starts again at position 0. Either may be None."""
  like = valid_BxT if valid_BxT is not None else segments_BxT
  real_BxT = jnp.ones(like.shape, jnp.int32) if valid_BxT is None else valid_BxT.astype(jnp.int32)
  seen_BxT = jnp.cumsum(real_BxT, axis=1)  # real tokens up to and including this one
  if segments_BxT is None:
    return jnp.maximum(seen_BxT - 1, 0)
  starts_BxT = jnp.concatenate(
    [jnp.ones_like(segments_BxT[:, :1], bool), segments_BxT[:, 1:] != segments_BxT[:, :-1]], axis=1
  )
  # Real tokens before the current segment began: carried forward from each segment's first token.
  before_BxT = jax.lax.cummax(jnp.where(starts_BxT, seen_BxT - real_BxT, 0), axis=1)
  return jnp.maximum(seen_BxT - before_BxT - 1, 0)


def self_attention_mask(valid_BxT: jax.Array | None, segments_BxT: jax.Array | None, *, causal: bool) -> jax.Array:
  """B x T x T, True where query t may attend to key s: a real key (valid) of the same segment, and,
  when `causal`, not after it. Every query may attend to itself, so that no softmax row is empty
  (a padding query's output is never used)."""
  like = valid_BxT if valid_BxT is not None else segments_BxT
  B, T = like.shape
  mask_BxTxT = jnp.ones((B, T, T), bool) if valid_BxT is None else jnp.broadcast_to(valid_BxT[:, None, :], (B, T, T))
  if segments_BxT is not None:
    mask_BxTxT = mask_BxTxT & (segments_BxT[:, :, None] == segments_BxT[:, None, :])
  if causal:
    mask_BxTxT = mask_BxTxT & causal_mask(T)
  return mask_BxTxT | jnp.eye(T, dtype=bool)[None]


class CachePositions(nn.Module):
  """Decode mode (a KV cache, `MultiHeadAttention(decode=True)`): the positions of the T new tokens,
  which of the cache's S slots each may attend to (those written so far that hold real tokens, and
  itself), and the position of the token in every slot (a synthesizer's scores are by position).

  The cache remembers, per slot, whether it holds a real token (valid_BxT; False for padding), and
  per sequence how many real tokens it has seen: a token's position is that count, whatever padding
  came before it. The cache's length S is that of the input `init` sees."""

  @nn.compact
  def __call__(self, valid_BxT):
    B, T = valid_BxT.shape
    initialising = not self.has_variable("cache", "valid")  # `init` sizes the cache: T is its length
    valid = self.variable("cache", "valid", jnp.zeros, (B, T), bool)
    count = self.variable("cache", "count", jnp.zeros, (B,), jnp.int32)
    index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    slot_positions = self.variable("cache", "positions", jnp.zeros, (B, T), jnp.int32)
    positions_BxT = jnp.maximum(count.value[:, None] + jnp.cumsum(valid_BxT, axis=1) - 1, 0)
    slots_T = index.value + jnp.arange(T)
    if not initialising:
      valid.value = jax.lax.dynamic_update_slice_in_dim(valid.value, valid_BxT, index.value, axis=1)
      slot_positions.value = jax.lax.dynamic_update_slice_in_dim(
        slot_positions.value, positions_BxT, index.value, axis=1
      )
      count.value = count.value + valid_BxT.sum(axis=1, dtype=jnp.int32)
      index.value = index.value + T
    slots_S = jnp.arange(valid.value.shape[1])
    earlier_TxS = slots_S[None, :] <= slots_T[:, None]
    itself_TxS = slots_S[None, :] == slots_T[:, None]
    mask_BxTxS = earlier_TxS[None] & (valid.value[:, None, :] | itself_TxS[None])
    return positions_BxT, mask_BxTxS, slot_positions.value if not initialising else positions_BxT


def mix(
  scores_BxHxTxS,
  v_BxSxHxK,
  mask_BxTxS,
  dropout: nn.Dropout | None = None,
  deterministic: bool = True,
  sow=None,
  values: str = "bshk",
) -> jax.Array:
  """softmax(scores) V over the keys that `mask` allows (True = attend; None: causal), however the
  scores were made. Scores in float32; masking by jnp.where, never by adding a large negative number
  (which overflows in half precision). `sow(probs_BxHxTxS)`, when given, receives the attention
  probabilities (transformer.probes). `values`: the layout of V ("bhsk": a KV cache's)."""
  if mask_BxTxS is None:
    mask_BxTxS = causal_mask(*scores_BxHxTxS.shape[-2:])
  scores_BxHxTxS = jnp.where(mask_BxTxS[:, None], scores_BxHxTxS.astype(jnp.float32), jnp.finfo(jnp.float32).min)
  probs_BxHxTxS = jax.nn.softmax(scores_BxHxTxS, axis=-1)
  if sow is not None:
    sow(probs_BxHxTxS)
  if dropout is not None:
    probs_BxHxTxS = dropout(probs_BxHxTxS, deterministic=deterministic)
  return jnp.einsum(f"bhts,{values}->bthk", probs_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK)


def attend(
  q_BxTxHxK,
  k_BxSxHxK,
  v_BxSxHxK,
  mask_BxTxS,
  implementation: str,
  dropout: nn.Dropout | None = None,
  deterministic: bool = True,
  sow=None,
  kernels: str = "auto",
) -> jax.Array:
  """softmax(Q Kᵀ / √K) V over the keys that `mask` allows (True = attend). `mask` None means causal
  and nothing else (query t sees keys 0..t), which cuDNN takes as `is_causal`: it skips the masked
  half of the scores instead of reading a mask. `sow` (see `mix`) needs the probabilities, so it
  takes the einsum path whatever the implementation. `kernels` (config.model.kernels) may send causal
  self-attention to a faster form of the same computation (transformer.kernels.attention)."""
  if implementation == "einsum" or sow is not None:  # the reference: every step visible (mix: None = causal)
    scale = 1.0 / math.sqrt(q_BxTxHxK.shape[-1])
    scores_BxHxTxS = jnp.einsum("bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK, preferred_element_type=jnp.float32) * scale
    return mix(scores_BxHxTxS, v_BxSxHxK, mask_BxTxS, dropout, deterministic, sow)
  # Fused kernels: XLA's on any backend, cuDNN flash attention on NVIDIA GPUs (bf16/fp16 only).
  if mask_BxTxS is None and implementation == "cudnn":
    return jax.nn.dot_product_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, is_causal=True, implementation=implementation)
  if mask_BxTxS is None and q_BxTxHxK.shape[1] == k_BxSxHxK.shape[1]:  # causal self-attention
    forms = kernel_forms(kernels)
    if forms == "cpu":
      return fast_attention.causal_cpu(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK)
    if forms == "accelerator":
      return fast_attention.causal_by_blocks(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, implementation)
  if mask_BxTxS is None:
    mask_BxTxS = causal_mask(q_BxTxHxK.shape[1], k_BxSxHxK.shape[1])
  return jax.nn.dot_product_attention(
    q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask=mask_BxTxS[:, None], implementation=implementation
  )


def attend_cached(
  q_BxTxHxK,
  k_BxHxKxS,
  v_BxHxSxK,
  mask_BxTxS,
  dropout: nn.Dropout | None = None,
  deterministic: bool = True,
  sow=None,
  kernels: str = "auto",
) -> jax.Array:
  """`attend` over a KV cache (keys B x H x K x S, values B x H x S x K: see
  `MultiHeadAttention._cached`). On a CPU, one new token per sequence (every step after the prompt)
  takes matrix-vector products (transformer.kernels.attention.one_token_cpu)."""
  if q_BxTxHxK.shape[1] == 1 and sow is None and dropout is None and kernel_forms(kernels) == "cpu":
    return fast_attention.one_token_cpu(q_BxTxHxK, k_BxHxKxS, v_BxHxSxK, mask_BxTxS)
  scale = 1.0 / math.sqrt(q_BxTxHxK.shape[-1])
  scores_BxHxTxS = jnp.einsum("bthk,bhks->bhts", q_BxTxHxK, k_BxHxKxS, preferred_element_type=jnp.float32) * scale
  return mix(scores_BxHxTxS, v_BxHxSxK, mask_BxTxS, dropout, deterministic, sow, values="bhsk")


class Projection(nn.Module):
  """x @ kernel over the last `contract` dims of x, into `features` dims: Dense for any rank.

  Flax's DenseGeneral initialises a flattened kernel and reshapes it, which breaks logical sharding
  of multi-dimensional kernels; this creates the kernel in its real shape with its axis names."""

  features: tuple[int, ...]
  names: tuple[str | None, ...]  # logical names of the kernel: contracted dims, then features
  contract: int = 1
  std: float = 0.02  # kernel_init "gpt2"
  use_bias: bool = True
  dtype: str = "float32"
  param_dtype: str = "float32"
  kernel_init: str = "gpt2"  # or "xavier" (see BlockConfig)
  kernels: str = "auto"  # config.model.kernels: the CPU's forms take transformer.kernels.projection

  @nn.compact
  def __call__(self, x):
    shape = (*x.shape[x.ndim - self.contract :], *self.features)
    kernel = self.param(
      "kernel", _kernel_init(self.kernel_init, self.std, self.names, self.contract), shape, _dtype(self.param_dtype)
    )
    x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
    if kernel_forms(self.kernels) == "cpu":
      y = fast_projection.project(x, kernel, self.contract)
    else:
      y = jnp.tensordot(x, kernel, self.contract)
    if self.use_bias:
      bias = self.param("bias", _zeros(self.names[self.contract :]), self.features, _dtype(self.param_dtype))
      y = y + bias.astype(self.dtype)
    return y


class MultiHeadAttention(nn.Module):
  """Self-attention (one fused Q/K/V projection) or, with `cross`, attention from x to `context`
  (Q from x, K/V from the context: the decoder looking at the encoder).

  With `decode=True` self-attention keeps a KV cache in the "cache" collection: each call writes
  its keys/values at the cache index and attends over the whole cache (the caller's mask says which
  slots are real; see `CachePositions`). The cache's length is that of the input `init` sees.
  Cross-attention in decode mode computes the context's keys/values once, on the call that passes
  `context_BxSxD`, and reuses them from the cache on calls that pass None."""

  cfg: BlockConfig
  # GPT-2 scales the init of projections into the residual stream by 1/sqrt(2 * layers).
  residual_std: float = 0.02
  decode: bool = False
  cross: bool = False

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxTxS, *, context_BxSxD=None, positions=None, deterministic=True):
    """`positions`: (of the queries B x T, of the keys B x S), which a synthesizer's scores are by."""
    cfg = self.cfg
    H, K, D = cfg.num_heads, cfg.head_dim, cfg.d_model
    dense = lambda features, contract, names, std, name: Projection(
      features, names, contract, std, cfg.use_bias, cfg.dtype, cfg.param_dtype, cfg.kernel_init, cfg.kernels, name=name
    )
    dropout = nn.Dropout(cfg.attention_dropout_rate) if cfg.attention_dropout_rate else None
    # Probing (apply(..., mutable=["intermediates"]), transformer.probes) records the attention
    # probabilities; otherwise nothing is recorded and no probability is materialised for it.
    sow = (
      (lambda probs: self.sow("intermediates", "attention", probs))
      if self.is_mutable_collection("intermediates")
      else None
    )
    if not self.cross and cfg.attention_mechanism != "dot_product":
      v_BxTxHxK = dense((H, K), 1, ("embed", "heads", "kv"), 0.02, "v")(x_BxTxD)
      # Only values are cached: a synthesized score depends on the query token and positions alone.
      scores_BxHxTxS = self._synthesized_scores(x_BxTxD, *positions)
      if self.decode:
        v_BxHxSxK = self._cached(value=v_BxTxHxK)["value"]
        out_BxTxHxK = mix(scores_BxHxTxS, v_BxHxSxK, mask_BxTxS, dropout, deterministic, sow, values="bhsk")
      else:
        out_BxTxHxK = mix(scores_BxHxTxS, v_BxTxHxK, mask_BxTxS, dropout, deterministic, sow)
      return dense((D,), 2, ("heads", "kv", "embed"), self.residual_std, "out")(out_BxTxHxK)
    if not self.cross:
      qkv_BxTx3xHxK = dense((3, H, K), 1, ("embed", None, "heads", "kv"), 0.02, "qkv")(x_BxTxD)
      q_BxTxHxK, k_BxSxHxK, v_BxSxHxK = (qkv_BxTx3xHxK[:, :, i] for i in range(3))
      q_BxTxHxK, k_BxSxHxK = self._normalised(q_BxTxHxK, k_BxSxHxK)
      if cfg.rope:  # this call's keys are its queries' tokens: both at the queries' positions
        q_BxTxHxK, k_BxSxHxK = rotary(q_BxTxHxK, positions[0]), rotary(k_BxSxHxK, positions[0])
      if self.decode:
        cached = self._cached(key=k_BxSxHxK, value=v_BxSxHxK)
        out_BxTxHxK = attend_cached(
          q_BxTxHxK, cached["key"], cached["value"], mask_BxTxS, dropout, deterministic, sow, cfg.kernels
        )
        return dense((D,), 2, ("heads", "kv", "embed"), self.residual_std, "out")(out_BxTxHxK)
    else:
      q_BxTxHxK = dense((H, K), 1, ("embed", "heads", "kv"), 0.02, "q")(x_BxTxD)
      kv_proj = dense((2, H, K), 1, ("embed", None, "heads", "kv"), 0.02, "kv")
      if context_BxSxD is not None:
        kv_BxSx2xHxK = kv_proj(context_BxSxD)
      if self.decode:
        cached = self.variable("cache", "context_kv", lambda: kv_BxSx2xHxK)
        if context_BxSxD is not None:
          cached.value = kv_BxSx2xHxK
        kv_BxSx2xHxK = cached.value
      k_BxSxHxK, v_BxSxHxK = kv_BxSx2xHxK[:, :, 0], kv_BxSx2xHxK[:, :, 1]
      q_BxTxHxK, k_BxSxHxK = self._normalised(q_BxTxHxK, k_BxSxHxK)
    q_BxTxHxK = nn.with_logical_constraint(q_BxTxHxK, ("batch", "length", "heads", "kv"))
    out_BxTxHxK = attend(
      q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask_BxTxS, cfg.attention, dropout, deterministic, sow, cfg.kernels
    )
    return dense((D,), 2, ("heads", "kv", "embed"), self.residual_std, "out")(out_BxTxHxK)

  def _normalised(self, q_BxTxHxK, k_BxSxHxK):
    """With `qk_norm`, each head's queries and keys RMS-normalised (a learned scale per channel):
    the scores stay bounded whatever the projections' scale, which allows larger learning rates."""
    if not self.cfg.qk_norm:
      return q_BxTxHxK, k_BxSxHxK
    head_norm = lambda name: nn.RMSNorm(
      epsilon=self.cfg.layer_norm_epsilon,
      dtype=_dtype(self.cfg.dtype),
      param_dtype=_dtype(self.cfg.param_dtype),
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("kv",)),
      name=name,
    )
    return head_norm("q_norm")(q_BxTxHxK), head_norm("k_norm")(k_BxSxHxK)

  def _synthesized_scores(self, x_BxTxD, q_positions_BxT, k_positions_BxS):
    """Scores B x H x T x S without keys. Dense: for head h, ReLU(x A_h + b_1) B_h + b_2 gives the
    query's scores for all max_len positions, of which each key's position is taken. Random: a
    learned max_len x max_len table per head, indexed by (query position, key position)."""
    cfg = self.cfg
    H, K, L = cfg.num_heads, cfg.head_dim, cfg.max_len
    B, T, S = x_BxTxD.shape[0], q_positions_BxT.shape[1], k_positions_BxS.shape[1]
    param_dtype = _dtype(cfg.param_dtype)
    if cfg.attention_mechanism == "synthesizer_dense":
      hidden_BxTxHxK = jax.nn.relu(
        Projection(
          (H, K),
          ("embed", "heads", "kv"),
          1,
          0.02,
          cfg.use_bias,
          cfg.dtype,
          cfg.param_dtype,
          cfg.kernel_init,
          cfg.kernels,
          name="synth_hidden",
        )(x_BxTxD)
      )
      init = (
        nn.initializers.normal(0.02)
        if cfg.kernel_init == "gpt2"
        else nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=1, out_axis=2, batch_axis=0)
      )
      kernel_HxKxL = self.param(
        "synth_kernel", nn.with_logical_partitioning(init, ("heads", "kv", "position")), (H, K, L), param_dtype
      )
      bias_HxL = self.param("synth_bias", _zeros(("heads", "position")), (H, L), param_dtype)
      scores_BxHxTxL = (
        jnp.einsum("bthk,hkl->bhtl", hidden_BxTxHxK, kernel_HxKxL.astype(cfg.dtype), preferred_element_type=jnp.float32)
        + bias_HxL[None, :, None, :]
      )
      index_BxHxTxS = jnp.broadcast_to(k_positions_BxS[:, None, None, :], (B, H, T, S))
      return jnp.take_along_axis(scores_BxHxTxL, index_BxHxTxS, axis=-1)
    # Random: a table per head. "fixed_random" is a parameter too (checkpoints and shardings need
    # nothing new) that gets no gradient; it is not weight-decayed unless optimizer.decay_norms_and_biases.
    # (A logical name may appear once per array: the key-position axis is named None, replicated.)
    table_HxLxL = self.param(
      "synth_table",
      nn.with_logical_partitioning(nn.initializers.normal(1.0), ("heads", "position", None)),
      (H, L, L),
      param_dtype,
    )
    if cfg.attention_mechanism == "synthesizer_fixed_random":
      table_HxLxL = jax.lax.stop_gradient(table_HxLxL)
    scores_HxBxTxS = table_HxLxL[:, q_positions_BxT[:, :, None], k_positions_BxS[:, None, :]]
    return jnp.moveaxis(scores_HxBxTxS, 0, 1)

  def _cached(self, **arrays_BxTxHxK):
    """Writes this call's T keys and/or values at the cache index; returns the whole cache by name:
    keys B x H x K x S, values B x H x S x K (CACHE_LAYOUTS). The layouts the products read, so that
    writing a step's keys and values is the only copy (with B x S x H x K, XLA:CPU copied the whole
    cache at every step). Keys: positions last, so that a new token's scores run along contiguous
    rows. Values: positions third, so that a step writes K contiguous numbers per head instead of K
    numbers S apart. (What each layout gained: launch/BENCHMARKS.md.)"""
    initialising = not self.has_variable("cache", "index")
    arrays = {
      name: x.transpose([_WRITTEN_AXES.index(axis) for axis in CACHE_LAYOUTS[name]])
      for name, x in arrays_BxTxHxK.items()
    }
    cache = {name: self.variable("cache", name, jnp.zeros, x.shape, x.dtype) for name, x in arrays.items()}
    index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    if initialising:  # `init` only sizes the cache
      return arrays
    i = index.value
    for name, x in arrays.items():
      names = CACHE_LAYOUTS[name]
      cache[name].value = nn.with_logical_constraint(
        jax.lax.dynamic_update_slice_in_dim(
          cache[name].value, x.astype(cache[name].value.dtype), i, axis=names.index("length")
        ),
        names,
      )
    index.value = i + next(iter(arrays_BxTxHxK.values())).shape[1]
    return {name: variable.value for name, variable in cache.items()}


# A KV cache's layouts, as logical axis names (sharded like the activations that fill it; see
# MultiHeadAttention._cached). A call writes B x T x H x K arrays, transposed into them.
CACHE_LAYOUTS = {"key": ("batch", "heads", "kv", "length"), "value": ("batch", "heads", "length", "kv")}
_WRITTEN_AXES = ("batch", "length", "heads", "kv")


class MLP(nn.Module):
  cfg: BlockConfig
  residual_std: float = 0.02

  @nn.compact
  def __call__(self, x_BxTxD):
    cfg = self.cfg
    kw = dict(
      use_bias=cfg.use_bias,
      dtype=cfg.dtype,
      param_dtype=cfg.param_dtype,
      kernel_init=cfg.kernel_init,
      kernels=cfg.kernels,
    )
    h_BxTxF = Projection((cfg.mlp_width,), ("embed", "mlp"), name="fc", **kw)(x_BxTxD)
    if cfg.activation == "swiglu":  # gated: silu of a second projection of x scales each hidden unit
      gate_BxTxF = Projection((cfg.mlp_width,), ("embed", "mlp"), name="gate", **kw)(x_BxTxD)
      h_BxTxF = jax.nn.silu(gate_BxTxF) * h_BxTxF
    else:
      # The activation's backward pass recomputes it from its saved input (jax.checkpoint). Autodiff
      # saves the tanh GELU's tanh instead and rebuilds the input from the product's output and the
      # bias, so that pass reads three B x T x F tensors, not two (a little faster on accelerators;
      # the same losses and gradients). Without a gradient it is the plain activation.
      h_BxTxF = jax.checkpoint(ACTIVATIONS[cfg.activation])(h_BxTxF)
    h_BxTxF = nn.with_logical_constraint(h_BxTxF, ("batch", "length", "mlp"))
    return Projection((cfg.d_model,), ("mlp", "embed"), std=self.residual_std, name="proj", **kw)(h_BxTxF)


class Block(nn.Module):
  """Self-attention, optional cross-attention, MLP; each a residual branch with LayerNorm before
  it (pre-LN, GPT-2) or after the sum (post-LN, the 2017 paper)."""

  cfg: BlockConfig
  cross_attention: bool = False
  residual_std: float = 0.02
  deterministic: bool = True  # no dropout; an attribute, not an argument, so scan/remat see no bool
  decode: bool = False  # self-attention through a KV cache (MultiHeadAttention)

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxTxT, context_BxSxD=None, context_mask_BxTxS=None, positions=None):
    cfg, deterministic = self.cfg, self.deterministic
    drop = nn.Dropout(cfg.dropout_rate)

    def residual(x, branch, norm):
      if cfg.pre_layer_norm:
        return x + drop(branch(norm(x)), deterministic=deterministic)
      return norm(x + drop(branch(x), deterministic=deterministic))

    x_BxTxD = residual(
      x_BxTxD,
      lambda h: MultiHeadAttention(cfg, self.residual_std, self.decode, name="attn")(
        h, mask_BxTxT, positions=positions, deterministic=deterministic
      ),
      norm(cfg, "ln_1"),
    )
    if self.cross_attention:
      x_BxTxD = residual(
        x_BxTxD,
        lambda h: MultiHeadAttention(cfg, self.residual_std, self.decode, cross=True, name="cross_attn")(
          h, context_mask_BxTxS, context_BxSxD=context_BxSxD, deterministic=deterministic
        ),
        norm(cfg, "ln_cross"),
      )
    x_BxTxD = residual(x_BxTxD, MLP(cfg, self.residual_std, name="mlp"), norm(cfg, "ln_2"))
    self.sow("intermediates", "residual", x_BxTxD)  # the residual stream after this block, when probing
    return nn.with_logical_constraint(x_BxTxD, ("batch", "length", "embed"))


REMAT_POLICIES = {
  "none": None,  # keep every activation (fastest, most memory)
  "full": jax.checkpoint_policies.nothing_saveable,  # recompute the whole block in the backward pass
  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep matmul outputs only
}


def check_remat_policy(name: str) -> None:
  if name not in REMAT_POLICIES:
    raise ConfigError(f"unknown remat_policy {name!r}; choose one of {', '.join(REMAT_POLICIES)}")


def check_model_config(cfg, positive: tuple[str, ...]) -> None:
  """What every model config checks: the `positive` fields, the block, the remat policy."""
  for name in positive:
    if getattr(cfg, name) <= 0:
      raise ConfigError(f"{name} must be positive, got {getattr(cfg, name)}")
  check_block_config(cfg.block)
  check_remat_policy(cfg.remat_policy)


class Stack(nn.Module):
  """`num_layers` blocks, unrolled (`layer_0`, `layer_1`, ...) or scanned (`layers`, with a leading
  `layers` axis on every parameter: one compiled block, faster compiles for deep models).
  `deterministic` and `decode` are call arguments, as for every model (see transformer.models)."""

  cfg: BlockConfig
  num_layers: int
  scan: bool = False
  remat_policy: str = "none"
  cross_attention: bool = False

  @nn.compact
  def __call__(
    self,
    x_BxTxD,
    mask_BxTxT,
    context_BxSxD=None,
    context_mask_BxTxS=None,
    *,
    positions=None,
    deterministic: bool = True,
    decode: bool = False,
  ):
    """`positions`: (of the queries, of the keys) of self-attention, for a synthesizer."""
    check_remat_policy(self.remat_policy)
    block = Block
    if self.remat_policy != "none" and not decode:  # no backward pass when decoding
      block = nn.remat(Block, policy=REMAT_POLICIES[self.remat_policy], prevent_cse=not self.scan)
    residual_std = 0.02 / math.sqrt(2 * self.num_layers)
    if self.scan:
      scanned = nn.scan(
        lambda mdl, x, *args: (mdl(x, *args), None),
        variable_axes={"params": 0, "cache": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        length=self.num_layers,
        in_axes=(nn.broadcast,) * 4,
        metadata_params={nn.PARTITION_NAME: "layers"},
      )
      x_BxTxD, _ = scanned(
        block(self.cfg, self.cross_attention, residual_std, deterministic, decode, name="layers"),
        x_BxTxD,
        mask_BxTxT,
        context_BxSxD,
        context_mask_BxTxS,
        positions,
      )
      return x_BxTxD
    for i in range(self.num_layers):
      x_BxTxD = block(self.cfg, self.cross_attention, residual_std, deterministic, decode, name=f"layer_{i}")(
        x_BxTxD, mask_BxTxT, context_BxSxD, context_mask_BxTxS, positions
      )
    return x_BxTxD


def stack_layers(params: dict, num_layers: int) -> dict:
  """Unrolled params (`layer_0` ... `layer_{n-1}`) -> scanned params (`layers`, leading axis n)."""
  layers = [params[f"layer_{i}"] for i in range(num_layers)]
  rest = {k: v for k, v in params.items() if not k.startswith("layer_")}
  return {**rest, "layers": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}


def unstack_layers(params: dict, num_layers: int) -> dict:
  """The inverse of `stack_layers`."""
  rest = {k: v for k, v in params.items() if k != "layers"}
  return {**rest, **{f"layer_{i}": jax.tree.map(lambda x: x[i], params["layers"]) for i in range(num_layers)}}
