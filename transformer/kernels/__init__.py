"""Faster forms of the reference model's ops, each equal to the reference in values and gradients.

The layers, models, sampler and losses (`transformer.layers`, `transformer.models`,
`transformer.generation`, `transformer.tasks`) are plain JAX that follows the papers. What a machine
runs fastest is sometimes another form of the same op: a gradient written out in the layout a CPU's
matrix library takes, a causal attention that never computes the masked blocks, a decoding step's
head laid out for the batch size. Each such form is one module here:

  projection      a Projection's gradients in the product forms XLA:CPU's fast library takes
  attention       causal self-attention by blocks of queries (on a CPU with its own backward pass);
                  one new token's attention over a KV cache as matrix-vector products
  decode_head     the tied output head of a decoding step, laid out for the batch size
  argmax          greedy decoding's argmax in blocks, and down a vocabulary-major array
  draw            a sampled token by a two-level inverse CDF (one random number a row)
  decode_threads  a batch decoded in parts, one per CPU core; the sampler's XLA:CPU options
  lm_loss         next-token cross-entropy with a recomputing backward pass (accelerators)

Which forms a program takes is one config value, `config.model.kernels` (a model config field), read
at the one place each op is dispatched:

  "auto"          (default) the forms for the platform the program is traced on: "cpu" on a CPU,
                  "accelerator" on a GPU or TPU
  "reference"     none: the plain JAX of the reference everywhere (the readable path, and what
                  every form is tested against)
  "cpu"           the CPU's forms, wherever the program compiles (tests compare them on any machine)
  "accelerator"   the accelerators' forms, wherever the program compiles (`launch.plan
                  --platform=gpu` plans an accelerator's program on fake CPU devices this way)

Every form has a test against the reference (tests/test_kernels.py). What each one gains, on which
machine, is in launch/BENCHMARKS.md.
"""

from __future__ import annotations

import jax

from transformer.errors import ConfigError

KERNELS = ("auto", "reference", "cpu", "accelerator")
PLATFORMS = ("cpu", "gpu", "tpu")  # what `for_platform` maps


def check(kernels: str) -> None:
  if kernels not in KERNELS:
    raise ConfigError(
      f"unknown kernels {kernels!r}; choose one of {', '.join(KERNELS)} (auto: the fast forms of "
      f"the platform a program runs on; reference: plain JAX)"
    )


def for_platform(platform: str) -> str:
  """The forms "auto" means on `platform` (a jax platform name: cpu, gpu, cuda, rocm, tpu)."""
  return "cpu" if platform == "cpu" else "accelerator"


def forms(kernels: str) -> str:
  """ "reference", "cpu" or "accelerator": the forms `kernels` (config.model.kernels) picks for a
  program traced now ("auto": by jax's default backend, the platform of the devices it runs on)."""
  check(kernels)
  return for_platform(jax.default_backend()) if kernels == "auto" else kernels
