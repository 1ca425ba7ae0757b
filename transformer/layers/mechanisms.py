"""Attention mechanisms: how self-attention makes its scores (query t's score for key s, before the
mask and the softmax), and so what the KV cache keeps. Dot products (the 2017 paper) and the
Synthesizer's scores made without keys (Tay et al. 2020); `register_mechanism` adds one."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


def dot_product_scores(attn, x_BxTxD, q_BxTxHxK, k_BxSxHxK, positions) -> jax.Array:
  """Q Kᵀ / √K, in float32: the 2017 paper's scores (a `Mechanism`'s scores; attn, x and positions unused)."""
  scale = 1.0 / math.sqrt(q_BxTxHxK.shape[-1])
  return jnp.einsum("bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK, preferred_element_type=jnp.float32) * scale


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
  # The scores are Q Kᵀ / √K (`dot_product_scores`): then the fused kernels of
  # transformer.kernels.attention may compute softmax(scores) V in one op (`attention.attend`).
  scaled_dot_product: bool = False


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
  kernel_HxKxL = attn.param("synth_kernel", partitioned, (H, K, L), jnp.dtype(cfg.param_dtype))
  bias_HxL = attn.param(
    "synth_bias",
    nn.with_logical_partitioning(nn.initializers.zeros_init(), ("heads", "position")),
    (H, L),
    jnp.dtype(cfg.param_dtype),
  )
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
  table_HxLxL = attn.param("synth_table", partitioned, shape, jnp.dtype(cfg.param_dtype))
  if fixed:
    table_HxLxL = jax.lax.stop_gradient(table_HxLxL)
  scores_HxBxTxS = table_HxLxL[:, q_positions_BxT[:, :, None], k_positions_BxS[:, None, :]]
  return jnp.moveaxis(scores_HxBxTxS, 0, 1)


# The attention mechanisms config.model.block.attention_mechanism names: query-key dot products, or
# (Tay et al. 2020, "Synthesizer") scores synthesized without keys, from each token alone ("dense") or
# learned position by position ("random"; "fixed_random" keeps them at their random initialisation).
MECHANISMS: dict[str, Mechanism] = {
  "dot_product": Mechanism(dot_product_scores, scaled_dot_product=True),
  "synthesizer_dense": Mechanism(synthesizer_dense_scores, keys=False),
  "synthesizer_random": Mechanism(synthesizer_random_scores, keys=False),
  "synthesizer_fixed_random": Mechanism(functools.partial(synthesizer_random_scores, fixed=True), keys=False),
}


def register_mechanism(name: str, mechanism: Mechanism) -> None:
  """Adds an attention mechanism under `name` (config.model.block.attention_mechanism=name): it then
  trains, decodes with the KV cache, probes and shards like the built-in ones. Called in a module of
  one's own, that module named in config.imports makes every launch program that uses the run
  register it too."""
  if not isinstance(mechanism, Mechanism):
    raise TypeError(f"register_mechanism({name!r}, ...) takes a layers.Mechanism, got {type(mechanism).__name__}")
  MECHANISMS[name] = mechanism
