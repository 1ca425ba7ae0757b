"""A TopK sparse autoencoder's encoder with the gradient its k latents a row need, and no more.

The reference (`models.sae.sae_loss`) takes the top k of the pre-activations and lets autodiff
differentiate it: the pre-activations' gradient is then an N x Z matrix with k non-zeros a row, and
the encoder's gradient the dense product (x - b_dec)ᵀ · that matrix, 2·N·D·Z FLOPs for N·k·D that are
not zero. Here the k gradients each row keeps are scattered into the rows of the encoder's transpose
(N·k·D), b_enc's into its k latents, and b_dec's, which reaches the pre-activations through
x - b_dec, is -W_enc · b_enc's gradient. The forward pass is the reference's.

The inputs get no gradient: they are data (the SAE task's rows), so `top_k_encode` stops it. On
XLA:CPU a scatter of N·k·D costs less than a dense product of N·D·Z for k much smaller than Z; an
accelerator's matrix units favour the product, so only the CPU's forms take this one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def top_k_encode(x_NxD, b_dec_D, W_enc_DxZ, b_enc_Z, k: int) -> tuple[jax.Array, jax.Array]:
  """(values, indices) of the k largest of (x - b_dec) W_enc + b_enc in each row, as `lax.top_k`;
  gradients to b_dec, W_enc and b_enc only (see the module docstring)."""
  return _top_k_encode(jax.lax.stop_gradient(x_NxD), b_dec_D, W_enc_DxZ, b_enc_Z, k)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _top_k_encode(x_NxD, b_dec_D, W_enc_DxZ, b_enc_Z, k):
  pre_NxZ = (x_NxD - b_dec_D) @ W_enc_DxZ + b_enc_Z
  return jax.lax.top_k(pre_NxZ, k)


def _forward(x_NxD, b_dec_D, W_enc_DxZ, b_enc_Z, k):
  values_Nxk, index_Nxk = _top_k_encode(x_NxD, b_dec_D, W_enc_DxZ, b_enc_Z, k)
  return (values_Nxk, index_Nxk), (x_NxD, b_dec_D, W_enc_DxZ, index_Nxk)


def _backward(k, saved, cotangents):
  x_NxD, b_dec_D, W_enc_DxZ, index_Nxk = saved
  d_values_Nxk, _ = cotangents  # the indices are integers: no gradient
  D, Z = W_enc_DxZ.shape
  centred_NxD = x_NxD - b_dec_D
  d_W_enc_ZxD = jnp.zeros((Z, D), W_enc_DxZ.dtype).at[index_Nxk].add(d_values_Nxk[..., None] * centred_NxD[:, None, :])
  d_b_enc_Z = jnp.zeros(Z, W_enc_DxZ.dtype).at[index_Nxk].add(d_values_Nxk)
  return jnp.zeros_like(x_NxD), -(W_enc_DxZ @ d_b_enc_Z), d_W_enc_ZxD.T, d_b_enc_Z


_top_k_encode.defvjp(_forward, _backward)
