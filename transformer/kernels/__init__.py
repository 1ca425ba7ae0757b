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
  sae_top_k       a TopK SAE's encoder, its gradient scattered to the k latents a row keeps (CPU)

One form lives where its op does: the sampler's decode loop runs a fixed trip count on accelerators
(`generation.sampling.sample_padded`'s `fixed_trips`), so no step waits for the host.

Which forms a run takes is one config value, `config.model.kernels` (a model config field), decided
once (`resolve`) when a model is built or a sampler compiled, and printed by every launch program as
one line (`describe`); each op then only reads the decided value:

  "auto"          (default) the forms of the platform the program runs on: "cpu" on a CPU,
                  "accelerator" on a GPU or TPU
  "reference"     none: the layers, models, sampler and loss run as written (attention by its
                  einsum whatever block.attention), which every form is tested against
  "cpu"           the CPU's forms, wherever the program compiles (tests compare them on any machine)
  "accelerator"   the accelerators' forms, wherever the program compiles (`launch.plan
                  --platform=gpu` plans an accelerator's program on fake CPU devices this way)

"auto" stays the default because the presets' numbers (the main job's loss in its 5 minutes, the
speed tables) are those of the fast forms, and each form computes what the reference computes
(tests/test_kernels.py). A change to the reference (`transformer/layers/`) runs as written with
`--config.model.kernels=reference`; the start-up line says which forms a run took.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from transformer.errors import ConfigError
from transformer.kernels import argmax, attention, decode_head, draw, lm_loss, projection, sae_top_k

KERNELS = ("auto", "reference", "cpu", "accelerator")
PLATFORMS = ("cpu", "gpu", "tpu")  # what `for_platform` maps

# What each resolved value replaces: the start-up line's words.
FORMS = {
  "reference": "none: transformer/layers/, the sampler and the loss run as written",
  "cpu": "causal attention by blocks with its own backward pass, projection gradients in XLA:CPU's "
  "layouts, one-token attention and a batch-laid head when decoding, blocked argmax, two-level draws, "
  "a decoded batch split over the cores, a TopK SAE's encoder gradient for its k latents only",
  "accelerator": "dot-product attention by block.attention's fused kernel (causal: by blocks), a "
  "recomputing backward pass for the language-model loss, a decode loop of fixed trip count",
}


# The one table of which op runs which form: op -> {resolved forms: the function that computes it}.
# An op with no entry for a run's forms runs as the reference writes it. Each caller asks `form(op,
# forms)` at the one place where its op is computed, and keeps the reference beside it.
DISPATCH: dict[str, dict[str, Callable]] = {
  "projection": {"cpu": projection.project},  # layers.Projection
  "attention": {"cpu": attention.attend, "accelerator": attention.attend},  # layers.attend
  "attention_one_token": {"cpu": attention.one_token_cpu},  # layers.attend_cached
  "tied_head_decode": {"cpu": decode_head.tied_head_cpu},  # models.gpt, when decoding
  "argmax": {"cpu": argmax.argmax},  # generation.sampling.next_token, greedy
  "draw": {"cpu": draw.inverse_cdf, "accelerator": draw.inverse_cdf},  # sampled
  "lm_loss": {"accelerator": lm_loss.next_token_nll},  # models.gpt.next_token_nll
  "sae_top_k": {"cpu": sae_top_k.top_k_encode},  # models.sae.sae_loss, TopK
}


def form(op: str, forms: str) -> Callable | None:
  """The function that computes `op` (a DISPATCH key) in `forms` ("reference", "cpu" or
  "accelerator": `resolve`'s value), or None where the reference's own code runs."""
  return DISPATCH[op].get(forms)


def check(kernels: str) -> None:
  if kernels not in KERNELS:
    raise ConfigError(
      f"unknown kernels {kernels!r}; choose one of {', '.join(KERNELS)} (auto: the fast forms of "
      f"the platform a program runs on; reference: plain JAX)"
    )


def for_platform(platform: str) -> str:
  """The forms "auto" means on `platform` (a jax platform name: cpu, gpu, cuda, rocm, tpu)."""
  return "cpu" if platform == "cpu" else "accelerator"


def resolve(kernels: str, platform: str | None = None) -> str:
  """ "reference", "cpu" or "accelerator": the forms `kernels` (config.model.kernels) names for a
  program that runs on `platform` (default: jax's default backend, where a program compiles)."""
  check(kernels)
  return for_platform(platform or jax.default_backend()) if kernels == "auto" else kernels


def describe(kernels: str, platform: str | None = None) -> str:
  """The start-up line of a launch: which forms `kernels` takes here, what they replace, and how to
  run the reference instead."""
  forms = resolve(kernels, platform)
  how = f"auto on {platform or jax.default_backend()}" if kernels == "auto" else "config.model.kernels"
  line = f"kernels: {forms} ({how}: {FORMS[forms]})"
  if forms != "reference":
    line += " — --config.model.kernels=reference runs transformer/layers/ as written"
  return line
