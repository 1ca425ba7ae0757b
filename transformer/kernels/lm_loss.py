"""Next-token cross-entropy with its backward pass written out (config.model.kernels: the
accelerators' form; the reference is optax's `softmax_cross_entropy_with_integer_labels` under
autodiff). Values and gradients are the reference's (tests/test_kernels.py).

The gradient softmax - one_hot(target) is recomputed from the logits in one elementwise pass, where
autodiff keeps float32 exponentials and makes several passes over B x T x V floats, the largest
tensor of a GPT-2 step. The label term is a dense compare with the target (no scatter into
B x T x V), and the gradient reaches the head's two backward products in the head's compute dtype
(bfloat16: the model's cast of the logits to float32 transposes to a cast back, which XLA fuses
into this pass), so those products run in bf16 with float32 accumulation, not as FP32/TF32 ones
(tests/test_kernels.py reads both off the gradient's jaxpr). XLA:CPU is better off with autodiff,
which reuses the forward pass's exponentials instead of recomputing them: CPUs keep the reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.custom_vjp
def next_token_nll(logits_BxTxV, targets_BxT):
  """-log softmax(logits)[target] at each position, in float32."""
  return _nll_and_lse(logits_BxTxV, targets_BxT)[0]


def _nll_and_lse(logits_BxTxV, targets_BxT):
  logits_BxTxV = logits_BxTxV.astype(jnp.float32)
  lse_BxT = jax.nn.logsumexp(logits_BxTxV, axis=-1)
  target_logit_BxT = jnp.take_along_axis(logits_BxTxV, targets_BxT[..., None], axis=-1)[..., 0]
  return lse_BxT - target_logit_BxT, lse_BxT


def _fwd(logits_BxTxV, targets_BxT):
  nll_BxT, lse_BxT = _nll_and_lse(logits_BxTxV, targets_BxT)
  return nll_BxT, (logits_BxTxV, targets_BxT, lse_BxT)


def _bwd(residuals, g_BxT):
  logits_BxTxV, targets_BxT, lse_BxT = residuals
  probs_BxTxV = jnp.exp(logits_BxTxV.astype(jnp.float32) - lse_BxT[..., None])
  one_hot_BxTxV = targets_BxT[..., None] == jnp.arange(logits_BxTxV.shape[-1])
  grad_BxTxV = (probs_BxTxV - one_hot_BxTxV) * g_BxT[..., None]
  return grad_BxTxV.astype(logits_BxTxV.dtype), None


next_token_nll.defvjp(_fwd, _bwd)
