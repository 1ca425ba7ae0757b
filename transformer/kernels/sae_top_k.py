"""A TopK sparse autoencoder's encoder with the gradient its k latents a row need, and no more.

The reference (`models.sae.sae_loss`) takes the top k of the pre-activations and lets autodiff
differentiate it: the pre-activations' gradient is then an N x S matrix with k non-zeros a row, and
the encoder's gradient the dense product (x - b_dec)ᵀ · that matrix, 2·N·D·S FLOPs for N·k·D that are
not zero. Here the k gradients each row keeps are scattered into the rows of the encoder's transpose
(N·k·D), b_enc's into its k latents, and b_dec's, which reaches the pre-activations through
x - b_dec, is -W_enc · b_enc's gradient. The forward pass is the reference's.

The inputs get no gradient: they are data (the SAE task's rows), so `top_k_encode` stops it. On
XLA:CPU a scatter of N·k·D costs less than a dense product of N·D·S for k much smaller than S; an
accelerator's matrix units favour the product, so only the CPU's forms take this one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def top_k_encode(x_NxD, b_dec_D, W_enc_DxS, b_enc_S, k: int) -> tuple[jax.Array, jax.Array]:
  """(values, indices) of the k largest of (x - b_dec) W_enc + b_enc in each row, as `lax.top_k`;
  gradients to b_dec, W_enc and b_enc only (see the module docstring)."""
  return _top_k_encode(jax.lax.stop_gradient(x_NxD), b_dec_D, W_enc_DxS, b_enc_S, k)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _top_k_encode(x_NxD, b_dec_D, W_enc_DxS, b_enc_S, k):
  pre_NxS = (x_NxD - b_dec_D) @ W_enc_DxS + b_enc_S
  return jax.lax.top_k(pre_NxS, k)


def _forward(x_NxD, b_dec_D, W_enc_DxS, b_enc_S, k):
  values_Nxk, index_Nxk = _top_k_encode(x_NxD, b_dec_D, W_enc_DxS, b_enc_S, k)
  return (values_Nxk, index_Nxk), (x_NxD, b_dec_D, W_enc_DxS, index_Nxk)


def _backward(k, saved, cotangents):
  x_NxD, b_dec_D, W_enc_DxS, index_Nxk = saved
  d_values_Nxk, _ = cotangents  # the indices are integers: no gradient
  D, S = W_enc_DxS.shape
  centred_NxD = x_NxD - b_dec_D
  d_W_enc_SxD = jnp.zeros((S, D), W_enc_DxS.dtype).at[index_Nxk].add(d_values_Nxk[..., None] * centred_NxD[:, None, :])
  d_b_enc_S = jnp.zeros(S, W_enc_DxS.dtype).at[index_Nxk].add(d_values_Nxk)
  return jnp.zeros_like(x_NxD), -(W_enc_DxS @ d_b_enc_S), d_W_enc_SxD.T, d_b_enc_S


_top_k_encode.defvjp(_forward, _backward)
