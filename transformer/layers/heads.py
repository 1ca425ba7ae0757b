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
from transformer.layers.points import MIXING_POINTS, acts_on, intervened, point


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
    if _apart(self) and not per_head_inputs:
      return _parts(self, fused, x_BxTxD)
    qkv_BxTx3xHxK = per_head_projection(fused, x_BxTxD) if per_head_inputs else fused(x_BxTxD)
    return tuple(qkv_BxTx3xHxK[:, :, i] for i in range(3))
  q = self.projection((H, K), ("embed", "heads", "kv"), name="q", use_bias=bias)
  kv = self.projection((2, G, K), ("embed", None, "heads", "kv"), name="kv", use_bias=bias)
  if per_head_inputs:
    q_BxTxHxK, kv_BxTx2xGxK = per_head_projection(q, x_BxTxD[:1])[:, :, 0], per_head_projection(kv, x_BxTxD[1:])
    return q_BxTxHxK, kv_BxTx2xGxK[:, :, 0], kv_BxTx2xGxK[:, :, 1]
  q_BxTxHxK = q(x_BxTxD)
  if _apart(self):
    return (q_BxTxHxK, *_parts(self, kv, x_BxTxD))
  kv_BxTx2xGxK = kv(x_BxTxD)
  return q_BxTxHxK, kv_BxTx2xGxK[:, :, 0], kv_BxTx2xGxK[:, :, 1]


def _apart(self) -> bool:
  """Whether the fused projections are taken part by part: in a run that acts on the attention pattern (reads,
  patches or fixes it). When a run fixes the pattern, the queries and keys feed nothing, and their products
  then drop out of its gradients; a fused product's gradient would be padded with zeros for them and computed
  whole (an attribution graph's backward passes: three times the value path's work)."""
  return intervened(self, MIXING_POINTS) and not self.is_initializing()


def _parts(self, projection: Projection, x_BxTxD) -> tuple:
  """A fused projection (kernel D x N x H x K) as N products of its kernel's parts, each B x T x H x K."""
  kernel_DxNxHxK, bias = projection.weights()
  x_BxTxD = x_BxTxD.astype(kernel_DxNxHxK.dtype)
  parts = [jnp.einsum("btd,dhk->bthk", x_BxTxD, kernel_DxNxHxK[:, i]) for i in range(kernel_DxNxHxK.shape[1])]
  return tuple(parts) if bias is None else tuple(part + bias[i] for i, part in enumerate(parts))


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
  """The output projection of the heads' outputs. A run that reads, patches or applies a function to
  `result` takes it head by head: each head's `result` (B x T x H x D, what it adds to the residual stream,
  TransformerLens's `attn.hook_result`) is a named point, summed over heads, plus the bias."""
  if not acts_on(module, "result") or module.is_initializing():
    return out(z_BxTxHxK)
  kernel_HxKxD, bias_D = out.weights()
  result_BxTxHxD = point(
    module, "result", jnp.einsum("bthk,hkd->bthd", z_BxTxHxK.astype(kernel_HxKxD.dtype), kernel_HxKxD)
  )
  out_BxTxD = result_BxTxHxD.sum(axis=2)
  return out_BxTxD if bias_D is None else out_BxTxD + bias_D
