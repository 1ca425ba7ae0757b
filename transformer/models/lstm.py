"""The recurrent baselines the Transformer replaced: stacked LSTMs, one-way or bidirectional.

  tokens_BxT -> embedding -> dropout -> N LSTM layers (Flax nn.RNN over an OptimizedLSTMCell;
             bidirectional: nn.Bidirectional, a forward and a backward LSTM whose states are
             concatenated) with dropout between them                        = hidden_BxTxD'

A one-way LSTM reads left to right, so its state at a word has seen only the words before it; a
bidirectional one also reads right to left ("include both forward and backward info"), which is
what tagging a word by its whole sentence needs. D' is d_model, or 2 * d_model bidirectional.

`LSTMLanguageModel` puts a vocabulary head on a one-way LSTM for next-token prediction (the
historical baseline of the language-model table); with `decode=True` its recurrent state lives in
the "cache" collection, so the GPT sampler (transformer.generation.sampling) drives it unchanged.

    >>> lstm = LSTM(LSTMConfig(vocab_size=86, bidirectional=True))
    >>> hidden_BxTxD = lstm.apply({"params": params}, tokens_BxT, valid_BxT=valid_BxT)
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.errors import ConfigError
from transformer.kernels import check as kernel_check


@dataclasses.dataclass(frozen=True)
class LSTMConfig:
  family: ClassVar[str] = "lstm"  # config.model.family (transformer.models.families())
  vocab_size: int = 0  # 0: taken from the tokenizer
  max_len: int = 1024  # longest sequence it is trained or sampled on (no position table)
  num_layers: int = 2
  d_model: int = 256  # embedding size = hidden size of each direction
  bidirectional: bool = False
  dropout_rate: float = 0.0  # on the embeddings and between layers
  tie_embeddings: bool = False  # language model: the head is the embedding, transposed
  dtype: str = "float32"
  param_dtype: str = "float32"
  kernels: str = "auto"  # faster forms of the loss and the sampler's ops (transformer.kernels)

  def replace(self, **changes) -> LSTMConfig:
    return dataclasses.replace(self, **changes)

  @property
  def d_hidden(self) -> int:
    return self.d_model * (2 if self.bidirectional else 1)

  def check(self) -> LSTMConfig:
    for name in ("vocab_size", "max_len", "num_layers", "d_model"):
      if getattr(self, name) <= 0:
        raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
    if not 0 <= self.dropout_rate < 1:
      raise ConfigError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
    for name in ("dtype", "param_dtype"):
      try:
        jnp.dtype(getattr(self, name))
      except TypeError:
        raise ConfigError(f"{name}={getattr(self, name)!r} is not a dtype; use float32 or bfloat16") from None
    kernel_check(self.kernels)
    return self


class LSTM(nn.Module):
  """Hidden states `BxTxD'` of right-padded token sequences (`valid_BxT` False marks the padding,
  which the sequence lengths keep out of every state at a real token: the backward direction starts
  at each sequence's last real token, not at the padding)."""

  config: LSTMConfig

  @nn.compact
  def __call__(self, tokens_BxT, *, valid_BxT=None, deterministic: bool = True, decode: bool = False):
    cfg = self.config
    B, T = tokens_BxT.shape
    dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
    embed = nn.Embed(
      cfg.vocab_size,
      cfg.d_model,
      dtype=dtype,
      param_dtype=param_dtype,
      embedding_init=nn.initializers.normal(0.1),
      name="embed",
    )
    lengths_B = None if valid_BxT is None else valid_BxT.sum(axis=1).astype(jnp.int32)
    if decode:
      if cfg.bidirectional:
        raise ConfigError(
          "a bidirectional LSTM reads the text's end first: it cannot generate; set --config.model.bidirectional=False"
        )
      tokens_BxT, lengths_B = _valid_first(tokens_BxT, valid_BxT)
    x_BxTxD = nn.Dropout(cfg.dropout_rate)(embed(tokens_BxT), deterministic=deterministic)

    cell = lambda name: nn.OptimizedLSTMCell(cfg.d_model, dtype=dtype, param_dtype=param_dtype, name=name)
    for i in range(cfg.num_layers):
      if cfg.bidirectional:
        layer = nn.Bidirectional(nn.RNN(cell(f"forward_{i}")), nn.RNN(cell(f"backward_{i}")), name=f"layer_{i}")
        x_BxTxD = layer(x_BxTxD, seq_lengths=lengths_B)
      elif decode:  # continue from the state after the earlier calls' tokens
        rnn = nn.RNN(cell(f"cell_{i}"), name=f"layer_{i}")
        state = self.variable("cache", f"state_{i}", lambda: (jnp.zeros((B, cfg.d_model), dtype),) * 2)  # (c, h)
        carry, x_BxTxD = rnn(
          x_BxTxD, initial_carry=state.value, seq_lengths=jnp.maximum(lengths_B, 1), return_carry=True
        )
        state.value = jax.tree.map(lambda new, old: jnp.where((lengths_B > 0)[:, None], new, old), carry, state.value)
      else:
        x_BxTxD = nn.RNN(cell(f"cell_{i}"), name=f"layer_{i}")(x_BxTxD, seq_lengths=lengths_B)
      if i < cfg.num_layers - 1:
        x_BxTxD = nn.Dropout(cfg.dropout_rate)(x_BxTxD, deterministic=deterministic)
    x_BxTxD = nn.Dropout(cfg.dropout_rate)(x_BxTxD, deterministic=deterministic)
    if decode:  # the state after each sequence's last real token
      return jnp.take_along_axis(x_BxTxD, jnp.maximum(lengths_B - 1, 0)[:, None, None], axis=1)
    return x_BxTxD


def _valid_first(tokens_BxT, valid_BxT):
  """Each row's real tokens moved to its front (the sampler left-pads prompts; an LSTM reads from the
  left), and their number."""
  B, T = tokens_BxT.shape
  if valid_BxT is None:
    return tokens_BxT, jnp.full((B,), T, jnp.int32)
  lengths_B = valid_BxT.sum(axis=1).astype(jnp.int32)
  # Real tokens stay in order: sort positions by (padding last, position).
  order_BxT = jnp.argsort(jnp.where(valid_BxT, 0, T) + jnp.arange(T)[None], axis=1)
  return jnp.take_along_axis(tokens_BxT, order_BxT, axis=1), lengths_B


class LSTMLanguageModel(nn.Module):
  """A one-way LSTM with a head over the vocabulary: float32 next-token logits `BxTxV` (with
  `decode=True`, `Bx1xV` of each sequence's last real token, as GPT gives the sampler)."""

  config: LSTMConfig

  @nn.compact
  def __call__(self, tokens_BxT, *, valid_BxT=None, deterministic: bool = True, decode: bool = False):
    cfg = self.config
    if cfg.bidirectional:
      raise ConfigError(
        "a language model predicts the next token from the ones before it: a bidirectional "
        "LSTM would read the answer; set --config.model.bidirectional=False"
      )
    if not decode and tokens_BxT.shape[1] > cfg.max_len:
      raise ConfigError(
        f"a sequence of {tokens_BxT.shape[1]} tokens is longer than max_len="
        f"{cfg.max_len}; use at most {cfg.max_len} tokens"
      )
    lstm = LSTM(cfg, name="lstm")
    hidden_BxTxD = lstm(tokens_BxT, valid_BxT=valid_BxT, deterministic=deterministic, decode=decode)
    if cfg.tie_embeddings:
      logits_BxTxV = lstm.variables["params"]["embed"]["embedding"].astype(hidden_BxTxD.dtype)
      logits_BxTxV = hidden_BxTxD @ logits_BxTxV.T
    else:
      logits_BxTxV = nn.Dense(
        cfg.vocab_size, dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype), name="head"
      )(hidden_BxTxD)
    return logits_BxTxV.astype(jnp.float32)
