"""`launch.bench --what=sae`: a TopK SAE trained on the same activations with ours and with SAELens.

The activations are rows in superposition (transformer.data.superposition: 4 x d_in features in d_in
dimensions), written once to .npy files that both read: --sae_batches batches of --sae_batch rows to
train on, cycled for --sae_steps steps in the same order, and 8192 held-out rows. Ours is the `sae`
task's step as the loop compiles it (transformer.train); the peer (launch/bench/peers/sae_peer.py) SAELens's
`TopKTrainingSAE`, both with Adam (lr --sae_lr, betas 0.9 and 0.999, no weight decay, constant rate),
no input scaling, b_dec starting at zero. Reported: the median step after warmup as training rows
(tokens) a second, and each trained SAE's explained variance and L0 on the held-out rows.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from launch.bench import peer_env
from transformer import benchmark, metrics, tasks, train
from transformer.data.superposition import Superposition
from transformer.models.sae import scores

WARMUP = 5  # steps left out of the median (the first compiles)


def _ours(o, train_file: Path, held_out_NxD: np.ndarray) -> dict:
  c = tasks.defaults("sae")
  c.data.input_files = (str(train_file),)
  c.model.d_sae, c.model.k, c.batch_size = o.sae_d_sae, o.sae_k, o.sae_batch
  c.num_train_steps = o.sae_steps
  c.optimizer.update(dict(lr=o.sae_lr, b2=0.999, weight_decay=0.0, grad_clip_norm=0.0, warmup_steps=0))
  c.optimizer.schedule = "constant"
  config = tasks.resolve(c, num_devices=jax.device_count())
  run = train.build(config, tasks.load_data(config, None))
  step_fn, _ = train.jit_steps(run)
  rows_NxD = np.load(train_file)
  batches = len(rows_NxD) // o.sae_batch
  with jax.set_mesh(run.mesh):
    state = train.init_state(run)
    times = []
    for step in range(o.sae_steps):
      x = rows_NxD[(step % batches) * o.sae_batch : (step % batches + 1) * o.sae_batch]
      start = time.perf_counter()
      state, _ = step_fn(state, run.task.put(x))
      jax.block_until_ready(state)
      times.append(time.perf_counter() - start)
    x_hat, z = run.task.model.apply({"params": state.params}, held_out_NxD)
  return {"step_seconds": statistics.median(times[WARMUP:]), **scores(held_out_NxD, x_hat, z)}


def sae_table(o) -> str:
  header = (
    f"TopK SAE training: d_in {o.sae_d_in}, d_sae {o.sae_d_sae}, k {o.sae_k}, batch {o.sae_batch}, "
    f"{o.sae_steps} steps (median after {WARMUP}), Adam, float32"
  )
  source = Superposition(num_features=4 * o.sae_d_in, d=o.sae_d_in, density=0.01, importance=0.999)
  with tempfile.TemporaryDirectory() as tmp:
    train_file, eval_file = Path(tmp) / "train.npy", Path(tmp) / "eval.npy"
    np.save(train_file, np.concatenate([source.batch(i, o.sae_batch) for i in range(o.sae_batches)]))
    held_out = source.batch(-1, 8192)
    np.save(eval_file, held_out)
    ours = _ours(o, train_file, held_out)
    python = peer_env.peer_python(o.peer_python, peer_env.SAE_REQUIREMENTS, "sae-peer-venv")
    spec = {
      "train": str(train_file),
      "eval": str(eval_file),
      "d_sae": o.sae_d_sae,
      "k": o.sae_k,
      "batch": o.sae_batch,
      "steps": o.sae_steps,
      "lr": o.sae_lr,
      "warmup": WARMUP,
    }
    theirs = peer_env.run_peers(python, spec, "sae_peer.py")
  rows = [
    [
      name,
      f"{o.sae_batch / r['step_seconds']:,.0f}",
      f"{1000 * r['step_seconds']:.0f}",
      f"{r['explained_variance']:.3f}",
      f"{r['l0']:.1f}",
    ]
    for name, r in (("ours", ours), ("SAELens", theirs))
  ]
  ratio = theirs["step_seconds"] / ours["step_seconds"]
  table = benchmark.table(["", "tokens/s", "ms a step", "explained variance", "L0"], rows)
  return (
    f"{header}\n{table}\nours / SAELens tokens/s: {ratio:.2f}x\n"
    f"peer: {theirs['versions']}, {theirs['threads']} threads; "
    f"ours: jax {jax.__version__} on {metrics.device_summary()}"
  )
