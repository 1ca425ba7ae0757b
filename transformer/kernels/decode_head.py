"""The tied output head of a GPT decoding step (logits = x @ embeddingᵀ, B x T x V) in the form
XLA:CPU runs fastest at the batch size (config.model.kernels: the CPU's forms; the reference is
`nn.Embed.attend`). The logits are the same numbers in every form (tests/test_kernels.py):

  - One sequence: the embedding's rows times the hidden state, a matrix-vector product, while the
    head stays in the cache. A head read from memory at every step (more than STREAMED_HEAD_BYTES)
    is read faster as the D x V copy below, streamed row after row.
  - A few sequences (fewer than `vocab_major` asks for): x times the embedding transposed into a
    D x V copy, whose rows the product reads contiguously. XLA hoists the copy out of the decode
    loop: it is made once per `generate` call (one copy: see `tied_head_cpu`).
  - More (VOCAB_MAJOR_MIN_BATCH; a streamed head from STREAMED_VOCAB_MAJOR_MIN_BATCH): the logits
    computed V x B and handed over transposed. A reduction over the vocabulary
    (`kernels.argmax.argmax(..., vocab_major=True)`) transposes them back, the two transposes
    cancel, and it runs down columns of B contiguous values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# From this many sequences, a decoding step computes the tied head vocabulary-major; from
# STREAMED_VOCAB_MAJOR_MIN_BATCH where the head is read from memory at every step.
VOCAB_MAJOR_MIN_BATCH = 16
STREAMED_VOCAB_MAJOR_MIN_BATCH = 2
# A tied head of more than this many bytes does not stay in a CPU's last-level cache between decoding
# steps (which it shares with the KV cache and the layers' weights): every step reads it from memory.
STREAMED_HEAD_BYTES = 16 * 2**20


def streamed_head(vocab_size: int, d_model: int, dtype) -> bool:
  """Whether a vocab_size x d_model head in `dtype` is larger than STREAMED_HEAD_BYTES."""
  return vocab_size * d_model * jnp.dtype(dtype).itemsize > STREAMED_HEAD_BYTES


def vocab_major(batch_size: int, vocab_size: int, d_model: int, dtype) -> bool:
  """Whether a decoding step of `batch_size` sequences computes its tied head vocabulary-major."""
  streamed = streamed_head(vocab_size, d_model, dtype)
  return batch_size >= (STREAMED_VOCAB_MAJOR_MIN_BATCH if streamed else VOCAB_MAJOR_MIN_BATCH)


def tied_head_cpu(embedding_VxD: jax.Array, x_BxTxD: jax.Array) -> jax.Array:
  """x_BxTxD @ embedding_VxDᵀ, B x T x V, in the form for the batch size (see the module docstring).

  The barrier keeps XLA:CPU from fusing the final LayerNorm into the head's matrix-vector product,
  where it would be redone for every vocabulary entry."""
  x_BxTxD = jax.lax.optimization_barrier(x_BxTxD)
  B = x_BxTxD.shape[0]
  if B == 1 and not streamed_head(*embedding_VxD.shape, embedding_VxD.dtype):
    return jnp.einsum("vd,btd->btv", embedding_VxD, x_BxTxD)
  if vocab_major(B, *embedding_VxD.shape, embedding_VxD.dtype):
    return jnp.einsum("vd,btd->vbt", embedding_VxD, x_BxTxD).transpose(1, 2, 0)
  # The barrier keeps XLA from folding the transpose back into the product's dimension numbers. Its
  # operand is D x 1 x V, not D x V: XLA lays a D x V transpose out as the embedding's own bytes, so the
  # barrier's copy of it is those bytes again and a second copy makes the rows; D x 1 x V is copied once.
  embedding_Dx1xV = jax.lax.optimization_barrier(embedding_VxD.T[:, None, :])
  return x_BxTxD @ embedding_Dx1xV[:, 0, :]
