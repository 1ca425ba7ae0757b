"""What an attribution graph explains (transformer.interp.graph's logit nodes): the top logits, as circuit-tracer's
`compute_salient_logits` chooses them, or targets given as circuit-tracer's AttributionTargets takes them (token ids,
a logit difference, any direction on the final norm's output).

    >>> ids, p = salient_logits(logits_V)                         # the fewest top tokens of 95% of the probability
    >>> target = logit_difference(model.config, params, a, b)    # logit(a) - logit(b), for attribute(targets=[...])
"""

from __future__ import annotations

import flax.linen as nn
import numpy as np

from transformer.errors import UserError
from transformer.models import gpt


def logit_targets(unembed_DxV, logits_V, targets) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
  """(ids, probabilities, K x D directions, labels) of what a graph explains, as circuit-tracer's
  AttributionTargets takes them: token ids (their probabilities; their unembedding columns less the vocabulary's
  mean), or (label, weight, direction_D) triples (`logit_difference`'s, or any direction on the final norm's
  output; their ids vocab_size + k, circuit-tracer's virtual indices)."""
  V = unembed_DxV.shape[1]
  if len(targets) and not np.isscalar(targets[0]):  # (label, weight, direction) triples
    labels = tuple(str(label) for label, _, _ in targets)
    vectors = np.stack([np.asarray(vector, np.float32).reshape(-1) for _, _, vector in targets])
    if vectors.shape[1] != unembed_DxV.shape[0]:
      raise UserError(f"a target's direction is {vectors.shape[1]} wide; the model's stream is {unembed_DxV.shape[0]}")
    weights = np.asarray([weight for _, weight, _ in targets], np.float32)
    return np.arange(V, V + len(targets), dtype=np.int32), weights, vectors, labels
  ids = np.asarray(targets, np.int64).reshape(-1)
  if not len(ids) or ids.min() < 0 or ids.max() >= V:
    raise UserError(f"target tokens {ids.tolist()}: give ids of the vocabulary, 0 to {V - 1}")
  p_V = np.exp(np.asarray(logits_V, np.float64) - np.max(logits_V))
  p_V /= p_V.sum()
  demeaned_KxD = (unembed_DxV[:, ids] - unembed_DxV.mean(1, keepdims=True)).T
  return ids.astype(np.int32), p_V[ids].astype(np.float32), demeaned_KxD.astype(np.float32), ()


def logit_difference(model_config, params, target: int, versus: int) -> tuple[str, float, np.ndarray]:
  """A custom target: logit(target) - logit(versus), as the probe's --target/--versus explain it (weight 1)."""
  unembed_DxV = np.asarray(gpt.unembedding(model_config, nn.unbox(params)), np.float32).T
  return f"logit({target})-logit({versus})", 1.0, unembed_DxV[:, target] - unembed_DxV[:, versus]


def salient_logits(logits_V, max_n_logits: int = 10, desired_logit_prob: float = 0.95):
  """(token ids, probabilities) of the fewest top tokens whose probability reaches `desired_logit_prob`,
  at most `max_n_logits` (circuit-tracer's `compute_salient_logits`)."""
  logits_V = np.asarray(logits_V, np.float64)
  p_V = np.exp(logits_V - logits_V.max())
  p_V /= p_V.sum()
  top = np.argsort(-p_V, kind="stable")[:max_n_logits]
  cutoff = int(np.searchsorted(np.cumsum(p_V[top]), desired_logit_prob)) + 1
  top = top[:cutoff]
  return top.astype(np.int32), p_V[top].astype(np.float32)
