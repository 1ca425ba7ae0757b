"""Queries, keys and values per head, and each head's output: the projections of self-attention, fused
(GPT-2's D x 3 x H x K) or grouped (queries and fewer kv heads: grouped-query attention), from one stream or
from a stream per head (a run that patches `q_input`, `k_input` or `v_input`), and the output projection
taken head by head when a run reads `result`. Functions of the attention module, not its methods: Flax puts
a method's name in the name stack of every op it traces, which would rename the ops of programs that did
not change (their HLO, their profiles)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.layers.params import Projection
from transformer.layers.points import intervened, point


def qkv(self, x_BxTxD):
  """A SelfAttention's (`self`'s) queries B x T x H x K, keys and values B x T x G x K (G kv heads): one
  fused projection `qkv` (D x 3 x H x K, GPT-2's) when G = H, else `q` (D x H x K) and `kv` (D x 2 x G x K).
  `x_BxTxD` may be the three per-head inputs (SelfAttention's call)."""
  cfg = self.cfg
  H, G, K = cfg.num_heads, cfg.kv_heads, cfg.head_dim
  bias = cfg.use_bias or cfg.qkv_bias
  per_head_inputs = isinstance(x_BxTxD, tuple)
  if G == H:
    fused = self.projection((3, H, K), ("embed", None, "heads", "kv"), name="qkv", use_bias=bias)
    qkv_BxTx3xHxK = per_head_projection(fused, x_BxTxD) if per_head_inputs else fused(x_BxTxD)
    return tuple(qkv_BxTx3xHxK[:, :, i] for i in range(3))
  q = self.projection((H, K), ("embed", "heads", "kv"), name="q", use_bias=bias)
  kv = self.projection((2, G, K), ("embed", None, "heads", "kv"), name="kv", use_bias=bias)
  if per_head_inputs:
    q_BxTxHxK, kv_BxTx2xGxK = per_head_projection(q, x_BxTxD[:1])[:, :, 0], per_head_projection(kv, x_BxTxD[1:])
  else:
    q_BxTxHxK, kv_BxTx2xGxK = q(x_BxTxD), kv(x_BxTxD)
  return q_BxTxHxK, kv_BxTx2xGxK[:, :, 0], kv_BxTx2xGxK[:, :, 1]


def per_head_projection(projection: Projection, inputs) -> jax.Array:
  """A q/k/v projection (kernel D x N x H x K, or D x H x K) of N inputs per head (each B x T x H x D):
  head h's queries read its own copy of the stream, and so on. B x T x N x H x K."""
  kernel, bias = projection.weights()
  kernel_DxNxHxK = kernel if kernel.ndim == 4 else kernel[:, None]
  out_BxTxNxHxK = jnp.stack(
    [
      jnp.einsum("bthd,dhk->bthk", x_BxTxHxD.astype(kernel_DxNxHxK.dtype), kernel_DxNxHxK[:, i])
      for i, x_BxTxHxD in enumerate(inputs)
    ],
    axis=2,
  )
  return out_BxTxNxHxK if bias is None else out_BxTxNxHxK + bias.reshape(kernel_DxNxHxK.shape[1:])


def output(module: nn.Module, out: Projection, z_BxTxHxK) -> jax.Array:
  """The output projection of the heads' outputs. A run that reads or patches takes it head by head:
  each head's `result` (B x T x H x D, what it adds to the residual stream, TransformerLens's
  `attn.hook_result`) is a named point, summed over heads, plus the bias."""
  if not intervened(module) or module.is_initializing():
    return out(z_BxTxHxK)
  kernel_HxKxD, bias_D = out.weights()
  result_BxTxHxD = point(
    module, "result", jnp.einsum("bthk,hkd->bthd", z_BxTxHxK.astype(kernel_HxKxD.dtype), kernel_HxKxD)
  )
  out_BxTxD = result_BxTxHxD.sum(axis=2)
  return out_BxTxD if bias_D is None else out_BxTxD + bias_D
