"""The Fourier analysis of a transformer that does modular arithmetic: the algorithm Nanda, Chan,
Lieberum, Smith & Steinhardt (ICLR 2023, "Progress measures for grokking via mechanistic
interpretability") found, and the progress measures they defined with it.

A one-layer transformer trained on (a + b) mod p embeds a and b as rotations at a few key frequencies
w_k = 2πk/p, multiplies them in the MLP (cos(w(a+b)) from cos(wa)cos(wb) - sin(wa)sin(wb)) and reads c
off by constructive interference: logit(c) ≈ Σ_k α_k cos(w_k(a + b - c)). So:

  fourier_basis(p)         the orthonormal basis of functions on 0..p-1: the constant, cos and sin of
                           each frequency 1..(p-1)/2 (rows)
  frequency_norms(W)       each frequency's share of a matrix's rows-by-token (the embedding: sparse
                           in this basis once the model has grokked)
  key_frequencies          the largest of them
  gini                     how unequal those norms are (0: all equal; near 1: a few carry everything)
  restricted / excluded    the logits over all p² inputs kept only on the directions cos(w_k(a+b)),
                           sin(w_k(a+b)) of the key frequencies (and the constant), or with exactly
                           those removed: the two projections sum to the identity
  neuron_frequencies       each MLP neuron's best frequency and the fraction of its variance over (a, b)
                           that frequency's terms explain
  interference_fit         the fraction of the logits' variance that Σ_k α_k cos(w_k(a+b-c)) explains

Inputs here are arrays over the p² inputs in the order a * p + b (`transformer.tasks.modular.all_pairs`).
"""

from __future__ import annotations

import numpy as np


def fourier_basis(p: int) -> tuple[np.ndarray, list[str]]:
  """(p x p orthonormal rows: the constant, then cos and sin of frequencies 1..(p-1)/2, their names).
  For odd p (every prime but 2) the rows are exactly a basis of functions on 0..p-1."""
  x = np.arange(p)
  rows, names = [np.ones(p)], ["const"]
  for k in range(1, p // 2 + 1):
    rows += [np.cos(2 * np.pi * k * x / p), np.sin(2 * np.pi * k * x / p)]
    names += [f"cos {k}", f"sin {k}"]
  basis = np.stack(rows[:p])
  return basis / np.linalg.norm(basis, axis=1, keepdims=True), names[:p]


def frequency_norms(W_pxD) -> np.ndarray:
  """The norm of each frequency 1..(p-1)/2 in a matrix with a row per token 0..p-1 (the embedding):
  √(|cos_k W|² + |sin_k W|²); index k-1 is frequency k."""
  W_pxD = np.asarray(W_pxD, np.float64)
  p = W_pxD.shape[0]
  basis, _ = fourier_basis(p)
  components = np.square(basis @ W_pxD).sum(-1)
  return np.sqrt(components[1::2] + components[2::2])[: (p - 1) // 2]


def key_frequencies(norms_K, count: int) -> list[int]:
  """The `count` frequencies (1-based) with the largest norms, ascending."""
  return sorted(int(i) + 1 for i in np.argsort(-np.asarray(norms_K))[:count])


def gini(values) -> float:
  """The Gini coefficient of non-negative values: 0 when all are equal, (n-1)/n when one holds all."""
  v = np.sort(np.asarray(values, np.float64))
  n = len(v)
  return float((2 * np.arange(1, n + 1) - n - 1) @ v / (n * v.sum())) if v.sum() > 0 else 0.0


def key_directions(p: int, frequencies) -> np.ndarray:
  """p² x (1 + 2K) orthonormal columns over the inputs (a, b): the constant, cos(w_k(a+b)) and
  sin(w_k(a+b)) of each key frequency k."""
  a, b = np.divmod(np.arange(p * p), p)
  columns = [np.ones(p * p)]
  for k in frequencies:
    w = 2 * np.pi * k / p
    columns += [np.cos(w * (a + b)), np.sin(w * (a + b))]
  columns = np.stack(columns, 1)
  return columns / np.linalg.norm(columns, axis=0)


def restricted(logits_NxC, p: int, frequencies) -> np.ndarray:
  """The logits (one row per input, N = p²) projected on the key frequencies' directions over the
  inputs and the constant: what the model computes with those frequencies alone."""
  Q = key_directions(p, frequencies)
  return Q @ (Q.T @ np.asarray(logits_NxC, np.float64))


def excluded(logits_NxC, p: int, frequencies) -> np.ndarray:
  """The logits with exactly `restricted`'s part removed: what is left without the key frequencies."""
  logits_NxC = np.asarray(logits_NxC, np.float64)
  return logits_NxC - restricted(logits_NxC, p, frequencies)


def ablate(logits_NxC, p: int, frequencies) -> np.ndarray:
  """The logits with the directions cos(w_k(a+b)), sin(w_k(a+b)) of `frequencies` removed (not the
  constant): what the model computes without those frequencies."""
  Q = key_directions(p, frequencies)[:, 1:]
  logits_NxC = np.asarray(logits_NxC, np.float64)
  return logits_NxC - Q @ (Q.T @ logits_NxC)


def cross_entropy(logits_NxC, labels_N) -> float:
  """Mean cross-entropy (float64, as the analysis's projections are)."""
  logits_NxC = np.asarray(logits_NxC, np.float64)
  top = logits_NxC.max(-1, keepdims=True)
  log_z = np.log(np.exp(logits_NxC - top).sum(-1)) + top[:, 0]
  return float(np.mean(log_z - logits_NxC[np.arange(len(labels_N)), labels_N]))


def neuron_frequencies(acts_NxF, p: int) -> tuple[np.ndarray, np.ndarray]:
  """(each neuron's best frequency, 1-based; the fraction of its variance over the p² inputs that the
  eight terms of that frequency explain: cos/sin of w·a, of w·b, and their four products). The
  neuron's activation as a p x p function of (a, b), in the 2-D Fourier basis."""
  acts = np.asarray(acts_NxF, np.float64).reshape(p, p, -1)
  basis, _ = fourier_basis(p)
  coefficients_pxpxF = np.einsum("ia,abf,jb->ijf", basis, acts, basis, optimize=True)  # two products
  power_pxpxF = np.square(coefficients_pxpxF)
  power_pxpxF[0, 0] = 0.0  # the mean is not variance
  total_F = power_pxpxF.sum((0, 1))
  explained_KxF = np.stack(
    [power_pxpxF[np.ix_(idx, idx)].sum((0, 1)) for k in range(1, (p - 1) // 2 + 1) for idx in [[0, 2 * k - 1, 2 * k]]]
  )
  best_F = explained_KxF.argmax(0)
  return best_F + 1, explained_KxF[best_F, np.arange(acts.shape[-1])] / np.maximum(total_F, 1e-30)


def interference_fit(logits_NxC, p: int, frequencies) -> tuple[float, np.ndarray]:
  """(the fraction of the logits' variance explained, the weights α_k) of the least-squares fit of
  logit(a, b, c) = α_0 + Σ_k α_k cos(w_k(a + b - c)) over every input and every answer c < p."""
  logits = np.asarray(logits_NxC, np.float64)[:, :p].reshape(p, p, p)
  a, b, c = np.meshgrid(np.arange(p), np.arange(p), np.arange(p), indexing="ij")
  columns = [np.ones(p**3)] + [np.cos(2 * np.pi * k / p * (a + b - c)).ravel() for k in frequencies]
  X = np.stack(columns, 1)
  alpha, *_ = np.linalg.lstsq(X, logits.ravel(), rcond=None)
  residual = logits.ravel() - X @ alpha
  centred = logits.ravel() - logits.mean()
  return float(1 - residual @ residual / (centred @ centred)), alpha[1:]
