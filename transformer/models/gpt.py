"""GPT-2: a decoder-only transformer language model, as a pure Flax linen module.

  tokens_BxT -> token embedding + learned position embedding -> dropout
             -> N pre-LayerNorm blocks (causal self-attention, GELU-tanh MLP, each residual)
             -> final LayerNorm -> logits over the vocabulary (head tied to the token embedding)

That is GPT-2, the defaults. Each later change of the recipe is one config value away (and GPT-2's
checkpoint format holds none of them): `positions` ("rope", "sinusoidal", "none"),
`block.norm="rms_norm"`, `block.activation` ("relu2", "swiglu", "geglu"), `block.qk_norm`, an untied head
(`tie_embeddings=False`), `logits_softcap`; and those of the open families (Llama, Mistral, Qwen, SmolLM,
Gemma, Pythia, OLMo: their weights through transformer.models.formats), each a field of
`layers.BlockConfig` or of this config: grouped-query attention, rotary bases and scalings, sliding windows
with `global_layers`, soft-capped scores, parallel blocks, norms after the branches, `scale_embeddings`.

Presets `gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl` have the exact shapes of OpenAI's GPT-2
(124,439,808 / 354,823,168 / 774,030,080 / 1,557,611,200 parameters with the tied head), so real
weights load into them (`transformer.models.formats.gpt2.import_hf_gpt2`); `cpu-small` and `cpu-tiny`
train on a laptop CPU.

    >>> cfg = preset("gpt2")
    >>> model = GPT(cfg)
    >>> params = model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
    >>> logits_BxTxV = model.apply({"params": params}, tokens_BxT)
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from transformer import kernels, layers
from transformer.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class GPTConfig:
  family: ClassVar[str] = "gpt"  # config.model.family (transformer.models.families())
  vocab_size: int = 50257
  max_len: int = 1024  # size of the learned position table: the longest sequence (GPT-2's n_ctx)
  num_layers: int = 12
  # Width, heads, dropout, dtypes, attention: GPT-2's pre-LayerNorm, GELU-tanh blocks (the defaults).
  block: layers.BlockConfig = layers.BlockConfig()
  # How a token's position enters: GPT-2's "learned" table added to the embeddings, the 2017 paper's
  # fixed "sinusoidal" one, "rope" (queries and keys rotated in every attention, no table), or
  # "none" (causal attention alone tells positions apart; Haviv et al. 2022).
  positions: str = "learned"
  tie_embeddings: bool = True  # the output head is the token embedding, transposed
  logits_softcap: float = 0.0  # > 0: logits = cap * tanh(logits / cap) (Gemma 2, modded-nanogpt); 0: none
  # With block.sliding_window: the layers that attend to every position (Gemma 2: the odd ones; Gemma
  # 3: every sixth); the others are local. Empty: every layer local (Mistral).
  global_layers: tuple[int, ...] = ()
  scale_embeddings: bool = False  # the token embeddings times sqrt(d_model) as they enter (Gemma)
  scan_layers: bool = False  # one scanned block instead of N unrolled ones (faster compiles)
  remat_policy: str = "none"  # "none" | "dots" | "full": what the backward pass recomputes
  kernels: str = "auto"  # "auto" | "reference" | "cpu" | "accelerator": faster forms of ops (transformer.kernels)

  def replace(self, **changes) -> GPTConfig:
    """A copy with `changes`; the block's fields (d_model=..., num_heads=...) change the block."""
    return layers.replace_model(self, changes)

  def check(self) -> GPTConfig:
    """Raises ConfigError naming the field for values that cannot work; returns self."""
    if self.positions not in POSITIONS:
      raise ConfigError(f"unknown positions {self.positions!r}; choose one of {', '.join(POSITIONS)}")
    if self.logits_softcap < 0:
      raise ConfigError(f"logits_softcap must be >= 0 (0: no capping), got {self.logits_softcap}")
    layers.check_model_config(self, positive=("vocab_size", "max_len", "num_layers"))
    if any(not 0 <= i < self.num_layers for i in self.global_layers):
      raise ConfigError(
        f"global_layers={self.global_layers} names layers a {self.num_layers}-layer model lacks "
        f"(0 .. {self.num_layers - 1})"
      )
    return self


POSITIONS = ("learned", "sinusoidal", "rope", "none")


def softcap(logits, cap: float):
  """cap * tanh(logits / cap): logits bounded by ±cap, unchanged near 0 (no capping for cap 0)."""
  return cap * jnp.tanh(logits / cap) if cap else logits


def _gpt2(num_layers: int, num_heads: int, d_model: int, max_len: int = 1024) -> GPTConfig:
  return GPTConfig(
    max_len=max_len, num_layers=num_layers, block=layers.BlockConfig(d_model=d_model, num_heads=num_heads)
  )


PRESETS: dict[str, GPTConfig] = {
  "gpt2": _gpt2(num_layers=12, num_heads=12, d_model=768),
  "gpt2-medium": _gpt2(num_layers=24, num_heads=16, d_model=1024),
  "gpt2-large": _gpt2(num_layers=36, num_heads=20, d_model=1280),
  "gpt2-xl": _gpt2(num_layers=48, num_heads=25, d_model=1600),
  # Small enough to train on a 2-core CPU in minutes (vocab_size is set from the tokenizer).
  "cpu-small": _gpt2(max_len=256, num_layers=4, num_heads=4, d_model=256),
  "cpu-tiny": _gpt2(max_len=64, num_layers=2, num_heads=2, d_model=64),
}


def preset(name: str, **overrides) -> GPTConfig:
  if name not in PRESETS:
    raise ConfigError(f"unknown GPT preset {name!r}; presets are {', '.join(PRESETS)}")
  return PRESETS[name].replace(**overrides).check()


class GPT(nn.Module):
  """GPT-2 and its variants (`GPTConfig`). Three entry points, one set of parameters:
  `__call__` (tokens -> logits), `hidden_states` (tokens -> the final norm's output, what a
  classification head reads) and `output_logits` (a residual stream -> logits: the final norm and the
  head, which the logit lens applies to every layer). All three run `_forward`."""

  config: GPTConfig

  def __call__(
    self,
    tokens_BxT: jax.Array,
    *,
    valid_BxT: jax.Array | None = None,
    segments_BxT: jax.Array | None = None,
    deterministic: bool = True,
    decode: bool = False,
    last_only: bool = False,
  ) -> jax.Array:
    """Float32 logits for every position (`last_only`: for the last alone, B x 1 x V).

    valid_BxT: False marks padding (e.g. left-padded prompts of different lengths). Padding takes no
      position and no token attends to it, so a sequence's logits do not depend on its padding.
    segments_BxT: documents packed into one row (ids, equal within a document): attention stays
      inside a document and positions restart at each, so a document's logits do not depend on the
      documents before it in the row.
    decode: continue the tokens of earlier calls through the KV cache (the "cache" collection:
      `apply(..., mutable=["cache"])`, made by `generation.sampling.init_cache`). Returns the logits
      of the last position only, (B, 1, V): all that sampling the next token needs.
    last_only: the logits of the last position, computing in the last block only what they read (its
      query, attention output and MLP at that position): a loss at one position (modular arithmetic's
      answer) at a fraction of the cost. The same logits as the full run's last position.
    """
    return self._forward(
      tokens_BxT, valid_BxT, segments_BxT, deterministic, decode, until="logits", last_only=last_only
    )

  def hidden_states(self, tokens_BxT, *, valid_BxT=None, segments_BxT=None, deterministic: bool = True):
    """The final norm's output B x T x D (what `__call__` turns into logits)."""
    return self._forward(tokens_BxT, valid_BxT, segments_BxT, deterministic, False, until="hidden")

  def output_logits(self, x_BxTxD: jax.Array) -> jax.Array:
    """A residual stream B x T x D -> float32 logits: the final norm, the head (tied or its own) and
    the soft-cap, as `__call__` ends."""
    return self._forward(None, None, None, True, False, until="logits", residual_BxTxD=x_BxTxD)

  @nn.compact
  def _forward(
    self, tokens_BxT, valid_BxT, segments_BxT, deterministic, decode, *, until, residual_BxTxD=None, last_only=False
  ):
    """Tokens (or, given `residual_BxTxD`, the residual stream after the blocks) through the model,
    `until` "hidden" (the final norm's output) or "logits"."""
    cfg = self.config
    forms = kernels.resolve(cfg.kernels)  # the fast forms, decided once for the whole model
    wte = self._token_embedding()
    x_BxTxD = residual_BxTxD
    if x_BxTxD is None:
      positions_BxT, key_positions_BxS, mask_BxTxS = self._positions_and_mask(
        tokens_BxT, valid_BxT, segments_BxT, decode
      )
      x_BxTxD = self._embed(wte(tokens_BxT), positions_BxT, deterministic)
      positions = (positions_BxT, key_positions_BxS)
      x_BxTxD = self._blocks(forms)(
        x_BxTxD, mask_BxTxS, positions=positions, deterministic=deterministic, decode=decode, last_only=last_only
      )
    x_BxTxD = layers.point(self, "final_norm", layers.norm(cfg.block, "ln_f")(x_BxTxD))
    if until == "hidden":
      return x_BxTxD
    if decode:  # only the next token's logits are needed
      x_BxTxD = x_BxTxD[:, -1:]
    return self._head(wte, x_BxTxD, forms, decode)

  def _token_embedding(self) -> nn.Embed:
    """The token embedding table (V x D), also the tied head's."""
    block = self.config.block
    return nn.Embed(
      self.config.vocab_size,
      block.d_model,
      dtype=jnp.dtype(block.dtype),
      param_dtype=jnp.dtype(block.param_dtype),
      name="wte",
      embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed")),
    )

  def _blocks(self, forms: str) -> layers.Stack:
    return blocks(self.config, forms, name="h")

  def _positions_and_mask(self, tokens_BxT, valid_BxT, segments_BxT, decode: bool):
    """(positions of the tokens B x T, of the keys B x S, attention mask B x T x S or None: causal)."""
    B, T = tokens_BxT.shape
    if decode and segments_BxT is not None:
      raise ValueError("decoding continues one document: segments_BxT is for packed training rows")
    if decode:  # the keys are the cache's slots
      cache_positions = layers.CachePositions(name="positions")
      positions_BxT, mask_BxTxS, key_positions_BxS = cache_positions(
        valid_BxT if valid_BxT is not None else jnp.ones((B, T), bool)
      )
      return positions_BxT, key_positions_BxS, mask_BxTxS
    if T > self.config.max_len:
      raise ConfigError(
        f"a sequence of {T} tokens is longer than max_len={self.config.max_len} "
        f"(the position table); use at most {self.config.max_len} tokens"
      )
    if valid_BxT is None and segments_BxT is None:
      return jnp.arange(T)[None], jnp.arange(T)[None], None
    positions_BxT = layers.segment_positions(valid_BxT, segments_BxT)
    return positions_BxT, positions_BxT, layers.self_attention_mask(valid_BxT, segments_BxT, causal=True)

  def _embed(self, tokens_BxTxD, positions_BxT, deterministic: bool):
    """The residual stream's start: token embeddings plus the positions' (learned or sinusoidal;
    rotary positions act in attention instead), then dropout."""
    cfg, block = self.config, self.config.block
    dtype = jnp.dtype(block.dtype)
    if cfg.scale_embeddings:  # Gemma: sqrt(d_model), rounded to the compute dtype as transformers rounds it
      tokens_BxTxD = tokens_BxTxD * jnp.asarray(block.d_model**0.5, dtype)
    x_BxTxD = layers.point(self, "embed", tokens_BxTxD)
    if cfg.positions == "learned":
      wpe_LxD = self.param(
        "wpe",
        nn.with_logical_partitioning(nn.initializers.normal(0.01), ("position", "embed")),
        (cfg.max_len, block.d_model),
        jnp.dtype(block.param_dtype),
      )
      x_BxTxD = x_BxTxD + layers.point(self, "pos_embed", wpe_LxD.astype(dtype)[positions_BxT])
    elif cfg.positions == "sinusoidal":
      pe_LxD = jnp.asarray(layers.sinusoidal_positions(cfg.max_len, block.d_model), dtype)
      x_BxTxD = x_BxTxD + layers.point(self, "pos_embed", pe_LxD[positions_BxT])
    x_BxTxD = nn.Dropout(block.dropout_rate)(x_BxTxD, deterministic=deterministic)
    x_BxTxD = nn.with_logical_constraint(x_BxTxD, ("batch", "length", "embed"))
    return x_BxTxD

  def _head(self, wte: nn.Embed, x_BxTxD, forms: str, decode: bool):
    """Float32 logits: the token embedding, transposed (tied), or a head of its own; softcapped."""
    cfg, dtype = self.config, jnp.dtype(self.config.block.dtype)
    fast_tied = kernels.form("tied_head_decode", forms) if decode else None
    if cfg.tie_embeddings and fast_tied:
      logits_BxTxV = fast_tied(wte.embedding.astype(dtype), x_BxTxD)
    elif cfg.tie_embeddings:
      logits_BxTxV = wte.attend(x_BxTxD)
    else:
      logits_BxTxV = nn.Dense(
        cfg.vocab_size,
        use_bias=False,
        dtype=dtype,
        param_dtype=jnp.dtype(cfg.block.param_dtype),
        kernel_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ("embed", "vocab")),
        name="lm_head",
      )(x_BxTxD)
    # Softmax/cross-entropy in float32 whatever the compute dtype.
    logits_BxTxV = layers.point(self, "logits", softcap(logits_BxTxV.astype(jnp.float32), cfg.logits_softcap))
    return nn.with_logical_constraint(logits_BxTxV, ("batch", "length", "vocab"))


def blocks(config: GPTConfig, forms: str, **module) -> layers.Stack:
  """The model's stack of blocks (`module`: its name, or parent=None for one of its own, as a
  patching sweep makes to run one block at a time: transformer.interp.patching)."""
  return layers.Stack(
    config.block,
    config.num_layers,
    scan=config.scan_layers,
    remat_policy=config.remat_policy,
    forms=forms,
    max_len=config.max_len,
    rope=config.positions == "rope",
    global_layers=config.global_layers,
    **module,
  )


def unembedding(config: GPTConfig, params) -> jax.Array:
  """The head's matrix, V x D: a token's row is the direction its logit reads off the final norm's
  output (the token embedding when tied, else lm_head's kernel transposed). What `GPT.output_logits`
  multiplies by, for the attributions that split it into components (transformer.interp.interventions)."""
  return params["wte"]["embedding"] if config.tie_embeddings else params["lm_head"]["kernel"].T


def next_token_nll(logits_BxTxV: jax.Array, targets_BxT: jax.Array, forms: str = "reference") -> jax.Array:
  """-log softmax(logits)[target] at each position, in float32: a language model's loss (the GPT's and the
  LSTM's, transformer.tasks.lm) and what the instrument scores a run by (interp.interventions). `forms`
  (kernels.resolve of config.model.kernels): the accelerators' form has its backward pass written out
  (kernels.lm_loss)."""
  fast = kernels.form("lm_loss", forms)
  if fast:
    return fast(logits_BxTxV, targets_BxT)
  return optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV.astype(jnp.float32), targets_BxT)


def param_shapes(config: GPTConfig):
  """The parameter tree as ShapeDtypeStructs (with their logical axis metadata), allocating nothing."""
  model = GPT(config.check())
  tokens = jax.ShapeDtypeStruct((1, min(8, config.max_len)), jnp.int32)
  return jax.eval_shape(lambda t: model.init(jax.random.key(0), t), tokens)["params"]


def count_params(config: GPTConfig) -> int:
  return sum(x.size for x in jax.tree.leaves(nn.unbox(param_shapes(config))))
