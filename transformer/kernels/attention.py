"""Attention in the forms a machine runs fastest (config.model.kernels), equal to the reference's
`layers.attend` / `layers.mix` in values and gradients (tests/test_kernels.py).

`attend` is where `layers.attend` hands over when the model's forms are not the reference: XLA's or
cuDNN's fused kernel (config.model.block.attention), and for causal self-attention the blocks below.

Causal self-attention by blocks of BLOCK queries, each over the keys up to its last query: the
scores above the diagonal's blocks, which the mask would zero, are never computed (T = 128: 3/4 of
the T x T scores; T = 256: 5/8). The result is the full masked computation's: a masked key's weight
is exp(-huge) = 0 either way.
  - `causal_by_blocks` (accelerators): each block through `jax.nn.dot_product_attention`, autodiff's
    backward pass.
  - `causal_cpu` (CPUs): the same blocks with a backward pass written out. Autodiff of the softmax
    makes several passes over each block's scores (the probabilities times their gradient, its row
    sums, the mask's select, the scale); here the row sums come from the output instead
    (rowsum(dP * P) = rowsum(dO * O), FlashAttention's identity: a pass over B x T x H x K, not
    B x H x T x S), so the scores' gradient is one pass, P * (dP - D).

One new token's attention over a KV cache (`one_token_cpu`, CPUs): with T = 1 both products are
matrix-vector products, which XLA:CPU runs fastest as einsums for several sequences and as
multiply-and-sum for one.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

BLOCK = 64  # query rows per block of causal self-attention


def blocks(T: int) -> list[tuple[int, int]]:
  """[start, end) of each block of BLOCK queries; a block attends to keys 0..end-1."""
  return [(start, min(start + BLOCK, T)) for start in range(0, T, BLOCK)]


def attend(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask_BxTxS, implementation: str, forms: str) -> jax.Array:
  """softmax(Q Kᵀ / √K) V over the keys `mask` allows (None: causal) by a fused kernel
  (`implementation`: "xla" or "cudnn"); causal self-attention by the blocks of `forms` ("cpu" or
  "accelerator"), or cuDNN's own causal kernel (`is_causal`: it skips the masked half of the scores)."""
  T, S = q_BxTxHxK.shape[1], k_BxSxHxK.shape[1]
  if mask_BxTxS is None and implementation == "cudnn":
    return jax.nn.dot_product_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, is_causal=True, implementation=implementation)
  if mask_BxTxS is None and T == S:
    if forms == "cpu":
      return causal_cpu(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK)
    return causal_by_blocks(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, implementation)
  if mask_BxTxS is None:
    mask_BxTxS = jnp.tri(T, S, dtype=bool)[None]  # query t sees keys 0..t
  return jax.nn.dot_product_attention(
    q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask=mask_BxTxS[:, None], implementation=implementation
  )


def causal_by_blocks(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, implementation: str) -> jax.Array:
  """Causal self-attention by XLA's kernel (`implementation`), in blocks from two blocks on (XLA's
  kernel is given the block's mask)."""
  T = q_BxTxHxK.shape[1]
  spans = blocks(T) if T >= 2 * BLOCK else [(0, T)]
  return jnp.concatenate(
    [
      jax.nn.dot_product_attention(
        q_BxTxHxK[:, start:end],
        k_BxTxHxK[:, :end],
        v_BxTxHxK[:, :end],
        mask=jnp.tri(end, dtype=bool)[None, None, start:],
        implementation=implementation,
      )
      for start, end in spans
    ],
    axis=1,
  )


@jax.custom_vjp
def causal_cpu(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK) -> jax.Array:
  """Causal self-attention by blocks with its own backward pass (see the module docstring)."""
  return _causal_cpu_fwd(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK)[0]


def _causal_cpu_fwd(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK):
  T, scale = q_BxTxHxK.shape[1], 1.0 / math.sqrt(q_BxTxHxK.shape[-1])
  out_blocks, probs_blocks = [], []
  for start, end in blocks(T):
    scores_BxHxtxs = (
      jnp.einsum("bthk,bshk->bhts", q_BxTxHxK[:, start:end], k_BxTxHxK[:, :end], preferred_element_type=jnp.float32)
      * scale
    )
    scores_BxHxtxs = jnp.where(jnp.tri(end, dtype=bool)[start:], scores_BxHxtxs, jnp.finfo(jnp.float32).min)
    probs_BxHxtxs = jax.nn.softmax(scores_BxHxtxs, axis=-1).astype(v_BxTxHxK.dtype)
    out_blocks.append(jnp.einsum("bhts,bshk->bthk", probs_BxHxtxs, v_BxTxHxK[:, :end]))
    probs_blocks.append(probs_BxHxtxs)
  out_BxTxHxK = jnp.concatenate(out_blocks, axis=1)
  return out_BxTxHxK, (q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, out_BxTxHxK, probs_blocks)


def _causal_cpu_bwd(residuals, dout_BxTxHxK):
  q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, out_BxTxHxK, probs_blocks = residuals
  T, scale = q_BxTxHxK.shape[1], 1.0 / math.sqrt(q_BxTxHxK.shape[-1])
  f32 = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)
  rowsum_BxHxT = f32("bthk,bthk->bht", dout_BxTxHxK, out_BxTxHxK)
  dq_blocks, dk_BxTxHxK, dv_BxTxHxK = [], 0.0, 0.0
  for (start, end), probs_BxHxtxs in zip(blocks(T), probs_blocks):
    dout_BxtxHxK = dout_BxTxHxK[:, start:end]
    dprobs_BxHxtxs = f32("bthk,bshk->bhts", dout_BxtxHxK, v_BxTxHxK[:, :end])
    dscores_BxHxtxs = probs_BxHxtxs * (dprobs_BxHxtxs - rowsum_BxHxT[:, :, start:end, None])
    dq_blocks.append(f32("bhts,bshk->bthk", dscores_BxHxtxs, k_BxTxHxK[:, :end]) * scale)
    keys_after = ((0, 0), (0, T - end), (0, 0), (0, 0))  # this block saw keys 0..end-1
    dk_BxTxHxK += jnp.pad(f32("bhts,bthk->bshk", dscores_BxHxtxs, q_BxTxHxK[:, start:end]) * scale, keys_after)
    dv_BxTxHxK += jnp.pad(f32("bhts,bthk->bshk", probs_BxHxtxs, dout_BxtxHxK), keys_after)
  return (
    jnp.concatenate(dq_blocks, axis=1).astype(q_BxTxHxK.dtype),
    dk_BxTxHxK.astype(k_BxTxHxK.dtype),
    dv_BxTxHxK.astype(v_BxTxHxK.dtype),
  )


causal_cpu.defvjp(_causal_cpu_fwd, _causal_cpu_bwd)


def one_token_cpu(q_Bx1xHxK, k_BxGxKxS, v_BxGxSxK, mask_Bx1xS) -> jax.Array:
  """softmax(q Kᵀ / √K) V for one new token per sequence over a KV cache (keys B x G x K x S, values
  B x G x S x K: `layers.CACHE_LAYOUTS`), skipping the T axis. G kv heads, each read by H/G query heads
  (grouped-query attention): the queries grouped by their kv head, so that the cache is read as it is,
  never repeated for each query head."""
  B, _, H, K = q_Bx1xHxK.shape
  G = k_BxGxKxS.shape[1]
  scale = 1.0 / math.sqrt(K)
  q_BxGxRxK = q_Bx1xHxK[:, 0].astype(jnp.float32).reshape(B, G, H // G, K)
  one = B == 1
  if one:
    scores_BxGxRxS = jnp.sum(q_BxGxRxK[..., None] * k_BxGxKxS[:, :, None], axis=3) * scale
  else:
    scores_BxGxRxS = jnp.einsum("bgrk,bgks->bgrs", q_BxGxRxK, k_BxGxKxS, preferred_element_type=jnp.float32) * scale
  scores_BxGxRxS = jnp.where(mask_Bx1xS[:, None], scores_BxGxRxS, jnp.finfo(jnp.float32).min)  # for every head
  probs_BxGxRxS = jax.nn.softmax(scores_BxGxRxS, axis=-1)
  if one:
    out_BxGxRxK = jnp.sum(probs_BxGxRxS[..., None] * v_BxGxSxK[:, :, None], axis=3)
  else:
    out_BxGxRxK = jnp.einsum("bgrs,bgsk->bgrk", probs_BxGxRxS.astype(v_BxGxSxK.dtype), v_BxGxSxK)
  return out_BxGxRxK.reshape(B, 1, H, K).astype(v_BxGxSxK.dtype)
