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


def one_token_cpu(q_Bx1xHxK, k_BxHxKxS, v_BxHxSxK, mask_Bx1xS) -> jax.Array:
  """softmax(q Kᵀ / √K) V for one new token per sequence over a KV cache (keys B x H x K x S, values
  B x H x S x K: `layers.CACHE_LAYOUTS`), skipping the T axis."""
  scale = 1.0 / math.sqrt(q_Bx1xHxK.shape[-1])
  q_BxHxK = q_Bx1xHxK[:, 0].astype(jnp.float32)
  one = q_BxHxK.shape[0] == 1
  if one:
    scores_BxHxS = jnp.sum(q_BxHxK[..., None] * k_BxHxKxS, axis=2) * scale
  else:
    scores_BxHxS = jnp.einsum("bhk,bhks->bhs", q_BxHxK, k_BxHxKxS, preferred_element_type=jnp.float32) * scale
  scores_BxHxS = jnp.where(mask_Bx1xS, scores_BxHxS, jnp.finfo(jnp.float32).min)  # B x 1 x S: for every head
  probs_BxHxS = jax.nn.softmax(scores_BxHxS, axis=-1)
  if one:
    out_BxHxK = jnp.sum(probs_BxHxS[..., None] * v_BxHxSxK, axis=2)
  else:
    out_BxHxK = jnp.einsum("bhs,bhsk->bhk", probs_BxHxS.astype(v_BxHxSxK.dtype), v_BxHxSxK)
  return out_BxHxK[:, None].astype(v_BxHxSxK.dtype)
