"""The training system end to end, with real processes for SIGTERM and 8 devices (SIGKILLs mid-run and
during saves, then the identical resumed losses: test_faults.py)."""

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import gpt2 as gpt2_experiment
from experiments import shakespeare
from transformer import inference, metrics, optim, train
from transformer.config import OptimizerConfig
from transformer.models.gpt import GPT, GPTConfig
from transformer.tasks.lm import lm_loss

from conftest import REPO, compiled_init, run_module

TINY = ["--config=experiments/shakespeare.py:tiny", "--config.sample.max_new_tokens=0"]


def _tiny_step(batch_size: int):
  """(model, initial state, a batch, step(loss_fn, accumulation_steps) -> (state, metrics)) of a tiny GPT."""
  model = GPT(GPTConfig().replace(vocab_size=23, max_len=16, num_layers=1, num_heads=2, d_model=16))
  tx = optim.make_optimizer(OptimizerConfig(lr=1e-2, warmup_steps=0, schedule="constant"), 10)
  params = compiled_init(model, jnp.zeros((1, 8), jnp.int32))
  state = train.TrainState(
    step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=jax.random.key_data(jax.random.key(1))
  )
  batch = jax.random.randint(jax.random.key(2), (batch_size, 9), 0, 23)

  def step(loss_fn, accum=1):
    return jax.jit(
      functools.partial(train.train_step, loss_fn=loss_fn, tx=tx, schedule=lambda s: 0.0, accumulation_steps=accum)
    )(state, batch)

  return model, state, batch, step


@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_batch():
  model, state, batch, step = _tiny_step(8)
  loss_fn = functools.partial(lm_loss, model)
  s1, m1 = step(loss_fn, 1)
  s4, m4 = step(loss_fn, 4)
  np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=1e-5)
  np.testing.assert_allclose(m4["grad_norm"], m1["grad_norm"], rtol=1e-4)
  np.testing.assert_allclose(s4.params["wte"]["embedding"], s1.params["wte"]["embedding"], atol=1e-6)


@pytest.mark.slow
def test_a_nonfinite_step_is_not_applied():
  model, state, batch, step = _tiny_step(4)

  def nan_loss(params, batch, rng, is_training):  # a real NaN through the gradients
    loss, tokens = lm_loss(model, params, batch, rng, is_training)
    return loss * jnp.sqrt(-1.0), tokens

  bad, m = step(nan_loss)
  assert not m["finite"] and np.isnan(m["loss"])
  chex.assert_trees_all_equal((bad.params, bad.opt_state), (state.params, state.opt_state))
  assert bad.step == 1 and not np.array_equal(bad.rng, state.rng)  # the step and its randomness are used up
  good, m = step(functools.partial(lm_loss, model))
  assert m["finite"] and not np.allclose(good.params["wte"]["embedding"], state.params["wte"]["embedding"])


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
  return tmp_path_factory.mktemp("data")


def _args(data_root, workdir, *extra):
  return [*TINY, f"--config.data.root={data_root}", f"--workdir={workdir}", *extra]


def _losses(workdir, key="loss"):
  return metrics.last_per_step(metrics.read_jsonl(workdir / "metrics.jsonl"), key)


@pytest.mark.slow
def test_end_to_end_in_process(tmp_path, data_root, capsys):
  config = shakespeare.get_config("tiny")
  config.data.root = str(data_root)
  config.num_train_steps = 40
  result = train.train_and_evaluate(config, tmp_path)
  # The start-up line says which fast forms run, and metrics.jsonl records them.
  assert "\nkernels: cpu (auto on cpu: causal attention by blocks" in capsys.readouterr().out
  started = metrics.read_jsonl(tmp_path / "metrics.jsonl")[0]
  assert started == {"step": 0, "event": "started", "kernels": "cpu", "config_kernels": "auto"}
  losses = _losses(tmp_path)
  first, last = losses[5], losses[40]
  assert last < first - 0.5, losses  # it learns
  assert result["val_loss"] < 3.6 and np.isfinite(result["val_perplexity"])
  records = metrics.read_jsonl(tmp_path / "metrics.jsonl")
  step_record = next(r for r in records if r["step"] == 40 and "loss" in r)
  assert {"loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "mfu"} <= set(step_record)
  assert step_record["mfu"] is None  # CPU: no peak to compare with
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["20", "40"]
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
  assert (tmp_path / "loss.png").stat().st_size > 5000
  assert json.loads((tmp_path / "config.json").read_text())["model"]["num_layers"] == 2
  assert len(result["sample"]) > 0 and (tmp_path / "samples.txt").exists()


@pytest.mark.slow
def test_a_workdir_written_before_the_block_was_nested_restores_and_resumes(tmp_path, data_root):
  """tests/fixtures/workdir_before_block: 4 steps of the tiny preset (d_model 32, 1 layer) trained by
  the version of 2026-11-25, whose config.json holds the block's fields flat and `context_length`."""
  old = tmp_path / "w"
  shutil.copytree(REPO / "tests" / "fixtures" / "workdir_before_block", old)
  assert "context_length" in json.loads((old / "config.json").read_text())["model"]
  trained = inference.restore(old)
  assert trained.step == 4 and trained.run.model.max_len == 64
  assert (trained.run.model.block.d_model, trained.run.model.block.num_heads, trained.run.model.num_layers) == (
    32,
    2,
    1,
  )
  assert trained.params["wpe"].shape == (64, 32)
  # The same run, launched today: it resumes from step 4 (nothing that may not change has changed).
  config = shakespeare.get_config("tiny")
  config.data.root = str(data_root)
  config.model.block.d_model, config.model.num_layers = 32, 1
  config.num_train_steps, config.eval_every_steps, config.sample.max_new_tokens = 6, 6, 0
  config.log_every_steps = 1
  result = train.train_and_evaluate(config, old)
  records = metrics.read_jsonl(old / "metrics.jsonl")
  assert any(r.get("event") == "resumed" for r in records) and np.isfinite(result["val_loss"])
  assert sorted(s for s in _losses(old) if s > 4) == [5, 6]


@pytest.mark.slow
def test_sigterm_saves_then_exits_zero(tmp_path, data_root):
  workdir = tmp_path / "w"
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "launch.train",
      *_args(
        data_root,
        workdir,
        "--config.num_train_steps=100000",
        "--config.log_every_steps=1",
        "--config.checkpoint_every_steps=100000",
      ),
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  deadline = time.time() + 120
  while time.time() < deadline and max(_losses(workdir), default=0) < 5:
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err
  steps = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
  assert len(steps) == 1 and 5 <= steps[0] < 100000
  assert steps[0] >= max(_losses(workdir))


@pytest.mark.slow
# Dot products: test_faults.py's run that moves between 8 devices and 1 compares every step from the first.
@pytest.mark.parametrize("mechanism", ["synthesizer_dense", "synthesizer_random"])
def test_one_and_eight_devices_give_the_same_losses(tmp_path, data_root, mechanism):
  extra = [
    "--config.num_train_steps=12",
    "--config.log_every_steps=1",
    "--config.model.vocab_size=96",
    f"--config.model.block.attention_mechanism={mechanism}",
  ]
  one = run_module("launch.train", *_args(data_root, tmp_path / "one", *extra))
  assert one.returncode == 0, one.stderr
  eight = run_module(
    "launch.train",
    *_args(
      data_root, tmp_path / "eight", *extra, "--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"
    ),
    env={"JAX_NUM_CPU_DEVICES": "8"},
  )
  assert eight.returncode == 0, eight.stderr
  assert "8 x cpu" in eight.stdout
  a, b = _losses(tmp_path / "one"), _losses(tmp_path / "eight")
  assert len(a) == 12
  np.testing.assert_allclose([b[s] for s in sorted(b)], [a[s] for s in sorted(a)], atol=1e-5)
  np.testing.assert_allclose(
    _losses(tmp_path / "eight", "val_loss")[12], _losses(tmp_path / "one", "val_loss")[12], atol=1e-5
  )


# Today's recipe pieces: rotary positions, RMSNorm, SwiGLU, QK-norm, an untied capped head, Muon, WSD.
MODERN = [
  "--config.model.positions=rope",
  "--config.model.block.norm=rms_norm",
  "--config.model.block.activation=swiglu",
  "--config.model.block.qk_norm=true",
  "--config.model.tie_embeddings=false",
  "--config.model.logits_softcap=30",
  "--config.model.vocab_size=96",  # 96: splits over the tensor axis
  "--config.optimizer.name=muon",
  "--config.optimizer.schedule=wsd",
  "--config.num_train_steps=20",
  "--config.log_every_steps=1",
  "--config.checkpoint_every_steps=10",
  "--config.eval_every_steps=10",
]


@pytest.mark.slow
def test_todays_options_learn_on_eight_devices_and_resume_on_one_with_the_same_losses(tmp_path, data_root):
  """Started on 8 devices (data, fsdp and tensor parallel: Muon's state sharded), killed while saving
  step 20, resumed from step 10 on 1 device: every loss is the uninterrupted one-device run's."""
  one = run_module("launch.train", *_args(data_root, tmp_path / "one", *MODERN))
  assert one.returncode == 0, one.stderr[-3000:]
  a = _losses(tmp_path / "one")
  assert a[20] < a[1] - 0.5, a  # it learns
  workdir = tmp_path / "moved"
  eight = subprocess.run(
    [sys.executable, "tests/inject.py", "--kill_at_commit=20", "--", *_args(data_root, workdir, *MODERN)]
    + ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"],
    cwd=REPO,
    env={**os.environ, "JAX_NUM_CPU_DEVICES": "8"},
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert eight.returncode == -signal.SIGKILL and "8 x cpu" in eight.stdout, eight.stderr[-3000:]
  resumed = run_module("launch.train", *_args(data_root, workdir, *MODERN))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "at step 10" in resumed.stdout
  b = _losses(workdir)
  np.testing.assert_allclose([b[s] for s in range(1, 21)], [a[s] for s in range(1, 21)], atol=2e-5)
  np.testing.assert_allclose(_losses(workdir, "val_loss")[20], _losses(tmp_path / "one", "val_loss")[20], atol=2e-5)


@pytest.mark.parametrize(
  "extra,env,message",
  [
    (
      ["--config.batch_size=6"],
      {"JAX_NUM_CPU_DEVICES": "8"},
      r"batch_size=6 \(microbatch 6\) is not divisible by the data-parallel size 8",
    ),
    (["--config.seq_len=100"], {}, "--config.seq_len=100 is longer than --config.model.max_len=64"),
    (["--config.data.dataset=wiki"], {}, "unknown data set 'wiki'"),
    (["--config.data.input_files=/no/such.txt"], {}, "/no/such.txt: no such file"),
    (["--config.mesh.data=3"], {}, r"needs 3 devices but 1 are available"),
    (["--config.mesh.tensor=2"], {"JAX_NUM_CPU_DEVICES": "2"}, "parameter 'wte/embedding' has a dimension of 85"),
  ],
)
@pytest.mark.slow
def test_bad_configs_fail_in_one_line(tmp_path, data_root, extra, env, message):
  proc = run_module("launch.train", *_args(data_root, tmp_path / "w", *extra), env=env)
  assert proc.returncode == 1
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and re.search(message, last), last


@pytest.mark.slow
def test_own_text_files_are_one_override_away(tmp_path):
  text = tmp_path / "mine.txt"
  text.write_text("the quick brown fox jumps over the lazy dog.\n" * 400)
  config = shakespeare.get_config("tiny")
  config.data.input_files = (str(text),)
  config.data.root = str(tmp_path / "data")
  config.data.piece_chars = 1000
  config.num_train_steps = 10
  config.eval_every_steps = 10
  config.sample.max_new_tokens = 0
  train.train_and_evaluate(config, tmp_path / "w")
  assert (tmp_path / "data" / "mine-char" / "manifest.json").exists()


def test_gpt2_recipes():
  for preset in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"):
    c = gpt2_experiment.get_config(preset)
    assert c.batch_size * c.seq_len == 524_288  # ~0.5M tokens per optimizer step
    assert c.batch_size % c.optimizer.accumulation_steps == 0
    assert c.model.block.d_model == {"gpt2": 768, "gpt2-medium": 1024, "gpt2-large": 1280, "gpt2-xl": 1600}[preset]
    assert (
      c.optimizer.weight_decay == 0.1 and c.model.block.dtype == "bfloat16" and c.model.block.param_dtype == "float32"
    )
  assert gpt2_experiment.get_config("gpt2").optimizer.lr == 6e-4
