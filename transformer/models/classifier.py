"""Heads on a body: one label per text (classification) or per token (tagging).

The body is any model family's hidden states (config.model.family):
  encoder   the encoder-only Transformer (bidirectional; transformer.models.encoder)
  gpt       GPT-2's blocks (left to right; its final LayerNorm's output) — the same parameters as
            a GPT language model, so a pretrained one is its starting point (`init_from`)
  lstm      a stacked LSTM, one-way or bidirectional (transformer.models.lstm)

Its parameters are under "body" (for gpt exactly a GPT language model's tree, without an untied
output head) and the head's under "head": a linear layer over the hidden size.

    >>> model = SequenceClassifier(EncoderConfig(vocab_size=20002), num_classes=2, pooling="mean")
    >>> logits_BxC = model.apply({"params": params}, tokens_BxT, valid_BxT=valid_BxT)
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import layers, models
from transformer.errors import ConfigError
from transformer.models.encoder import Encoder
from transformer.models.gpt import GPT
from transformer.models.lstm import LSTM

BODIES = {"encoder": Encoder, "gpt": GPT, "lstm": LSTM}
POOLINGS = ("mean", "last", "first")  # of the real tokens' states


def body_width(config) -> int:
  """The size of the hidden states the body gives its head."""
  return config.d_hidden if config.family == "lstm" else config.block.d_model


def natural_pooling(config) -> str:
  """What reads a whole text: the last real token's state for a left-to-right body (GPT, a one-way
  LSTM: only it has seen every token), the mean over the real tokens for a bidirectional one."""
  left_to_right = config.family == "gpt" or (config.family == "lstm" and not config.bidirectional)
  return "last" if left_to_right else "mean"


def _hidden(config, tokens_BxT, valid_BxT, deterministic: bool):
  """(the body's states B x T x D, which tokens are real: `valid_BxT`, all of them when None)."""
  if config.family not in BODIES:
    raise ConfigError(f"config.model.family={config.family!r} cannot be a body; choose one of {', '.join(BODIES)}")
  valid_BxT = jnp.ones(tokens_BxT.shape, bool) if valid_BxT is None else valid_BxT
  body = BODIES[config.family](config, name="body")
  states = body.hidden_states if config.family == "gpt" else body  # a GPT's call gives logits
  return states(tokens_BxT, valid_BxT=valid_BxT, deterministic=deterministic), valid_BxT


def _head(num_outputs: int, config, x_BxD):
  fields = models.body_fields(config)
  return nn.Dense(
    num_outputs,
    dtype=jnp.dtype(fields.dtype),
    param_dtype=jnp.dtype(fields.param_dtype),
    kernel_init=nn.initializers.normal(0.02),
    name="head",
  )(x_BxD).astype(jnp.float32)


class SequenceClassifier(nn.Module):
  """Float32 logits `BxC` of right-padded texts: the body, its states pooled over the real tokens
  (`valid_BxT`), dropout, a linear head."""

  config: Any  # a body's model config (EncoderConfig, GPTConfig, LSTMConfig)
  num_classes: int
  pooling: str = "mean"
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, tokens_BxT, *, valid_BxT=None, deterministic: bool = True):
    hidden_BxTxD, valid_BxT = _hidden(self.config, tokens_BxT, valid_BxT, deterministic)
    if self.pooling == "last":
      last_B = jnp.maximum(valid_BxT.sum(axis=1) - 1, 0)
      pooled_BxD = jnp.take_along_axis(hidden_BxTxD, last_B[:, None, None], axis=1)[:, 0]
    elif self.pooling == "first":
      pooled_BxD = hidden_BxTxD[:, 0]
    elif self.pooling == "mean":
      weight_BxT = valid_BxT.astype(hidden_BxTxD.dtype)
      pooled_BxD = jnp.einsum("btd,bt->bd", hidden_BxTxD, weight_BxT) / jnp.maximum(weight_BxT.sum(1), 1)[:, None]
    else:
      raise ConfigError(f"pooling {self.pooling!r} is unknown; choose one of {', '.join(POOLINGS)}")
    pooled_BxD = layers.point(self, "pooled", pooled_BxD)
    pooled_BxD = nn.Dropout(self.dropout_rate)(pooled_BxD, deterministic=deterministic)
    return _head(self.num_classes, self.config, pooled_BxD)


class TokenClassifier(nn.Module):
  """Float32 logits `BxTxC`: a label for every position (a tagger), from the body's state there."""

  config: Any
  num_classes: int
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, tokens_BxT, *, valid_BxT=None, deterministic: bool = True):
    hidden_BxTxD, _ = _hidden(self.config, tokens_BxT, valid_BxT, deterministic)
    hidden_BxTxD = nn.Dropout(self.dropout_rate)(hidden_BxTxD, deterministic=deterministic)
    return _head(self.num_classes, self.config, hidden_BxTxD)


def body_hidden(config, body_params, tokens_BxT, valid_BxT=None) -> jax.Array:
  """The body's hidden states alone (e.g. to check that a loaded body is the pretrained one)."""

  class _Body(nn.Module):
    @nn.compact
    def __call__(self, tokens, valid):
      return _hidden(config, tokens, valid, True)[0]

  return _Body().apply({"params": {"body": body_params}}, tokens_BxT, valid_BxT)
