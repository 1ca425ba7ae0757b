"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

  source_BxS -> embedding * sqrt(d) + sinusoidal positions -> dropout
             -> N encoder blocks (self-attention over the real source tokens, MLP)   = encoded_BxSxD
  target_BxT -> embedding * sqrt(d) + sinusoidal positions -> dropout
             -> N decoder blocks (causal self-attention, attention to encoded_BxSxD, MLP)
             -> logits over the target vocabulary (tied to the target embedding, or a separate head)

Post-LayerNorm as in the paper (`pre_layer_norm=False`; pre-LN adds a final LayerNorm to each
stack); source and target can share one embedding (a joint vocabulary). The blocks, attention and
KV cache are those of `transformer.layers`, shared with GPT.

    >>> model = Transformer(preset("cpu-small", vocab_size=8000))
    >>> logits_BxTxV = model.apply({"params": params}, source_BxS, target_in_BxT,
    ...                            source_valid_BxS=source_valid_BxS)
    >>> model.apply({"params": params}, ..., deterministic=False, rngs={"dropout": rng})  # training
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import kernels, layers
from transformer.errors import ConfigError

# The paper's blocks: post-LayerNorm, ReLU, Glorot-initialised (its tensor2tensor code), base's sizes.
PAPER_BLOCK = layers.BlockConfig(
  d_model=512,
  num_heads=8,
  d_mlp=2048,
  dropout_rate=0.1,
  layer_norm_epsilon=1e-6,
  pre_layer_norm=False,
  activation="relu",
  kernel_init="xavier",
)


@dataclasses.dataclass(frozen=True)
class Seq2SeqConfig:
  family: ClassVar[str] = "transformer"  # config.model.family (transformer.models.families())
  vocab_size: int = 0  # joint source/target vocabulary (0: taken from the tokenizer)
  max_len: int = 256  # longest source or target sequence (positions are sinusoidal, not learned)
  num_layers: int = 6  # encoder layers, and decoder layers unless num_decoder_layers says otherwise
  # 0: num_layers. A deep encoder with a shallow decoder (Kasai et al. 2021, "Deep Encoder, Shallow
  # Decoder") decodes faster, as the decoder runs once per output token; whether it translates as
  # well depends on the data (experiments/README.md, the translation levers).
  num_decoder_layers: int = 0
  # The encoder's and the decoder's blocks (block.pre_layer_norm=True: pre-LN, easier to train deep;
  # block.attention_mechanism applies to self-attention, cross-attention is dot-product).
  block: layers.BlockConfig = PAPER_BLOCK
  # Training drops whole source tokens (their embedding is zeroed; position kept) at this rate: word
  # dropout (Gal & Ghahramani 2016), which Sennrich & Zhang (2019) find helps low-resource NMT.
  source_word_dropout: float = 0.0
  share_embeddings: bool = True  # one embedding for source and target (a joint vocabulary)
  tie_output: bool = True  # the output head is the target embedding, transposed
  # Marian's (OPUS-MT) variants, which its weights need: the sinusoids "interleaved" (the paper's) or
  # in "halves" (all sines, then all cosines); the embeddings scaled by sqrt(d_model) (the paper's
  # section 3.4) or not; a learned bias added to every output logit (Marian's final_logits_bias).
  sinusoids: str = "interleaved"
  scale_embeddings: bool = True
  logits_bias: bool = False
  scan_layers: bool = False
  remat_policy: str = "none"
  kernels: str = "auto"  # "auto" | "reference" | "cpu" | "accelerator": faster forms of ops (transformer.kernels)

  def decoder_layers(self) -> int:
    return self.num_decoder_layers or self.num_layers

  def replace(self, **changes) -> Seq2SeqConfig:
    """A copy with `changes`; the block's fields (d_model=..., num_heads=...) change the block."""
    return layers.replace_model(self, changes)

  def check(self) -> Seq2SeqConfig:
    """Raises ConfigError naming the field for values that cannot work; returns self."""
    layers.check_model_config(self, positive=("vocab_size", "max_len", "num_layers"))
    if self.num_decoder_layers < 0:
      raise ConfigError(f"num_decoder_layers must be >= 0 (0: as many as num_layers), got {self.num_decoder_layers}")
    if not 0.0 <= self.source_word_dropout < 1.0:
      raise ConfigError(f"source_word_dropout must be in [0, 1), got {self.source_word_dropout}")
    if self.sinusoids not in layers.SINUSOID_LAYOUTS:
      raise ConfigError(f"unknown sinusoids {self.sinusoids!r}; choose one of {', '.join(layers.SINUSOID_LAYOUTS)}")
    return self


PRESETS: dict[str, Seq2SeqConfig] = {
  # The paper's Table 3: base (65M params at 37k vocab) and big (213M).
  "transformer_base": Seq2SeqConfig(num_layers=6, block=PAPER_BLOCK),
  "transformer_big": Seq2SeqConfig(
    num_layers=6, block=PAPER_BLOCK.replace(num_heads=16, d_model=1024, d_mlp=4096, dropout_rate=0.3)
  ),
  # Trains on a 2-core CPU in minutes.
  "cpu-small": Seq2SeqConfig(max_len=64, num_layers=3, block=PAPER_BLOCK.replace(num_heads=4, d_model=256, d_mlp=1024)),
  "cpu-tiny": Seq2SeqConfig(
    max_len=32, num_layers=2, block=PAPER_BLOCK.replace(num_heads=2, d_model=64, d_mlp=128, dropout_rate=0.0)
  ),
}


def preset(name: str, **overrides) -> Seq2SeqConfig:
  if name not in PRESETS:
    raise ConfigError(f"unknown Transformer preset {name!r}; presets are {', '.join(PRESETS)}")
  return PRESETS[name].replace(**overrides).check()


class EmbeddedConfig(Protocol):
  """What `Embed` reads of a model config: the encoder-decoder's and the encoder-only model's have it."""

  vocab_size: int
  max_len: int
  block: layers.BlockConfig


class Embed(nn.Module):
  """Token embedding * sqrt(d_model) + sinusoidal position, then dropout (the paper's section 3.4).
  `config`: a model config with vocab_size, max_len and a block (the encoder's too); `sinusoids` and
  `scale` are Seq2SeqConfig.sinusoids and .scale_embeddings (Marian's variants)."""

  config: EmbeddedConfig  # Seq2SeqConfig, or models.encoder's EncoderConfig
  sinusoids: str = "interleaved"
  scale: bool = True

  def setup(self):
    block = self.config.block
    self.table = nn.Embed(
      self.config.vocab_size,
      block.d_model,
      dtype=jnp.dtype(block.dtype),
      param_dtype=jnp.dtype(block.param_dtype),
      embedding_init=nn.with_logical_partitioning(nn.initializers.normal(block.d_model**-0.5), ("vocab", "embed")),
    )
    self.dropout = nn.Dropout(block.dropout_rate)

  def __call__(self, tokens_BxT, positions_BxT, deterministic: bool, word_dropout: float = 0.0):
    block = self.config.block
    pe_LxD = layers.sinusoidal_positions(self.config.max_len, block.d_model, self.sinusoids)
    pe_LxD = jnp.asarray(pe_LxD, jnp.dtype(block.dtype))
    tokens_BxTxD = self.table(tokens_BxT)
    if word_dropout and not deterministic:
      keep_BxT = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - word_dropout, tokens_BxT.shape)
      tokens_BxTxD = jnp.where(keep_BxT[..., None], tokens_BxTxD, 0)
    scale = math.sqrt(block.d_model) if self.scale else 1.0
    x_BxTxD = tokens_BxTxD * scale + pe_LxD[positions_BxT]
    return nn.with_logical_constraint(self.dropout(x_BxTxD, deterministic=deterministic), ("batch", "length", "embed"))

  def attend(self, x_BxTxD):
    return self.table.attend(x_BxTxD)


class Transformer(nn.Module):
  """The call convention of every model here (transformer.models): `deterministic=False` for
  training (dropout on), `decode=True` for step-by-step decoding with the KV cache; one module, one
  set of parameters for all three."""

  config: Seq2SeqConfig

  def setup(self):
    cfg = self.config
    forms = kernels.resolve(cfg.kernels)  # the fast forms, decided once for the whole model
    stack = lambda depth, cross: layers.Stack(
      cfg.block,
      depth,
      scan=cfg.scan_layers,
      remat_policy=cfg.remat_policy,
      cross_attention=cross,
      forms=forms,
      max_len=cfg.max_len,
    )
    self.encoder, self.decoder = stack(cfg.num_layers, False), stack(cfg.decoder_layers(), True)
    self.cache_positions = layers.CachePositions()  # decode mode only; it has no parameters
    embed = lambda: Embed(cfg, sinusoids=cfg.sinusoids, scale=cfg.scale_embeddings)
    self.source_embed = embed()
    self.target_embed = self.source_embed if cfg.share_embeddings else embed()
    if cfg.block.pre_layer_norm:
      self.encoder_norm = layers.norm(cfg.block)
      self.decoder_norm = layers.norm(cfg.block)
    if not cfg.tie_output:
      self.head = layers.Projection(
        (cfg.vocab_size,),
        ("embed", "vocab"),
        std=cfg.block.d_model**-0.5,
        use_bias=False,
        dtype=cfg.block.dtype,
        param_dtype=cfg.block.param_dtype,
        forms=forms,
      )
    if cfg.logits_bias:
      zeros = nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",))
      self.final_logits_bias = self.param(
        "final_logits_bias", zeros, (cfg.vocab_size,), jnp.dtype(cfg.block.param_dtype)
      )

  def encode(self, source_BxS, *, source_valid_BxS=None, source_segments_BxS=None, deterministic: bool = True):
    """encoded_BxSxD. Padding (source_valid False) is never attended to; with `source_segments_BxS`
    (packed rows: which pair each token is of) a token attends to its own sentence only, whose
    positions start at 0."""
    B, S = source_BxS.shape
    self._check_length(S, "source")
    valid_BxS = jnp.ones((B, S), bool) if source_valid_BxS is None else source_valid_BxS
    # Right padding: without segments a sentence's positions are its indices.
    positions_BxS = (
      jnp.arange(S)[None] if source_segments_BxS is None else layers.segment_positions(None, source_segments_BxS)
    )
    x_BxSxD = self.source_embed(source_BxS, positions_BxS, deterministic, self.config.source_word_dropout)
    mask_BxSxS = layers.self_attention_mask(valid_BxS, source_segments_BxS, causal=False)
    x_BxSxD = self.encoder(x_BxSxD, mask_BxSxS, positions=(positions_BxS, positions_BxS), deterministic=deterministic)
    return self.encoder_norm(x_BxSxD) if self.config.block.pre_layer_norm else x_BxSxD

  def decode_logits(
    self,
    encoded_BxSxD,
    target_in_BxT,
    *,
    source_valid_BxS=None,
    source_segments_BxS=None,
    target_segments_BxT=None,
    deterministic: bool = True,
    decode: bool = False,
  ):
    """Logits (float32) for the next target token at every position of `target_in_BxT`.

    With `decode=True` this continues earlier calls through the KV cache ("cache" collection,
    `mutable=["cache"]`): pass `encoded_BxSxD` on the first call (its keys/values are cached) and
    None after; `source_valid_BxS` on every call. Packed rows (training) give both segment ids: a
    target token reads its own sentence's earlier tokens and its own pair's source only."""
    B, T = target_in_BxT.shape
    if decode:
      positions_BxT, mask_BxTxS, key_positions_BxS = self.cache_positions(jnp.ones((B, T), bool))
    else:
      self._check_length(T, "target")
      if target_segments_BxT is None:
        positions_BxT, mask_BxTxS = jnp.arange(T)[None], None  # None: causal (layers.mix)
      else:
        positions_BxT = layers.segment_positions(None, target_segments_BxT)
        mask_BxTxS = layers.self_attention_mask(None, target_segments_BxT, causal=True)
      key_positions_BxS = positions_BxT
    cross_mask_BxTxS = None
    if source_valid_BxS is not None:
      cross_mask_BxTxS = source_valid_BxS[:, None, :]
    elif encoded_BxSxD is not None:
      cross_mask_BxTxS = jnp.ones((B, 1, encoded_BxSxD.shape[1]), bool)
    if target_segments_BxT is not None:
      same_BxTxS = target_segments_BxT[:, :, None] == source_segments_BxS[:, None, :]
      cross_mask_BxTxS = cross_mask_BxTxS & same_BxTxS
      # A padding query (segment 0) has no source: let it read all of it rather than nothing.
      cross_mask_BxTxS = cross_mask_BxTxS | (target_segments_BxT == 0)[:, :, None]
    y_BxTxD = self.target_embed(target_in_BxT, positions_BxT, deterministic)
    y_BxTxD = self.decoder(
      y_BxTxD,
      mask_BxTxS,
      encoded_BxSxD,
      cross_mask_BxTxS,
      positions=(positions_BxT, key_positions_BxS),
      deterministic=deterministic,
      decode=decode,
    )
    return self.output_logits(y_BxTxD)

  def output_logits(self, y_BxTxD):
    """The decoder's residual stream -> float32 logits: the final norm (pre-LN) and the output head.
    (The logit lens applies it to every layer's residual: transformer.interp.probes.)"""
    if self.config.block.pre_layer_norm:
      y_BxTxD = self.decoder_norm(y_BxTxD)
    logits_BxTxV = self.target_embed.attend(y_BxTxD) if self.config.tie_output else self.head(y_BxTxD)
    logits_BxTxV = logits_BxTxV.astype(jnp.float32)
    if self.config.logits_bias:
      logits_BxTxV = logits_BxTxV + self.final_logits_bias.astype(jnp.float32)
    return nn.with_logical_constraint(logits_BxTxV, ("batch", "length", "vocab"))

  def __call__(
    self,
    source_BxS,
    target_in_BxT,
    *,
    source_valid_BxS=None,
    source_segments_BxS=None,
    target_segments_BxT=None,
    deterministic: bool = True,
    decode: bool = False,
  ):
    if (source_segments_BxS is None) != (target_segments_BxT is None):
      raise ValueError("packed rows need both source_segments_BxS and target_segments_BxT")
    encoded_BxSxD = self.encode(
      source_BxS,
      source_valid_BxS=source_valid_BxS,
      source_segments_BxS=source_segments_BxS,
      deterministic=deterministic,
    )
    return self.decode_logits(
      encoded_BxSxD,
      target_in_BxT,
      source_valid_BxS=source_valid_BxS,
      source_segments_BxS=source_segments_BxS,
      target_segments_BxT=target_segments_BxT,
      deterministic=deterministic,
      decode=decode,
    )

  def _check_length(self, length: int, what: str) -> None:
    if length > self.config.max_len:
      raise ConfigError(
        f"a {what} of {length} tokens is longer than max_len={self.config.max_len}; "
        f"raise model.max_len or drop longer pairs (data.max_len)"
      )


class Ensemble(nn.Module):
  """Several encoder-decoders over one vocabulary decoding as one model: the next token's score is
  the mean of the members' log-probabilities (fairseq's `--path a.pt:b.pt`), so greedy decoding
  takes the argmax of their geometric mean and beam search ranks hypotheses by it.

  Independently trained models make different errors, and averaging their distributions cancels
  part of them, at the members' decoding cost (what it gains on the Ding pairs: experiments/README.md,
  the translation levers). The members may
  differ in depth, width or norm placement; they must share the tokenizer
  (transformer.inference.restore_ensemble checks it). Params: {"member_0": the first's params, ...}.
  It has the decoding methods of `Transformer` (encode, decode_logits and __call__ with
  decode=True), which is all generation.beam_search uses; it does not train.

    >>> ensemble = Ensemble((config_a, config_b))
    >>> beam_search.translate_ids(ensemble, {"member_0": params_a, "member_1": params_b}, sources, ...)
  """

  members: tuple[Seq2SeqConfig, ...]

  def setup(self):
    if len({c.vocab_size for c in self.members}) != 1:
      raise ConfigError(
        f"an ensemble's members must share one vocabulary, got vocab_size {[c.vocab_size for c in self.members]}"
      )
    self.models = [Transformer(c, name=f"member_{i}") for i, c in enumerate(self.members)]

  @property
  def config(self) -> Seq2SeqConfig:
    """What decoding reads of a model's config (vocab_size, max_len): the first member's, with
    the shortest member's max_len."""
    return self.members[0].replace(max_len=min(c.max_len for c in self.members))

  def encode(self, source_BxS, *, source_valid_BxS=None):
    """(each member's encoded_BxSxD, ...)."""
    return tuple(m.encode(source_BxS, source_valid_BxS=source_valid_BxS) for m in self.models)

  def decode_logits(self, encoded, target_in_BxT, *, source_valid_BxS=None, decode: bool = False):
    """The mean of the members' log-probabilities for the next token (float32, B × T × V; already
    normalised per member, so log_softmax of it is their normalised geometric mean). `encoded`:
    `encode`'s tuple, or None on cached decoding steps."""
    encoded = encoded if encoded is not None else (None,) * len(self.models)
    log_probs = [
      jax.nn.log_softmax(m.decode_logits(e, target_in_BxT, source_valid_BxS=source_valid_BxS, decode=decode))
      for m, e in zip(self.models, encoded)
    ]
    return sum(log_probs) / len(log_probs)

  def __call__(self, source_BxS, target_in_BxT, *, source_valid_BxS=None, decode: bool = False):
    encoded = self.encode(source_BxS, source_valid_BxS=source_valid_BxS)
    return self.decode_logits(encoded, target_in_BxT, source_valid_BxS=source_valid_BxS, decode=decode)
