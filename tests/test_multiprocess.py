"""Two real JAX processes (jax.distributed over loopback, gloo CPU collectives) train like one."""

import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from transformer import metrics

from conftest import REPO, run_module

ARGS = [
  "--config=experiments/shakespeare.py:tiny",
  "--config.sample.max_new_tokens=0",
  "--config.num_train_steps=8",
  "--config.log_every_steps=1",
  "--config.eval_every_steps=8",
  "--config.checkpoint_every_steps=4",
]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _train_in_two_processes(args: list[str]) -> list[str]:
  """launch.train with `args` in 2 processes of 4 fake CPU devices each over loopback: their stdouts, once both
  finished (each must succeed)."""
  port = _free_port()
  procs = [
    subprocess.Popen(
      [sys.executable, "-m", "launch.train", *args]
      + [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      env={**os.environ, "JAX_NUM_CPU_DEVICES": "4"},
    )
    for i in range(2)
  ]
  outs = [p.communicate(timeout=300) for p in procs]
  assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
  assert "8 x cpu (cpu), 2 process(es)" in outs[0][0]
  return [out for out, _ in outs]


@pytest.mark.slow
def test_two_processes_of_four_devices_match_one_of_eight_and_one_process_resumes_them(tmp_path):
  """2 processes x 4 devices (data 2 x fsdp 4 over both) train like 1 process x 8, step for step; the
  checkpoints the two wrote (each process its shards) are whole, and one process on one device
  resumes them."""
  data_root = tmp_path / "data"
  mesh = ["--config.mesh.data=2", "--config.mesh.fsdp=4", "--config.model.vocab_size=96"]
  longer = ["--config.num_train_steps=12", "--config.eval_every_steps=12", "--config.checkpoint_every_steps=4"]
  one = run_module(
    "launch.train",
    *ARGS,
    *mesh,
    *longer,
    f"--config.data.root={data_root}",
    f"--workdir={tmp_path / 'one'}",
    env={"JAX_NUM_CPU_DEVICES": "8"},
  )
  assert one.returncode == 0, one.stderr
  two = [*ARGS, *mesh, *longer, f"--workdir={tmp_path / 'two'}"]
  _train_in_two_processes([*two, f"--config.data.root={tmp_path / 'data2'}"])  # prepared anew: by process 0
  # The two processes' data is one preparation, the one a single process wrote, and nothing else.
  [one_dir], [two_dir] = [list(root.iterdir()) for root in (data_root, tmp_path / "data2")]
  written = lambda d: {
    p.relative_to(d): p.read_bytes() for p in d.rglob("*") if p.is_file() and p.name != "manifest.json"
  }
  assert written(two_dir) == written(one_dir) and len(written(one_dir)) > 5
  manifests = [json.loads((d / "manifest.json").read_text()) for d in (one_dir, two_dir)]
  assert manifests[0]["request"] == manifests[1]["request"] and manifests[0]["splits"] == manifests[1]["splits"]
  assert sorted(int(p.name) for p in (tmp_path / "two" / "checkpoints").iterdir() if p.name.isdigit()) == [4, 8, 12]
  # One process, one device, the data-parallel mesh: steps 9..12 again, from the two processes'
  # checkpoint of step 8 (the later one removed).
  shutil.rmtree(tmp_path / "two" / "checkpoints" / "12")
  resumed = run_module(
    "launch.train",
    *ARGS,
    *longer,
    "--config.model.vocab_size=96",
    f"--config.data.root={data_root}",
    f"--workdir={tmp_path / 'two'}",
  )
  assert resumed.returncode == 0, resumed.stderr
  assert "resumed from" in resumed.stdout and "at step 8" in resumed.stdout
  a = metrics.last_per_step(metrics.read_jsonl(tmp_path / "one" / "metrics.jsonl"), "loss")
  b = metrics.last_per_step(metrics.read_jsonl(tmp_path / "two" / "metrics.jsonl"), "loss")
  assert sorted(a) == sorted(b) == list(range(1, 13))
  np.testing.assert_allclose([b[s] for s in sorted(b)], [a[s] for s in sorted(a)], atol=1e-5)


@pytest.mark.slow
def test_an_sae_trains_in_two_processes_as_in_one(tmp_path):
  """A TopK SAE's latents over the tensor axis and its rows over data and fsdp, the mesh across 2 processes x 4
  devices: the same losses, step for step, as 1 process x 8 devices (TopK's selection across the latents' shards)."""
  sae = ["--config=experiments/sae.py:tiny", "--config.log_every_steps=1", "--config.num_train_steps=8"]
  sae += ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"]
  one = run_module("launch.train", *sae, f"--workdir={tmp_path / 'one'}", env={"JAX_NUM_CPU_DEVICES": "8"})
  assert one.returncode == 0, one.stderr[-3000:]
  _train_in_two_processes([*sae, f"--workdir={tmp_path / 'two'}"])
  a = metrics.last_per_step(metrics.read_jsonl(tmp_path / "one" / "metrics.jsonl"), "loss")
  b = metrics.last_per_step(metrics.read_jsonl(tmp_path / "two" / "metrics.jsonl"), "loss")
  assert sorted(a) == sorted(b) == list(range(1, 9))
  np.testing.assert_allclose([b[s] for s in sorted(b)], [a[s] for s in sorted(a)], rtol=1e-5)
