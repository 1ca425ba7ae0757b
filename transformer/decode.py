"""Generating text from a trained model.

`generate_simple` is plain decoding: a full forward pass over a fixed-size buffer per new token
(one compiled function, no cache), the model seeing the last `context_length` tokens (a sliding
window once the text is longer than the context). It is what training prints at the end of a run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from transformer.layers import ConfigError


def sample_logits(logits_BxV, rng, temperature: float, top_k: int = 0):
  """Greedy for temperature 0, else a draw from softmax(logits / temperature) over the top k."""
  if temperature == 0:
    return jnp.argmax(logits_BxV, axis=-1)
  logits_BxV = logits_BxV / temperature
  if top_k:
    kth_B = jax.lax.top_k(logits_BxV, top_k)[0][:, -1:]
    logits_BxV = jnp.where(logits_BxV < kth_B, -jnp.inf, logits_BxV)
  return jax.random.categorical(rng, logits_BxV, axis=-1)


def generate_simple(model, params, prompt: list[int], *, max_new_tokens: int, temperature: float = 1.0,
                    top_k: int = 0, rng=None, stop_id: int | None = None) -> list[int]:
  """New token ids after `prompt`, by re-running the model over the last `context_length` tokens."""
  context = model.config.context_length
  if not prompt:
    raise ConfigError("the prompt is empty; give at least one token (e.g. the end-of-text id)")
  rng = jax.random.key(0) if rng is None else rng

  @jax.jit
  def next_token(buffer_1xC, length, rng):
    logits_1xCxV = model.apply({"params": params}, buffer_1xC)
    logits_1xV = jax.lax.dynamic_index_in_dim(logits_1xCxV, length - 1, axis=1, keepdims=False)
    return sample_logits(logits_1xV, rng, temperature, top_k)[0]

  tokens = list(prompt)
  for i in range(max_new_tokens):
    window = tokens[-context:]
    buffer = np.zeros((1, context), np.int32)
    buffer[0, :len(window)] = window
    token = int(next_token(jnp.asarray(buffer), len(window), jax.random.fold_in(rng, i)))
    if token == stop_id:
      break
    tokens.append(token)
  return tokens[len(prompt):]
