"""A Projection's product (`jnp.tensordot(x, kernel, contract)`) with its backward pass written in
the forms XLA:CPU's fast matrix library takes (config.model.kernels: the CPU's forms).

The kernel's gradient is a sum over every token of x's row times dy's row: it contracts the token
dims, which lead (are the major dims of) both x and dy. XLA:CPU's library (YNNPACK) takes no product
whose left operand's contracted dims lead, so autodiff's form of that product goes to XLA's slow
fallback (Eigen), after a transposed copy of the larger operand. Here the smaller of x and dy is
transposed, tokens last, and the product is one the library takes; a transposed result is
kernel-sized. The optimization barriers keep XLA from folding a transpose back into the product's
dimension numbers. Values and gradients equal `jnp.tensordot`'s up to float rounding
(tests/test_kernels.py).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def project(x, kernel, contract: int):
  """jnp.tensordot(x, kernel, contract): x's last `contract` dims times kernel's first."""
  return jnp.tensordot(x, kernel, contract)


def _project_fwd(x, kernel, contract):
  return jnp.tensordot(x, kernel, contract), (x, kernel)


def _project_bwd(contract, residuals, dy):
  x, kernel = residuals
  tokens, n_in, n_out = x.ndim - contract, contract, kernel.ndim - contract
  token_dims = tuple(range(tokens))
  dx = jnp.tensordot(dy, kernel, (tuple(range(tokens, dy.ndim)), tuple(range(n_in, kernel.ndim))))
  if math.prod(kernel.shape[:n_in]) <= math.prod(kernel.shape[n_in:]):
    xT = jax.lax.optimization_barrier(x.transpose(*range(tokens, x.ndim), *token_dims))
    dkernel = jnp.tensordot(xT, dy, (tuple(range(n_in, xT.ndim)), token_dims))
  else:
    dyT = jax.lax.optimization_barrier(dy.transpose(*range(tokens, dy.ndim), *token_dims))
    dkernelT = jax.lax.optimization_barrier(jnp.tensordot(dyT, x, (tuple(range(n_out, dyT.ndim)), token_dims)))
    dkernel = dkernelT.transpose(*range(n_out, kernel.ndim), *range(n_out))
  return dx, dkernel


project.defvjp(_project_fwd, _project_bwd)
