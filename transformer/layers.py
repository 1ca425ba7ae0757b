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
import functools
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer import kernels
from transformer.errors import ConfigError
from transformer.kernels import attention as fast_attention
from transformer.kernels import projection as fast_projection

# Who computes dot-product attention once the fast forms are on (config.model.kernels != "reference"):
# our einsum, XLA's fused kernel, or cuDNN's flash attention (NVIDIA GPUs).
ATTENTION_IMPLEMENTATIONS = ("einsum", "xla", "cudnn")


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
  attention: str = "xla"  # the implementation of dot-product attention (ATTENTION_IMPLEMENTATIONS)
  attention_mechanism: str = "dot_product"  # how self-attention's scores are made (MECHANISMS)
  pre_layer_norm: bool = True  # GPT-2; the 2017 paper normalises after the residual instead
  norm: str = "layer_norm"  # GPT-2's; "rms_norm" (Zhang & Sennrich 2019) scales only: no mean, no bias
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
      raise ConfigError(f"unknown block.{name} {value!r}; choose one of {', '.join(allowed)}")
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
  _dtype(cfg.dtype), _dtype(cfg.param_dtype)


ACTIVATIONS = {
  "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
  "gelu": jax.nn.gelu,
  "relu": jax.nn.relu,
  "relu2": lambda x: jnp.square(jax.nn.relu(x)),
  "swiglu": jax.nn.silu,  # of the gate, which multiplies the MLP's hidden layer (MLP)
  "swish": jax.nn.silu,  # x * sigmoid(x) (Ramachandran et al. 2017): Marian's (OPUS-MT) MLP
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


SINUSOID_LAYOUTS = ("interleaved", "halves")


def sinusoidal_positions(length: int, d_model: int, layout: str = "interleaved") -> np.ndarray:
  """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)); shape (length, d).
  layout "halves": the same sines in channels [0, d/2) and cosines in [d/2, d), as Marian (OPUS-MT)
  and fairseq lay them out."""
  pos_Lx1 = np.arange(length, dtype=np.float64)[:, None]
  freq = np.exp(-math.log(10000.0) * np.arange(0, d_model, 2, dtype=np.float64) / d_model)
  sines, cosines = np.sin(pos_Lx1 * freq), np.cos(pos_Lx1 * freq)[:, : d_model // 2]
  pe_LxD = np.zeros((length, d_model), dtype=np.float32)
  if layout == "halves":
    pe_LxD[:, : sines.shape[1]], pe_LxD[:, sines.shape[1] :] = sines, cosines
  else:
    pe_LxD[:, 0::2], pe_LxD[:, 1::2] = sines, cosines
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
  """Decode mode (a KV cache, `SelfAttention(decode=True)`): the positions of the T new tokens,
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
  forms: str = "reference"  # the model's (transformer.kernels.resolve): "cpu" takes kernels.projection

  @nn.compact
  def __call__(self, x):
    shape = (*x.shape[x.ndim - self.contract :], *self.features)
    kernel = self.param(
      "kernel", _kernel_init(self.kernel_init, self.std, self.names, self.contract), shape, _dtype(self.param_dtype)
    )
    x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
    if self.forms == "cpu":
      y = fast_projection.project(x, kernel, self.contract)
    else:
      y = jnp.tensordot(x, kernel, self.contract)
    if self.use_bias:
      bias = self.param("bias", _zeros(self.names[self.contract :]), self.features, _dtype(self.param_dtype))
      y = y + bias.astype(self.dtype)
    return y


def projections(cfg: BlockConfig, forms: str):
  """`Projection` with the block's bias, dtypes and initialisation and the model's forms: what every
  projection of a block is, given its features, logical names and name."""
  return functools.partial(
    Projection,
    use_bias=cfg.use_bias,
    dtype=cfg.dtype,
    param_dtype=cfg.param_dtype,
    kernel_init=cfg.kernel_init,
    forms=forms,
  )


# ---------------------------------------------------------------------------------------------
# Attention: softmax(scores) V over the keys a mask allows. Self-attention's scores are made by an
# attention mechanism (MECHANISMS); cross-attention's are dot products.


def mix(
  scores_BxHxTxS,
  v_BxSxHxK,
  mask_BxTxS,
  dropout: nn.Dropout | None = None,
  deterministic: bool = True,
  at=None,
  values: str = "bshk",
) -> jax.Array:
  """softmax(scores) V over the keys that `mask` allows (True = attend; None: causal), however the
  scores were made. Scores in float32; masking by jnp.where, never by adding a large negative number
  (which overflows in half precision). `at(name, x) -> x`, when given, is the attention module's
  named points (`point`): the masked "scores" and the probabilities, "pattern", pass through it.
  `values`: the layout of V ("bhsk": a KV cache's)."""
  if mask_BxTxS is None:
    mask_BxTxS = causal_mask(*scores_BxHxTxS.shape[-2:])
  scores_BxHxTxS = jnp.where(mask_BxTxS[:, None], scores_BxHxTxS.astype(jnp.float32), jnp.finfo(jnp.float32).min)
  if at is not None:
    scores_BxHxTxS = at("scores", scores_BxHxTxS)
  probs_BxHxTxS = jax.nn.softmax(scores_BxHxTxS, axis=-1)
  if at is not None:
    probs_BxHxTxS = at("pattern", probs_BxHxTxS)
  if dropout is not None:
    probs_BxHxTxS = dropout(probs_BxHxTxS, deterministic=deterministic)
  return jnp.einsum(f"bhts,{values}->bthk", probs_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK)


def dot_product_scores(attn, x_BxTxD, q_BxTxHxK, k_BxSxHxK, positions) -> jax.Array:
  """Q Kᵀ / √K, in float32: the 2017 paper's scores (a `Mechanism`'s scores; attn, x and positions unused)."""
  scale = 1.0 / math.sqrt(q_BxTxHxK.shape[-1])
  return jnp.einsum("bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK, preferred_element_type=jnp.float32) * scale


def attend(
  q_BxTxHxK,
  k_BxSxHxK,
  v_BxSxHxK,
  mask_BxTxS,
  implementation: str = "einsum",
  forms: str = "reference",
  dropout: nn.Dropout | None = None,
  deterministic: bool = True,
  at=None,
) -> jax.Array:
  """softmax(Q Kᵀ / √K) V over the keys that `mask` allows (True = attend; None: causal, query t sees
  keys 0..t). The reference is the einsum below (`forms="reference"`, `implementation="einsum"`, and
  always with named points to pass (`at`: a run read or patched) or attention dropout, which need the
  scores); otherwise the fused forms of transformer.kernels.attention compute the same (XLA's or
  cuDNN's kernel, causal blocks)."""
  if forms == "reference" or implementation == "einsum" or at is not None or dropout is not None:
    scores_BxHxTxS = dot_product_scores(None, None, q_BxTxHxK, k_BxSxHxK, None)
    return mix(scores_BxHxTxS, v_BxSxHxK, mask_BxTxS, dropout, deterministic, at)
  return fast_attention.attend(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask_BxTxS, implementation, forms)


def attend_cached(
  q_BxTxHxK,
  k_BxHxKxS,
  v_BxHxSxK,
  mask_BxTxS,
  forms: str = "reference",
  dropout: nn.Dropout | None = None,
  deterministic: bool = True,
  at=None,
) -> jax.Array:
  """`attend` over a KV cache (keys B x H x K x S, values B x H x S x K: CACHE_LAYOUTS). With the
  CPU's forms one new token per sequence (every step after the prompt) takes matrix-vector products
  (transformer.kernels.attention.one_token_cpu)."""
  if q_BxTxHxK.shape[1] == 1 and at is None and dropout is None and forms == "cpu":
    return fast_attention.one_token_cpu(q_BxTxHxK, k_BxHxKxS, v_BxHxSxK, mask_BxTxS)
  scale = 1.0 / math.sqrt(q_BxTxHxK.shape[-1])
  scores_BxHxTxS = jnp.einsum("bthk,bhks->bhts", q_BxTxHxK, k_BxHxKxS, preferred_element_type=jnp.float32) * scale
  return mix(scores_BxHxTxS, v_BxHxSxK, mask_BxTxS, dropout, deterministic, at, values="bhsk")


@dataclasses.dataclass(frozen=True)
class Mechanism:
  """An attention mechanism: how self-attention makes its scores, and so what the KV cache keeps.

  `scores(attn, x_BxTxD, q_BxTxHxK, k_BxSxHxK, positions) -> scores_BxHxTxS`: query t's score for
  key s, before the mask and the softmax (`mix`). `attn` is the calling `SelfAttention`: parameters
  a mechanism needs are made through it (`attn.param`, `attn.projection`), so they live in the
  block's "attn" parameters. `positions` = (of the queries B x T, of the keys B x S): each token's
  position in its own sequence (a packed document's start from 0, padding takes none).
  `keys`: the scores read queries and keys (the fused q/k/v projection; rotary positions and qk_norm
  act on them), and the KV cache keeps the keys with the values; without, q and k are None and the
  cache keeps values alone. A mechanism whose scores are by position has the model's `attn.max_len`
  positions (the longest sequence it takes). Register one with `register_mechanism`; then
  config.model.block.attention_mechanism takes its name."""

  scores: Callable[..., jax.Array]
  keys: bool = True


def synthesizer_dense_scores(attn, x_BxTxD, q_BxTxHxK, k_BxSxHxK, positions) -> jax.Array:
  """Dense Synthesizer (Tay et al. 2020): for head h, ReLU(x A_h + b_1) B_h + b_2 gives the query
  token's scores for all max_len positions, of which each key's position is taken. No keys."""
  cfg, (q_positions_BxT, k_positions_BxS) = attn.cfg, positions
  H, K, L = cfg.num_heads, cfg.head_dim, attn.max_len
  hidden_BxTxHxK = jax.nn.relu(attn.projection((H, K), ("embed", "heads", "kv"), name="synth_hidden")(x_BxTxD))
  init = (
    nn.initializers.normal(0.02)
    if cfg.kernel_init == "gpt2"
    else nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=1, out_axis=2, batch_axis=0)
  )
  partitioned = nn.with_logical_partitioning(init, ("heads", "kv", "position"))
  kernel_HxKxL = attn.param("synth_kernel", partitioned, (H, K, L), _dtype(cfg.param_dtype))
  bias_HxL = attn.param("synth_bias", _zeros(("heads", "position")), (H, L), _dtype(cfg.param_dtype))
  scores_BxHxTxL = (
    jnp.einsum("bthk,hkl->bhtl", hidden_BxTxHxK, kernel_HxKxL.astype(cfg.dtype), preferred_element_type=jnp.float32)
    + bias_HxL[None, :, None, :]
  )
  B, T, S = x_BxTxD.shape[0], q_positions_BxT.shape[1], k_positions_BxS.shape[1]
  index_BxHxTxS = jnp.broadcast_to(k_positions_BxS[:, None, None, :], (B, cfg.num_heads, T, S))
  return jnp.take_along_axis(scores_BxHxTxL, index_BxHxTxS, axis=-1)


def synthesizer_random_scores(attn, x_BxTxD, q_BxTxHxK, k_BxSxHxK, positions, fixed: bool = False) -> jax.Array:
  """Random Synthesizer: a learned max_len x max_len table of scores per head, indexed by (query
  position, key position); `fixed` keeps it at its random initialisation (a parameter that gets no
  gradient, so checkpoints and shardings need nothing new; it is not weight-decayed unless
  optimizer.decay_norms_and_biases). A logical name may appear once per array: the key-position axis
  is named None (replicated)."""
  cfg, (q_positions_BxT, k_positions_BxS) = attn.cfg, positions
  partitioned = nn.with_logical_partitioning(nn.initializers.normal(1.0), ("heads", "position", None))
  shape = (cfg.num_heads, attn.max_len, attn.max_len)
  table_HxLxL = attn.param("synth_table", partitioned, shape, _dtype(cfg.param_dtype))
  if fixed:
    table_HxLxL = jax.lax.stop_gradient(table_HxLxL)
  scores_HxBxTxS = table_HxLxL[:, q_positions_BxT[:, :, None], k_positions_BxS[:, None, :]]
  return jnp.moveaxis(scores_HxBxTxS, 0, 1)


# The attention mechanisms config.model.block.attention_mechanism names: query-key dot products, or
# (Tay et al. 2020, "Synthesizer") scores synthesized without keys, from each token alone ("dense") or
# learned position by position ("random"; "fixed_random" keeps them at their random initialisation).
MECHANISMS: dict[str, Mechanism] = {
  "dot_product": Mechanism(dot_product_scores),
  "synthesizer_dense": Mechanism(synthesizer_dense_scores, keys=False),
  "synthesizer_random": Mechanism(synthesizer_random_scores, keys=False),
  "synthesizer_fixed_random": Mechanism(functools.partial(synthesizer_random_scores, fixed=True), keys=False),
}


def register_mechanism(name: str, mechanism: Mechanism) -> None:
  """Adds an attention mechanism under `name` (config.model.block.attention_mechanism=name): it then
  trains, decodes with the KV cache, probes and shards like the built-in ones."""
  if not isinstance(mechanism, Mechanism):
    raise TypeError(f"register_mechanism({name!r}, ...) takes a layers.Mechanism, got {type(mechanism).__name__}")
  MECHANISMS[name] = mechanism


def _attention_dropout(cfg: BlockConfig) -> nn.Dropout | None:
  return nn.Dropout(cfg.attention_dropout_rate) if cfg.attention_dropout_rate else None


def point(module: nn.Module, name: str, x: jax.Array) -> jax.Array:
  """A named activation (`module`'s `name`), where transformer.interventions acts: replaced where the
  "patches" collection has an entry of this name ({"where": bool, "value": x's values there, "add":
  added everywhere}, each broadcast to x), then recorded in "activations" when a run asks for that
  collection. Otherwise x itself: a run that asks for neither compiles to the same program."""
  if module.has_variable("patches", name):
    patch = module.get_variable("patches", name)
    x = jnp.where(patch["where"], patch["value"].astype(x.dtype), x) + patch["add"].astype(x.dtype)
  if module.is_mutable_collection("activations"):
    module.put_variable("activations", name, x)
  return x


def _intervened(module: nn.Module) -> bool:
  """Whether a run reads or patches this module's named points (`point`): then attention takes the
  reference path, whose scores and probabilities exist to pass through them."""
  return module.is_mutable_collection("activations") or bool(module.variables.get("patches"))


def _points(module: nn.Module):
  """The attention module's named points for `mix` (`at`) when a run reads or patches them; otherwise
  None, and no score is materialised for them."""
  if not _intervened(module):
    return None
  return functools.partial(point, module)


def _normalised(cfg: BlockConfig, q_BxTxHxK, k_BxSxHxK):
  """With `qk_norm`, each head's queries and keys RMS-normalised (a learned scale per channel, made in
  the calling module as q_norm and k_norm): the scores stay bounded whatever the projections' scale,
  which allows larger learning rates."""
  if not cfg.qk_norm:
    return q_BxTxHxK, k_BxSxHxK
  head_norm = functools.partial(
    nn.RMSNorm,
    epsilon=cfg.layer_norm_epsilon,
    dtype=_dtype(cfg.dtype),
    param_dtype=_dtype(cfg.param_dtype),
    scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("kv",)),
  )
  return head_norm(name="q_norm")(q_BxTxHxK), head_norm(name="k_norm")(k_BxSxHxK)


class SelfAttention(nn.Module):
  """Multi-head self-attention, its scores made by the block's mechanism (MECHANISMS).

  With `decode=True` it keeps a KV cache in the "cache" collection: each call writes its keys and
  values (or values alone, for a mechanism without keys) at the cache index and attends over the
  whole cache (the caller's mask says which slots are real; see `CachePositions`). The cache's
  length is that of the input `init` sees."""

  cfg: BlockConfig
  forms: str = "reference"  # the model's fast forms (transformer.kernels.resolve)
  max_len: int = 0  # the model's longest sequence: a by-position mechanism's number of positions
  rope: bool = False  # queries and keys rotated by their positions (the model's positions == "rope")
  residual_std: float = 0.02  # of the output projection: GPT-2 scales it by 1/sqrt(2 * layers)
  decode: bool = False

  def projection(self, features, names, *, name: str, contract: int = 1, std: float = 0.02) -> Projection:
    """A projection of this block's kind (`projections`), created in this module."""
    return projections(self.cfg, self.forms)(features, names, contract=contract, std=std, name=name)

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxTxS, *, positions, deterministic: bool = True):
    """`positions`: (of the queries B x T, of the keys B x S), as `Mechanism.scores` takes them."""
    cfg, mechanism = self.cfg, MECHANISMS[self.cfg.attention_mechanism]
    H, K = cfg.num_heads, cfg.head_dim
    q_BxTxHxK = k_BxSxHxK = None
    if mechanism.keys:
      qkv_BxTx3xHxK = self.projection((3, H, K), ("embed", None, "heads", "kv"), name="qkv")(x_BxTxD)
      q_BxTxHxK, k_BxSxHxK, v_BxSxHxK = (qkv_BxTx3xHxK[:, :, i] for i in range(3))
      q_BxTxHxK, k_BxSxHxK = _normalised(cfg, q_BxTxHxK, k_BxSxHxK)
      if self.rope:  # this call's keys are its queries' tokens: both at the queries' positions
        q_BxTxHxK, k_BxSxHxK = rotary(q_BxTxHxK, positions[0]), rotary(k_BxSxHxK, positions[0])
      q_BxTxHxK = nn.with_logical_constraint(point(self, "q", q_BxTxHxK), ("batch", "length", "heads", "kv"))
      k_BxSxHxK = point(self, "k", k_BxSxHxK)
    else:
      v_BxSxHxK = self.projection((H, K), ("embed", "heads", "kv"), name="v")(x_BxTxD)
    v_BxSxHxK = point(self, "v", v_BxSxHxK)
    mixing = (_attention_dropout(cfg), deterministic, _points(self))  # mix's dropout and named points
    if self.decode:
      out_BxTxHxK = self._over_the_cache(
        mechanism, x_BxTxD, q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask_BxTxS, positions, mixing
      )
    elif mechanism.scores is dot_product_scores:  # dot products have fused forms (attend)
      out_BxTxHxK = attend(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask_BxTxS, cfg.attention, self.forms, *mixing)
    else:
      scores_BxHxTxS = mechanism.scores(self, x_BxTxD, q_BxTxHxK, k_BxSxHxK, positions)
      out_BxTxHxK = mix(scores_BxHxTxS, v_BxSxHxK, mask_BxTxS, *mixing)
    z_BxTxHxK = point(self, "z", out_BxTxHxK)  # each head's output, before the output projection
    return self.projection((cfg.d_model,), ("heads", "kv", "embed"), contract=2, std=self.residual_std, name="out")(
      z_BxTxHxK
    )

  def _over_the_cache(self, mechanism, x_BxTxD, q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, mask_BxTxS, positions, mixing):
    """Decoding: this call's keys and values (values alone without keys) written into the cache,
    then its queries' attention over the whole cache (keys B x H x K x S, values B x H x S x K)."""
    if not mechanism.keys:
      v_BxHxSxK = self.cached(value=v_BxTxHxK)["value"]
      scores_BxHxTxS = mechanism.scores(self, x_BxTxD, None, None, positions)
      return mix(scores_BxHxTxS, v_BxHxSxK, mask_BxTxS, *mixing, values="bhsk")
    cache = self.cached(key=k_BxTxHxK, value=v_BxTxHxK)
    k_BxHxKxS, v_BxHxSxK = cache["key"], cache["value"]
    if mechanism.scores is dot_product_scores:  # with its own form for one new token (attend_cached)
      return attend_cached(q_BxTxHxK, k_BxHxKxS, v_BxHxSxK, mask_BxTxS, self.forms, *mixing)
    scores_BxHxTxS = mechanism.scores(self, x_BxTxD, q_BxTxHxK, k_BxHxKxS.transpose(0, 3, 1, 2), positions)
    return mix(scores_BxHxTxS, v_BxHxSxK, mask_BxTxS, *mixing, values="bhsk")

  def cached(self, **arrays_BxTxHxK):
    """Writes this call's T keys and/or values at the cache index; returns the whole cache by name, in
    the layouts CACHE_LAYOUTS gives (those the products read, so that a step's write is its only copy
    of the cache)."""
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
      written = jax.lax.dynamic_update_slice_in_dim(
        cache[name].value, x.astype(cache[name].value.dtype), i, axis=names.index("length")
      )
      cache[name].value = nn.with_logical_constraint(written, names)
    index.value = i + next(iter(arrays_BxTxHxK.values())).shape[1]
    return {name: variable.value for name, variable in cache.items()}


class CrossAttention(nn.Module):
  """Attention from x (queries: the decoder's tokens) to `context_BxSxD` (keys and values: the
  encoder's output), by dot products. With `decode=True` the context's keys and values are made once,
  on the call that passes `context_BxSxD`, and read from the cache on the calls that pass None."""

  cfg: BlockConfig
  forms: str = "reference"
  residual_std: float = 0.02
  decode: bool = False

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxTxS, *, context_BxSxD=None, deterministic: bool = True):
    cfg, projection = self.cfg, projections(self.cfg, self.forms)
    H, K = cfg.num_heads, cfg.head_dim
    q_BxTxHxK = projection((H, K), ("embed", "heads", "kv"), name="q")(x_BxTxD)
    kv = projection((2, H, K), ("embed", None, "heads", "kv"), name="kv")
    kv_BxSx2xHxK = kv(context_BxSxD) if context_BxSxD is not None else None
    if self.decode:
      cached = self.variable("cache", "context_kv", lambda: kv_BxSx2xHxK)
      if context_BxSxD is not None:
        cached.value = kv_BxSx2xHxK
      kv_BxSx2xHxK = cached.value
    q_BxTxHxK, k_BxSxHxK = _normalised(cfg, q_BxTxHxK, kv_BxSx2xHxK[:, :, 0])
    q_BxTxHxK = nn.with_logical_constraint(point(self, "q", q_BxTxHxK), ("batch", "length", "heads", "kv"))
    k_BxSxHxK, v_BxSxHxK = point(self, "k", k_BxSxHxK), point(self, "v", kv_BxSx2xHxK[:, :, 1])
    out_BxTxHxK = attend(
      q_BxTxHxK,
      k_BxSxHxK,
      v_BxSxHxK,
      mask_BxTxS,
      cfg.attention,
      self.forms,
      _attention_dropout(cfg),
      deterministic,
      _points(self),
    )
    z_BxTxHxK = point(self, "z", out_BxTxHxK)
    return projection((cfg.d_model,), ("heads", "kv", "embed"), contract=2, std=self.residual_std, name="out")(
      z_BxTxHxK
    )


# A KV cache's layouts, as logical axis names (sharded like the activations that fill it). A call
# writes B x T x H x K arrays, transposed into them. Keys: positions last, so that a new token's scores
# run along contiguous rows; values: positions third, so that a step writes K contiguous numbers per
# head instead of K numbers S apart. (With B x S x H x K, XLA:CPU copied the whole cache every step.)
CACHE_LAYOUTS = {"key": ("batch", "heads", "kv", "length"), "value": ("batch", "heads", "length", "kv")}
_WRITTEN_AXES = ("batch", "length", "heads", "kv")


class MLP(nn.Module):
  cfg: BlockConfig
  residual_std: float = 0.02
  forms: str = "reference"

  @nn.compact
  def __call__(self, x_BxTxD):
    cfg, projection = self.cfg, projections(self.cfg, self.forms)
    h_BxTxF = projection((cfg.mlp_width,), ("embed", "mlp"), name="fc")(x_BxTxD)
    if cfg.activation == "swiglu":  # gated: silu of a second projection of x scales each hidden unit
      gate_BxTxF = projection((cfg.mlp_width,), ("embed", "mlp"), name="gate")(x_BxTxD)
      h_BxTxF = jax.nn.silu(gate_BxTxF) * h_BxTxF
    else:
      # The activation's backward pass recomputes it from its saved input (jax.checkpoint). Autodiff
      # would save the tanh GELU's tanh instead and rebuild the input from the product's output and
      # the bias, so that its backward pass would read three B x T x F tensors, not two. The same
      # losses and gradients; without a gradient it is the plain activation.
      h_BxTxF = jax.checkpoint(ACTIVATIONS[cfg.activation])(h_BxTxF)
    h_BxTxF = nn.with_logical_constraint(point(self, "mlp_hidden", h_BxTxF), ("batch", "length", "mlp"))
    return projection((cfg.d_model,), ("mlp", "embed"), std=self.residual_std, name="proj")(h_BxTxF)


class Block(nn.Module):
  """Self-attention, optional cross-attention, MLP; each a residual branch with LayerNorm before
  it (pre-LN, GPT-2) or after the sum (post-LN, the 2017 paper). `forms`, `max_len` and `rope` are
  the model's (see SelfAttention)."""

  cfg: BlockConfig
  cross_attention: bool = False
  residual_std: float = 0.02
  deterministic: bool = True  # no dropout; an attribute, not an argument, so scan/remat see no bool
  decode: bool = False  # self-attention through a KV cache
  forms: str = "reference"
  max_len: int = 0
  rope: bool = False

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxTxT, context_BxSxD=None, context_mask_BxTxS=None, positions=None):
    cfg, deterministic = self.cfg, self.deterministic
    drop = nn.Dropout(cfg.dropout_rate)

    def residual(x, branch, norm, out: str):  # `out`: the named point of the branch's output
      if cfg.pre_layer_norm:
        return x + drop(point(self, out, branch(norm(x))), deterministic=deterministic)
      return norm(x + drop(point(self, out, branch(x)), deterministic=deterministic))

    common = dict(forms=self.forms, residual_std=self.residual_std, decode=self.decode)
    attn = SelfAttention(cfg, max_len=self.max_len, rope=self.rope, name="attn", **common)
    x_BxTxD = point(self, "resid_pre", x_BxTxD)
    x_BxTxD = residual(
      x_BxTxD,
      lambda h: attn(h, mask_BxTxT, positions=positions, deterministic=deterministic),
      norm(cfg, "ln_1"),
      "attn_out",
    )
    x_BxTxD = point(self, "resid_mid", x_BxTxD)
    if self.cross_attention:
      cross = CrossAttention(cfg, name="cross_attn", **common)
      x_BxTxD = residual(
        x_BxTxD,
        lambda h: cross(h, context_mask_BxTxS, context_BxSxD=context_BxSxD, deterministic=deterministic),
        norm(cfg, "ln_cross"),
        "cross_attn_out",
      )
      x_BxTxD = point(self, "resid_mid_cross", x_BxTxD)
    if not cfg.attention_only:
      x_BxTxD = residual(x_BxTxD, MLP(cfg, self.residual_std, self.forms, name="mlp"), norm(cfg, "ln_2"), "mlp_out")
    x_BxTxD = point(self, "resid_post", x_BxTxD)
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


class Stack(nn.Module):
  """`num_layers` blocks, unrolled (`layer_0`, `layer_1`, ...) or scanned (`layers`, with a leading
  `layers` axis on every parameter: one compiled block, faster compiles for deep models).
  `deterministic` and `decode` are call arguments, as for every model (see transformer.models);
  `forms`, `max_len` and `rope` are the model's (see SelfAttention)."""

  cfg: BlockConfig
  num_layers: int
  scan: bool = False
  remat_policy: str = "none"
  cross_attention: bool = False
  forms: str = "reference"
  max_len: int = 0
  rope: bool = False

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
    """`positions`: (of the queries, of the keys) of self-attention (SelfAttention)."""
    check_remat_policy(self.remat_policy)
    block = Block
    if self.remat_policy != "none" and not decode:  # no backward pass when decoding
      block = nn.remat(Block, policy=REMAT_POLICIES[self.remat_policy], prevent_cse=not self.scan)
    block = functools.partial(
      block,
      self.cfg,
      self.cross_attention,
      0.02 / math.sqrt(2 * self.num_layers),  # GPT-2's init of the projections into the residual stream
      deterministic,
      decode,
      forms=self.forms,
      max_len=self.max_len,
      rope=self.rope,
    )
    inputs = (x_BxTxD, mask_BxTxT, context_BxSxD, context_mask_BxTxS, positions)
    if not self.scan:
      for i in range(self.num_layers):
        x_BxTxD = block(name=f"layer_{i}")(x_BxTxD, *inputs[1:])
      return x_BxTxD
    scanned = nn.scan(
      lambda mdl, x, *args: (mdl(x, *args), None),
      variable_axes={"params": 0, "cache": 0, "activations": 0, "patches": 0},
      split_rngs={"params": True, "dropout": True},
      length=self.num_layers,
      in_axes=(nn.broadcast,) * 4,
      metadata_params={nn.PARTITION_NAME: "layers"},
    )
    return scanned(block(name="layers"), *inputs)[0]


def stack_layers(params: dict, num_layers: int) -> dict:
  """Unrolled params (`layer_0` ... `layer_{n-1}`) -> scanned params (`layers`, leading axis n)."""
  layers = [params[f"layer_{i}"] for i in range(num_layers)]
  rest = {k: v for k, v in params.items() if not k.startswith("layer_")}
  return {**rest, "layers": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}


def unstack_layers(params: dict, num_layers: int) -> dict:
  """The inverse of `stack_layers`."""
  rest = {k: v for k, v in params.items() if k != "layers"}
  return {**rest, **{f"layer_{i}": jax.tree.map(lambda x: x[i], params["layers"]) for i in range(num_layers)}}
