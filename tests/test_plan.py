"""The ahead-of-time planner (transformer.plan in process on one device; launch.plan on 8 fake CPU
devices, in real processes): sharding divides the state, remat trades temporaries for FLOPs,
accumulation keeps the FLOPs, XLA's FLOPs match the analytic count, the batch search, and the errors."""

import json
import subprocess
import sys

import jax
import pytest

from experiments import shakespeare
from transformer import plan, tasks, train

from conftest import REPO, run_module
from test_multiprocess import _free_port

TINY = ["--config=experiments/shakespeare.py:tiny", "--devices=8", "--decode_batch_size=-1"]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
  return tmp_path_factory.mktemp("data")


def _tiny_run(data_root, batch_size: int | None = None, accumulation_steps: int | None = None) -> train.Run:
  config = shakespeare.get_config("tiny")
  config.data.root = str(data_root)
  if batch_size is not None:
    config.batch_size, config.optimizer.accumulation_steps = batch_size, accumulation_steps
  run_config = tasks.resolve(config, num_devices=1)
  return train.build(run_config, tasks.get(run_config.task).load_data(run_config))


def test_the_tiny_preset_planned_in_process_on_one_device(data_root):
  """The inner loop's check of the planner: the train step and the sampler compiled against
  abstract arrays, in this process (the launch program and 8 devices are the slow tests')."""
  run = _tiny_run(data_root)
  step = plan.plan_train(run)
  assert step.params * 3 == pytest.approx(step.params + step.optimizer, rel=0.01)  # AdamW: params, mu, nu
  assert step.params == 4 * sum(x.size for x in jax.tree.leaves(train.abstract_state(run).params))
  assert step.flops == pytest.approx(step.analytic_flops, rel=0.05)
  assert step.total == step.arguments + step.outputs - step.aliased + step.temporaries
  assert step.aliased > 0  # the donated state is written in place
  assert "train step: batch" in plan.describe(step) and "fits in" in plan.describe(step, step.total)
  assert plan.has_sampler(run)
  decode = plan.plan_decode(run, batch_size=2)
  assert decode.params == step.params and decode.flops is None and decode.temporaries > 0
  assert "does not fit: batch 2" in plan.does_not_fit(decode, decode.total // 2)


@pytest.mark.slow
def test_gradient_accumulation_counts_every_microbatch(data_root):
  one = plan.plan_train(_tiny_run(data_root, batch_size=32, accumulation_steps=1))
  four = plan.plan_train(_tiny_run(data_root, batch_size=32, accumulation_steps=4))
  assert four.flops == pytest.approx(one.flops, rel=0.02)
  assert four.temporaries < one.temporaries  # one microbatch's activations at a time


def _plan(data_root, tmp_path, *extra, name="plan"):
  out = tmp_path / f"{name}.json"
  proc = run_module("launch.plan", *TINY, f"--config.data.root={data_root}", f"--json={out}", *extra)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(out.read_text()), proc.stdout


@pytest.mark.slow
def test_fsdp_divides_params_and_optimizer_state_remat_trades_memory_for_flops(data_root, tmp_path):
  [replicated], _ = _plan(data_root, tmp_path, "--config.mesh.data=8", name="data8")
  [fsdp], printed = _plan(data_root, tmp_path, "--config.mesh.data=1", "--config.mesh.fsdp=8", name="fsdp8")
  [remat], _ = _plan(
    data_root, tmp_path, "--config.mesh.data=1", "--config.mesh.fsdp=8", "--config.model.remat_policy=full", name="full"
  )
  assert "train step: batch 8 on 8 devices (data 1 × fsdp 8 × tensor 1)" in printed
  assert "FLOPs per step, all devices: XLA" in printed
  state = lambda p: p["params"] + p["optimizer"]
  # Data parallelism keeps the whole state on every device; fsdp=8 an eighth of it (a few small
  # tensors without an `embed` axis, biases, stay replicated).
  assert state(fsdp) * 8 == pytest.approx(state(replicated), rel=0.10)
  assert state(fsdp) < state(replicated) / 6
  # XLA's own argument sizes agree: the state is most of them.
  assert fsdp["arguments"] * 8 == pytest.approx(replicated["arguments"], rel=0.10)
  assert replicated["params"] * 3 == pytest.approx(state(replicated), rel=0.01)  # AdamW: params, mu, nu
  # The train step's FLOPs: XLA's count within 5% of 6·N + 12·L·d·T per token, the same on any mesh;
  # full remat recomputes the forward pass (~8N against 6N) and keeps fewer activations.
  assert fsdp["flops"] == pytest.approx(fsdp["analytic_flops"], rel=0.05)
  # Pure data parallelism repeats the optimizer update on every device (~4% of this tiny model's step).
  assert fsdp["flops"] < replicated["flops"] < 1.1 * fsdp["flops"]
  assert remat["flops"] > 1.15 * fsdp["flops"]
  assert remat["temporaries"] < 0.8 * fsdp["temporaries"]


@pytest.mark.slow
def test_the_batch_search_finds_the_largest_batch_that_fits(data_root, tmp_path):
  proc = run_module(
    "launch.plan",
    *TINY,
    f"--config.data.root={data_root}",
    "--config.mesh.fsdp=8",
    "--config.mesh.data=1",
    "--device_memory_gib=0.004",
    f"--json={tmp_path / 'p.json'}",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  [found] = json.loads((tmp_path / "p.json").read_text())
  assert found["total"] <= 0.004 * 1024**3
  batch = int(proc.stdout.split("--config.batch_size=")[1].split()[0])
  assert batch == found["batch"] and batch % 8 == 0
  assert "searching for the largest batch" in proc.stdout and f"  batch {batch}: " in proc.stdout  # each candidate
  # One more row per device does not fit.
  [bigger], _ = _plan(
    data_root,
    tmp_path,
    "--config.mesh.fsdp=8",
    "--config.mesh.data=1",
    f"--config.batch_size={batch + 8}",
    name="bigger",
  )
  assert bigger["total"] > 0.004 * 1024**3


@pytest.mark.slow
def test_a_plan_that_does_not_fit_names_its_biggest_consumers(data_root):
  proc = run_module("launch.plan", *TINY, f"--config.data.root={data_root}", "--device_memory_gib=0.0001")
  assert proc.returncode == 1
  [line] = proc.stderr.strip().splitlines()[-1:]
  assert line.startswith("error: does not fit: batch 8 needs")
  assert "the biggest consumers: temporaries (activations, gradients)" in line and "--config.mesh.fsdp" in line


@pytest.mark.parametrize(
  "extra,message",
  [
    (["--config.mesh.tensor=8", "--config.mesh.data=1"], "cannot split 8 ways"),
    (["--config.mesh.data=3"], "needs 3 devices but 8 are available"),
  ],
)
@pytest.mark.slow
def test_a_config_that_cannot_be_sharded_is_one_error(data_root, extra, message):
  proc = run_module("launch.plan", *TINY, f"--config.data.root={data_root}", *extra)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and message in proc.stderr


@pytest.mark.slow
def test_two_processes_of_four_devices_plan_like_one_of_eight(data_root, tmp_path):
  mesh = ["--config.mesh.data=2", "--config.mesh.fsdp=4"]
  [single], _ = _plan(data_root, tmp_path, *mesh, name="single")
  port = _free_port()
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        "-m",
        "launch.plan",
        *TINY[:1],
        "--devices=4",
        "--decode_batch_size=-1",
        f"--config.data.root={data_root}",
        *mesh,
        f"--json={tmp_path / 'multi.json'}",
        f"--coordinator_address=127.0.0.1:{port}",
        "--num_processes=2",
        f"--process_id={i}",
      ],
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]
  outs = [p.communicate(timeout=300) for p in procs]
  assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
  assert "8 x cpu (cpu), 2 process(es)" in outs[0][0]
  [multi] = json.loads((tmp_path / "multi.json").read_text())
  for key in ("arguments", "outputs", "aliased", "params", "optimizer", "batch"):
    assert multi[key] == single[key], key
  assert multi["temporaries"] == pytest.approx(single["temporaries"], rel=0.05)
  assert multi["flops"] == pytest.approx(single["flops"], rel=0.01)


@pytest.mark.slow
def test_an_accelerator_run_is_planned_with_the_accelerators_program(data_root, tmp_path):
  """--platform=gpu on fake CPU devices compiles what a GPU runs (the accelerators' forms of the ops,
  transformer.kernels), not the CPU's: another program, whose memory and FLOPs differ. cuDNN
  attention, which only a GPU compiles, is planned as XLA's, with a note instead of a traceback."""
  mesh = ["--config.mesh.data=1", "--config.mesh.fsdp=8"]
  [cpu], printed_cpu = _plan(data_root, tmp_path, *mesh, "--platform=cpu", name="cpu")
  [gpu], printed_gpu = _plan(data_root, tmp_path, *mesh, "--platform=gpu", name="gpu")
  assert "kernels='cpu'" in printed_cpu and "kernels='accelerator'" in printed_gpu
  assert "planned for gpu: config.model.kernels=auto compiles as 'accelerator'" in printed_gpu
  assert gpu["params"] == cpu["params"] and gpu["optimizer"] == cpu["optimizer"]  # the same state ...
  assert gpu["temporaries"] != cpu["temporaries"]  # ... another program
  [cudnn], printed = _plan(
    data_root, tmp_path, *mesh, "--platform=gpu", "--config.model.block.attention=cudnn", name="cudnn"
  )
  assert "block.attention=cudnn compiles on an NVIDIA GPU only: planned with block.attention=xla" in printed
  assert cudnn["temporaries"] == gpu["temporaries"]


@pytest.mark.slow  # a plan in its own process of 8 fake devices
def test_a_million_latent_topk_sae_on_gemma_2_2bs_stream_is_planned_on_eight_devices(tmp_path):
  """An SAE of 2^20 latents (TopK, k 64) on rows of Gemma 2 2B's width (2,304), its latents split over tensor 4 and
  its 4,096 rows a step over data 2: the train step compiled ahead of time, nothing allocated, and the params a
  quarter of 2 x 2^20 x 2,304 float32 values on each device (the encoder and decoder; the vectors are small)."""
  out = tmp_path / "plan.json"
  args = ["--config=experiments/sae.py:synthetic", "--config.synthetic_d=2304", "--config.synthetic_features=4096"]
  args += ["--config.model.d_sae=1048576", "--config.model.k=64", "--config.batch_size=4096", "--devices=8"]
  args += ["--config.mesh.data=2", "--config.mesh.tensor=4", "--decode_batch_size=-1", f"--json={out}"]
  proc = run_module("launch.plan", *args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  [step] = json.loads(out.read_text())
  weights = 2 * 2**20 * 2304 * 4 / 4  # W_enc and W_dec, float32, a quarter a device
  assert step["mesh"] == {"data": 2, "fsdp": 1, "tensor": 4} and weights <= step["params"] < 1.01 * weights
  assert step["optimizer"] == pytest.approx(2 * step["params"], rel=0.01)  # Adam's two moments
