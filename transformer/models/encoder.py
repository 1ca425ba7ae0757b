"""An encoder-only Transformer: the encoder of "Attention Is All You Need" on its own, for problems
that label a text (classification) or each of its tokens (tagging).

  tokens_BxT -> embedding * sqrt(d) + sinusoidal positions -> dropout
             -> N blocks of bidirectional self-attention over the real tokens and an MLP
             -> (pre-LN) a final LayerNorm                                   = hidden_BxTxD

Every token reads the whole text, before and after it: what a left-to-right model (GPT, an LSTM)
cannot do when it labels a word. The modules and their names are those of the encoder-decoder's
encoder (`source_embed`, `encoder`, `encoder_norm`: transformer.models.seq2seq), so the blocks,
attention and embeddings are the same code. Heads are in transformer.models.classifier.

    >>> encoder = Encoder(EncoderConfig(vocab_size=20002))
    >>> hidden_BxTxD = encoder.apply({"params": params}, tokens_BxT, valid_BxT=valid_BxT)
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from transformer import kernels, layers
from transformer.errors import ConfigError
from transformer.models import seq2seq


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  family: ClassVar[str] = "encoder"  # config.model.family (transformer.models.families())
  vocab_size: int = 0  # 0: taken from the tokenizer
  max_len: int = 256  # longest sequence (positions are sinusoidal, not learned)
  num_layers: int = 4
  # The encoder-decoder's blocks, pre-LN by default (block.pre_layer_norm=False: the paper's post-LN).
  block: layers.BlockConfig = seq2seq.PAPER_BLOCK.replace(d_model=256, num_heads=4, d_mlp=1024, pre_layer_norm=True)
  scan_layers: bool = False
  remat_policy: str = "none"
  kernels: str = "auto"  # "auto" | "reference" | "cpu" | "accelerator": faster forms of ops (transformer.kernels)

  def replace(self, **changes) -> EncoderConfig:
    """A copy with `changes`; the block's fields (d_model=..., num_heads=...) change the block."""
    return layers.replace_model(self, changes)

  def check(self) -> EncoderConfig:
    layers.check_model_config(self, positive=("vocab_size", "max_len", "num_layers"))
    return self


class Encoder(nn.Module):
  """Hidden states `BxTxD` of a token sequence; `valid_BxT` False marks padding, which no token
  attends to, so a text's states do not depend on how much padding follows it."""

  config: EncoderConfig

  def setup(self):
    cfg = self.config
    self.source_embed = seq2seq.Embed(cfg)
    self.encoder = layers.Stack(
      cfg.block,
      cfg.num_layers,
      scan=cfg.scan_layers,
      remat_policy=cfg.remat_policy,
      forms=kernels.resolve(cfg.kernels),  # the fast forms, decided once for the whole model
      max_len=cfg.max_len,
    )
    if cfg.block.pre_layer_norm:
      self.encoder_norm = layers.norm(cfg.block)

  def __call__(self, tokens_BxT, *, valid_BxT=None, deterministic: bool = True):
    B, T = tokens_BxT.shape
    if T > self.config.max_len:
      raise ConfigError(
        f"a sequence of {T} tokens is longer than the encoder's max_len={self.config.max_len}; "
        f"raise --config.model.max_len or lower --config.max_len"
      )
    valid_BxT = jnp.ones((B, T), bool) if valid_BxT is None else valid_BxT
    positions_1xT = jnp.arange(T)[None]
    x_BxTxD = self.source_embed(tokens_BxT, positions_1xT, deterministic)
    mask_BxTxT = layers.self_attention_mask(valid_BxT, None, causal=False)
    x_BxTxD = self.encoder(x_BxTxD, mask_BxTxT, positions=(positions_1xT, positions_1xT), deterministic=deterministic)
    return self.encoder_norm(x_BxTxD) if self.config.block.pre_layer_norm else x_BxTxD
