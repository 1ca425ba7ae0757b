"""Activations in superposition whose features are known (Elhage et al. 2022, "Toy Models of
Superposition"): n sparse features, each a fixed unit direction in d < n dimensions, so that a sparse
autoencoder's recovery of them can be measured (transformer.models.sae.recovery).

A row is sum_i a_i f_i: feature i is present with probability `density` (times its `importance`
decaying as importance**i, so later features are rarer), with a magnitude uniform in [0, 1).
Rows are a pure function of (seed, index): any batch can be made again, which makes a stream of them
resumable from a position alone.

    >>> source = Superposition(num_features=512, d=64, density=0.02)
    >>> x_NxD = source.batch(index=0, rows=4096)
    >>> source.directions_FxD          # the ground truth
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Superposition:
  num_features: int = 512
  d: int = 64
  density: float = 0.02  # the first feature's probability of being present in a row
  importance: float = 1.0  # feature i is present with probability density * importance**i
  seed: int = 0

  def __post_init__(self):
    if not 0 < self.d < self.num_features:
      raise ValueError(f"superposition needs 0 < d < num_features; got d={self.d}, num_features={self.num_features}")
    if not 0 < self.density <= 1 or not 0 < self.importance <= 1:
      raise ValueError(f"density and importance are in (0, 1]; got {self.density}, {self.importance}")

  @property
  def directions_FxD(self) -> np.ndarray:
    """The features' directions: unit vectors, random in d dimensions (fixed by the seed)."""
    directions = np.random.default_rng(self.seed).normal(size=(self.num_features, self.d))
    return (directions / np.linalg.norm(directions, axis=1, keepdims=True)).astype(np.float32)

  @property
  def probabilities_F(self) -> np.ndarray:
    return self.density * self.importance ** np.arange(self.num_features)

  def batch(self, index: int, rows: int) -> np.ndarray:
    """Rows x d activations: batch `index` of the stream (the same for the same index)."""
    rng = np.random.default_rng([self.seed, index + 1])
    present = rng.random((rows, self.num_features)) < self.probabilities_F
    magnitudes = rng.random((rows, self.num_features)).astype(np.float32)
    return (present * magnitudes) @ self.directions_FxD
