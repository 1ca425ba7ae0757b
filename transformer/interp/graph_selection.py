"""Which active features become an attribution graph's nodes under a cap (transformer.interp.graph's
`max_feature_nodes`), as circuit-tracer 0.5 chooses them: the logits' rows first, then the features of the largest
influence on the logits through the rows computed so far, a queue at a time.

    >>> selected, rows = capped_rows(rows_of, n, logit_p, cap=1024, queue=batch_size * update_interval)
"""

from __future__ import annotations

import numpy as np


def capped_rows(rows_of, n: int, logit_p, cap: int, queue: int) -> tuple[np.ndarray, np.ndarray]:
  """(the `cap` features chosen, ascending; their rows in that order, then the logits') as circuit-tracer 0.5's
  `_run_attribution` chooses them: the logits' rows first, then, `queue` rows at a time (its update_interval x
  batch_size), the unvisited features of the largest partial influence on the logits through the rows so far."""
  logit_rows = rows_of(np.arange(n, n + len(logit_p)))
  C = logit_rows.shape[1]
  feature_rows = np.zeros((cap, C), np.float32)
  order = np.zeros(0, np.int64)
  visited = np.zeros(n, bool)
  while len(order) < cap:
    nodes = np.concatenate([C + np.arange(len(logit_p)), order])  # each row's node, as a column of the influence
    influence = partial_influences(np.concatenate([logit_rows, feature_rows[: len(order)]]), logit_p, nodes)
    rank = np.argsort(-influence[:n], kind="stable")
    pending = rank[~visited[rank]][: min(queue, cap - len(order))]
    feature_rows[len(order) : len(order) + len(pending)] = rows_of(pending)
    visited[pending] = True
    order = np.concatenate([order, pending])
  by_index = np.argsort(order)
  return order[by_index], np.concatenate([feature_rows[by_index], logit_rows])


def partial_influences(rows_RxC, logit_p, row_nodes, max_iter: int = 128) -> np.ndarray:
  """Each node's influence on the logits through the rows computed so far (circuit-tracer's
  `compute_partial_influences`): the logits' probabilities carried back through the rows' absolute values,
  each row normalised to sum 1, summed over every path length. `row_nodes`: the node of each row (logits after
  the C sources). C + K."""
  K = len(logit_p)
  A_RxN = np.zeros((len(rows_RxC), rows_RxC.shape[1] + K), np.float32)
  A_RxN[:, : rows_RxC.shape[1]] = np.abs(rows_RxC)
  A_RxN /= np.maximum(A_RxN.sum(1, keepdims=True), 1e-8)
  prod_N = np.zeros(A_RxN.shape[1], np.float32)
  prod_N[-K:] = logit_p
  influence_N = np.zeros_like(prod_N)
  for _ in range(max_iter):
    prod_N = prod_N[row_nodes] @ A_RxN
    if not prod_N.any():
      return influence_N
    influence_N += prod_N
  raise RuntimeError("the partial influences did not converge: the rows hold a cycle")
