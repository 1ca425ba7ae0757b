"""SAELens's TopK SAE, trained for `launch.bench --what=sae` beside ours on the same activations.

Runs in a venv of its own with sae-lens (launch/bench/peer_env.py makes it: sae-lens pins another
transformer-lens than the patching peer's); imports nothing from this repository. Reads a JSON spec
(the .npy of training rows, the .npy of held-out rows, d_sae, k, batch, steps, lr), trains
`TopKTrainingSAE` with Adam (betas 0.9, 0.999) on the training rows' batches in order, cycled, and
prints one JSON line: the median seconds a step (after warmup), and the explained variance and L0 of
the trained SAE on the held-out rows.

  <venv>/bin/python launch/bench/peers/sae_peer.py '<json spec>'
"""

import json
import statistics
import sys
import time

import numpy as np
import sae_lens
import torch
from sae_lens.saes.sae import TrainStepInput
from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig


def main(spec: dict) -> dict:
  torch.manual_seed(0)
  rows = torch.from_numpy(np.load(spec["train"]))
  held_out = torch.from_numpy(np.load(spec["eval"]))
  d_in, batch, warmup = rows.shape[1], spec["batch"], spec["warmup"]
  config = TopKTrainingSAEConfig(d_in=d_in, d_sae=spec["d_sae"], k=spec["k"], dtype="float32", device="cpu")
  sae = TopKTrainingSAE(config)
  optimizer = torch.optim.Adam(sae.parameters(), lr=spec["lr"], betas=(0.9, 0.999))
  dead = torch.zeros(spec["d_sae"], dtype=torch.bool)
  batches = len(rows) // batch
  times = []
  for step in range(spec["steps"]):
    x = rows[(step % batches) * batch : (step % batches + 1) * batch]
    start = time.perf_counter()
    out = sae.training_forward_pass(
      TrainStepInput(sae_in=x, coefficients={}, dead_neuron_mask=dead, n_training_steps=step, is_logging_step=False)
    )
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    times.append(time.perf_counter() - start)
  with torch.no_grad():
    latents = sae.encode(held_out)
    reconstruction = sae.decode(latents)
  error = ((reconstruction - held_out) ** 2).sum()
  variance = ((held_out - held_out.mean(0)) ** 2).sum()
  return {
    "step_seconds": statistics.median(times[warmup:]),
    "explained_variance": float(1 - error / variance),
    "l0": float((latents > 0).sum(-1).float().mean()),
    "versions": f"sae-lens {sae_lens.__version__}, torch {torch.__version__}",
    "threads": torch.get_num_threads(),
  }


if __name__ == "__main__":
  print(json.dumps(main(json.loads(sys.argv[1]))))
