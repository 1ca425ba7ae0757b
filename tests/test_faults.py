"""What survives what: each fault of the README's table, made real in real processes (a SIGKILL, a
SIGTERM, torn files, a full disk, a NaN, a changed data file, two launches at once), then the next
command on the same workdir. tests/inject.py places a fault at an exact point inside a process."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from transformer import metrics

from conftest import REPO, run_module

TINY = ["--config=experiments/shakespeare.py:tiny", "--config.sample.max_new_tokens=0"]
# 60 steps, a checkpoint every 10 and a validation loss every 20: the run every fault interrupts.
RUN = [
  "--config.num_train_steps=60",
  "--config.log_every_steps=1",
  "--config.checkpoint_every_steps=10",
  "--config.eval_every_steps=20",
]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
  return tmp_path_factory.mktemp("data")


def _args(data_root, workdir, *extra):
  return [*TINY, f"--config.data.root={data_root}", f"--workdir={workdir}", *RUN, *extra]


def train(data_root, workdir, *extra, inject=(), env=None):
  """launch.train on `workdir` (through tests/inject.py when a fault is injected)."""
  if not inject:
    return run_module("launch.train", *_args(data_root, workdir, *extra), env=env)
  return subprocess.run(
    [sys.executable, "tests/inject.py", *inject, "--", *_args(data_root, workdir, *extra)],
    cwd=REPO,
    env={**os.environ, **(env or {})},
    capture_output=True,
    text=True,
    timeout=300,
  )


def losses(workdir, key="loss"):
  return metrics.last_per_step(metrics.read_jsonl(workdir / "metrics.jsonl"), key)


def events(workdir):
  return [r for r in metrics.read_jsonl(workdir / "metrics.jsonl") if "event" in r]


def steps(workdir):
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def error_line(proc):
  last = proc.stderr.strip().splitlines()[-1]
  assert proc.returncode == 1 and last.startswith("error: "), proc.stderr[-3000:]
  return last


def assert_same_losses(workdir, straight, first=1, last=60):
  a, b = losses(straight), losses(workdir)
  assert set(range(first, last + 1)) <= set(b), sorted(b)
  np.testing.assert_allclose([b[s] for s in range(first, last + 1)], [a[s] for s in range(first, last + 1)], rtol=1e-6)


def sample(workdir, *extra, env=None):
  return run_module(
    "launch.sample",
    f"--workdir={workdir}",
    "--prompt=ROMEO:",
    "--max_new_tokens=20",
    "--temperature=0",
    *extra,
    env=env,
  )


@pytest.fixture(scope="module")
def straight(data_root, tmp_path_factory):
  """The uninterrupted run every interrupted one must match."""
  workdir = tmp_path_factory.mktemp("straight")
  proc = train(data_root, workdir)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir


# --- 1. Non-finite losses --------------------------------------------------------------------


@pytest.mark.slow
def test_a_diverging_run_stops_naming_the_step_and_saves_nothing_nonfinite(tmp_path, data_root):
  proc = train(data_root, tmp_path, "--config.optimizer.lr=1e6", "--config.optimizer.grad_clip_norm=0")
  line = error_line(proc)
  assert re.search(r"step \d+ was not finite \(loss nan", line) and "data position" in line, line
  assert "--config.on_nonfinite=skip" in line and "no checkpoint was saved" in line
  assert steps(tmp_path) == []
  assert events(tmp_path)[-1]["event"] == "stopped: nonfinite"


@pytest.mark.slow
def test_skip_policy_skips_logs_and_goes_on_then_stops_after_too_many(tmp_path, data_root):
  proc = train(data_root, tmp_path / "skip", "--config.on_nonfinite=skip", inject=["--nan_at_steps=12,13"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  skipped = [e for e in events(tmp_path / "skip") if e["event"] == "nonfinite step skipped"]
  assert [e["step"] for e in skipped] == [12, 13] and all(np.isnan(e["loss"]) for e in skipped)
  assert np.isfinite(losses(tmp_path / "skip", "val_loss")[60])
  proc = train(
    data_root,
    tmp_path / "stop",
    "--config.on_nonfinite=skip",
    "--config.max_consecutive_skips=1",
    inject=["--nan_at_steps=12,13"],
  )
  assert "2 steps in a row were not finite, more than --config.max_consecutive_skips=1" in error_line(proc)
  assert steps(tmp_path / "stop") == [10]


# --- 2. One run through every interruption, then a clean resume -------------------------------


def _tear(step_dir):
  for path in step_dir.rglob("*"):
    if path.is_file():
      path.write_bytes(b"")


@pytest.mark.slow
def test_one_run_survives_a_nan_a_kill_in_a_save_a_full_disk_a_sigterm_in_evaluation_and_a_torn_checkpoint(
  tmp_path, data_root, straight
):
  """Each launch on the same workdir meets one fault and leaves it usable; the last launch has none.
  Every loss and validation loss is then the uninterrupted run's: nothing a fault left was used."""
  # A NaN at step 13: stops naming the step and its batch; nothing after the bad step is saved.
  line = error_line(train(data_root, tmp_path, inject=["--nan_at_steps=13"]))
  assert "step 13 was not finite (loss nan" in line and "training batch 13" in line, line
  assert "the latest checkpoint, step 10, is the last good state" in line
  assert steps(tmp_path) == [10]
  # Resumed at 10, SIGKILLed while committing step 30: its files stay in a temporary directory.
  killed = train(data_root, tmp_path, inject=["--kill_at_commit=30"])
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  assert steps(tmp_path) == [10, 20] and list((tmp_path / "checkpoints").glob("30.orbax-checkpoint-tmp*"))
  # Resumed at 20 on a full disk: step 30 cannot be written, and the error says what is intact.
  line = error_line(train(data_root, tmp_path, inject=["--max_file_bytes=65536"]))
  assert "could not write checkpoint step 30" in line and "File too large" in line, line
  assert "the checkpoints written before it ([10, 20]) are intact" in line
  # SIGTERM as step 40's evaluation begins: abandoned, not recorded; the state is saved, exit 0.
  evaluations = lambda: [r for r in metrics.read_jsonl(tmp_path / "metrics.jsonl") if "val_loss" in r]
  before = evaluations()  # the full disk's launch evaluated step 40 before its save of 30 failed
  stopped = train(data_root, tmp_path, inject=["--sigterm_in_evaluation=1"])
  assert stopped.returncode == 0, stopped.stderr[-3000:]
  assert steps(tmp_path)[-2:] == [30, 40] and evaluations() == before
  assert {"step": 40, "event": "evaluation interrupted by SIGTERM"} in events(tmp_path)
  # The next launch evaluates step 40 first, then is killed committing 60; step 50 is then torn.
  killed = train(data_root, tmp_path, inject=["--kill_at_commit=60"])
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  assert len(evaluations()) == len(before) + 2 and steps(tmp_path)[-2:] == [40, 50]  # 40's, then 60's
  _tear(tmp_path / "checkpoints" / "50")
  # The clean launch: the torn step is moved aside (kept for a person), training goes on from 40.
  resumed = train(data_root, tmp_path)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert re.search(r"checkpoint step 50 in \S+ is unreadable \(_CHECKPOINT_METADATA is unreadable", resumed.stderr)
  assert "resumed from" in resumed.stdout and "at step 40" in resumed.stdout
  [aside] = (tmp_path / "unreadable_checkpoints").iterdir()
  assert aside.name.startswith("50-") and (aside / "_CHECKPOINT_METADATA").exists()
  assert not list((tmp_path / "checkpoints").glob("*tmp*"))
  assert sorted(losses(tmp_path, "val_loss")) == [20, 40, 60]
  assert_same_losses(tmp_path, straight)


# --- 3. Torn checkpoints when sampling --------------------------------------------------------


@pytest.mark.slow
def test_sampling_falls_back_past_a_torn_checkpoint_and_names_it(tmp_path, data_root, straight):
  workdir = tmp_path / "w"
  subprocess.run(["cp", "-r", str(straight), str(workdir)], check=True)
  _tear(workdir / "checkpoints" / "60")
  latest = sample(workdir)
  assert latest.returncode == 0, latest.stderr[-3000:]
  assert "step 50" in latest.stderr and "checkpoint step 60" in latest.stderr and "unreadable" in latest.stderr
  line = error_line(sample(workdir, "--step=60"))
  assert "checkpoint step 60" in line and "is unreadable" in line and "the intact steps are [40, 50]" in line
  for step in (40, 50):
    _tear(workdir / "checkpoints" / str(step))
  assert "no checkpoint in" in error_line(train(data_root, workdir))


# --- 4. A refused launch writes nothing ------------------------------------------------------


@pytest.mark.slow
def test_a_refused_launch_leaves_the_run_as_it_was(tmp_path, data_root, straight):
  workdir = tmp_path / "w"
  subprocess.run(["cp", "-r", str(straight), str(workdir)], check=True)
  before = {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()}
  line = error_line(
    train(
      data_root,
      workdir,
      "--config.model.block.d_model=96",
      "--config.data.tokenizer=gpt2",
      "--config.num_train_steps=80",
    )
  )
  assert "cannot change when it resumes" in line
  assert "model.block.d_model=96 (the run's: 64)" in line and "data.tokenizer='gpt2' (the run's: 'char')" in line
  assert "num_train_steps" not in line  # that may change
  after = {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file() and p.name != "train.lock"}
  assert after == before and not (workdir / "train.lock").exists()
  assert sample(workdir).returncode == 0
  # What may change does: more steps, another evaluation cadence.
  more = train(data_root, workdir, "--config.num_train_steps=70", "--config.eval_every_steps=35")
  assert more.returncode == 0, more.stderr[-3000:]
  assert "resuming with changes: num_train_steps=70 (the run's: 60); eval_every_steps=35" in more.stdout
  assert json.loads((workdir / "config.json").read_text())["num_train_steps"] == 70


@pytest.mark.slow
def test_without_a_saved_config_the_checkpoint_names_the_parameter(tmp_path, data_root, straight):
  workdir = tmp_path / "w"
  subprocess.run(["cp", "-r", str(straight), str(workdir)], check=True)
  (workdir / "config.json").unlink()
  line = error_line(train(data_root, workdir, "--config.model.block.d_mlp=128"))
  assert "'h/layer_0/mlp/fc/bias' has shape (256,) but the config makes (128,)" in line


# --- 5. Another mesh, another device count ---------------------------------------------------

MESH8 = ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=-1"]
MESH1 = ["--config.mesh.data=-1", "--config.mesh.fsdp=1", "--config.mesh.tensor=1"]
SHARDABLE = ["--config.model.vocab_size=96", "--config.num_train_steps=24"]  # 96: splits over the tensor axis


@pytest.mark.slow
def test_a_run_moves_from_eight_devices_to_one_and_back_and_keeps_the_one_device_losses(tmp_path, data_root):
  """Started on 8 devices (data, fsdp and tensor parallel: the params initialised sharded), resumed on
  1 device, then on 8 again, each leg killed while saving: every loss and validation loss is the
  uninterrupted one-device run's. The params saved sharded 8 ways then sample on 1 and on 12 devices."""
  eight = {"JAX_NUM_CPU_DEVICES": "8"}
  one = train(data_root, tmp_path / "one", *SHARDABLE)
  assert one.returncode == 0, one.stderr[-3000:]
  workdir = tmp_path / "moved"

  def assert_one_device_losses(last):
    for key, first in (("loss", 1), ("val_loss", 20)):
      a, b = losses(tmp_path / "one", key), losses(workdir, key)
      got = [s for s in range(first, last + 1) if s in a]
      np.testing.assert_allclose([b[s] for s in got], [a[s] for s in got], atol=2e-5, err_msg=key)

  first = train(data_root, workdir, *SHARDABLE, *MESH8, inject=["--kill_at_commit=20"], env=eight)
  assert first.returncode == -signal.SIGKILL and steps(workdir) == [10], first.stderr[-3000:]
  assert_one_device_losses(20)  # steps 1-20 and the evaluation at 20, on 8 devices
  second = train(data_root, workdir, *SHARDABLE, *MESH1, inject=["--kill_at_commit=24"])
  assert second.returncode == -signal.SIGKILL and steps(workdir) == [10, 20], second.stderr[-3000:]
  third = train(data_root, workdir, *SHARDABLE, *MESH8, env=eight)
  assert third.returncode == 0, third.stderr[-3000:]
  assert "at step 20" in third.stdout and "8 x cpu" in third.stdout
  assert_one_device_losses(24)  # 11-20 from the one-device leg, 21-24 from the last
  # Params alone, from the run that ended sharded 8 ways, onto 1 device and onto 12 (whose mesh,
  # tensor=-1 -> 3, cannot split d_model 64: data parallelism instead of a JAX error).
  reference = sample(tmp_path / "one")
  assert reference.returncode == 0, reference.stderr[-3000:]
  for env in ({}, {"JAX_NUM_CPU_DEVICES": "12"}):
    sampled = sample(workdir, env=env)
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert sampled.stdout == reference.stdout


# --- 6. Errors writing, changed data, SIGTERM inside libraries, two launches -----------------


_ERROR_WITH_AN_UNAWAITED_WRITE = """
from transformer import cli
from transformer.errors import UserError

async def write_fragment():  # what a failed Orbax save leaves behind
  pass

def main(argv):
  main.pending = write_fragment()  # collected only as Python exits
  raise UserError("could not write checkpoint step 30")

cli.run(main)
"""


def test_the_error_stays_the_last_line_when_an_async_write_was_never_awaited():
  proc = subprocess.run(
    [sys.executable, "-c", _ERROR_WITH_AN_UNAWAITED_WRITE], cwd=REPO, capture_output=True, text=True, timeout=120
  )
  assert error_line(proc) == "error: could not write checkpoint step 30", proc.stderr[-3000:]


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_an_unwritable_workdir_is_one_error(tmp_path, data_root):
  tmp_path.chmod(0o500)
  try:
    line = error_line(train(data_root, tmp_path / "w"))
  finally:
    tmp_path.chmod(0o700)
  assert "cannot create the lock in" in line and "Permission denied" in line


@pytest.mark.slow
def test_a_workdir_that_cannot_be_a_directory_is_one_error(tmp_path, data_root):
  (tmp_path / "file").write_text("")
  line = error_line(train(data_root, tmp_path / "file" / "w"))
  assert "cannot create the lock in" in line and "Not a directory" in line


@pytest.mark.slow
def test_changed_data_is_prepared_again_and_never_mixed_into_a_run(tmp_path):
  text = tmp_path / "mine.txt"
  text.write_text("the quick brown fox jumps over the lazy dog.\n" * 400)
  own = [
    *TINY,
    f"--config.data.input_files={text}",
    f"--config.data.root={tmp_path / 'data'}",
    "--config.data.piece_chars=1000",
    "--config.num_train_steps=10",
    "--config.eval_every_steps=10",
  ]
  assert run_module("launch.train", *own, f"--workdir={tmp_path / 'a'}").returncode == 0
  before = (tmp_path / "a" / "metrics.jsonl").read_text()
  text.write_text("the quick brown fox jumps over the lazy cat.\n" * 400)
  line = error_line(run_module("launch.train", *own, "--config.num_train_steps=20", f"--workdir={tmp_path / 'a'}"))
  assert "the training data changed since the run" in line and "mine.txt (sha256" in line, line
  assert (tmp_path / "a" / "metrics.jsonl").read_text() == before
  fresh = run_module("launch.train", *own, f"--workdir={tmp_path / 'b'}")
  assert fresh.returncode == 0, fresh.stderr[-3000:]
  manifest = json.loads((tmp_path / "data" / "mine-char" / "manifest.json").read_text())
  assert (
    manifest["request"]["files"][0]["sha256"]
    == json.loads((tmp_path / "b" / "data.json").read_text())["files"][0]["sha256"]
    != json.loads((tmp_path / "a" / "data.json").read_text())["files"][0]["sha256"]
  )


def _wait_for(predicate, proc, seconds=120):
  deadline = time.time() + seconds
  while time.time() < deadline and proc.poll() is None and not predicate():
    time.sleep(0.05)
  assert proc.poll() is None, proc.communicate()[1][-3000:]


def _swallowing(catch):
  """What a library does around its own work: the SIGTERM handler runs inside its `try`."""
  try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.01)
  except catch:
    pass


@pytest.mark.parametrize("catch", [Exception, BaseException])
def test_sigterm_abandons_an_evaluation_even_inside_a_library_that_catches_exceptions(catch):
  """jax's persistent compilation cache reads catch `Exception` and warn: a SIGTERM landing there
  once let the evaluation finish and be recorded. Even a bare `except:` must not do that."""
  from transformer.train import _Preemption

  preemption = _Preemption()
  try:
    with pytest.raises(_Preemption.Interrupted):
      with preemption.interruptible():
        _swallowing(catch)
        _swallowing(catch)
    assert preemption.requested
    with pytest.raises(_Preemption.Interrupted):  # a later evaluation does not even start
      with preemption.interruptible():
        pytest.fail("an evaluation started after SIGTERM")
  finally:
    preemption.restore()


@pytest.mark.slow
def test_a_second_launch_on_a_running_workdir_refuses_and_a_dead_holder_is_detected(tmp_path, data_root):
  forever = ["--config.num_train_steps=100000", "--config.checkpoint_every_steps=100000"]
  proc = subprocess.Popen(
    [sys.executable, "-m", "launch.train", *_args(data_root, tmp_path, *forever)],
    cwd=REPO,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  try:
    _wait_for(lambda: (tmp_path / "metrics.jsonl").exists(), proc)
    line = error_line(train(data_root, tmp_path, *forever))
    assert f"is in use: process {proc.pid} on" in line and "train.lock" in line, line
  finally:
    proc.kill()
    proc.wait()
  assert json.loads((tmp_path / "train.lock").read_text())["pid"] == proc.pid  # left behind by the kill
  after = train(data_root, tmp_path, "--config.num_train_steps=5")
  assert after.returncode == 0, after.stderr[-3000:]
  assert "which is gone; taking it over" in after.stderr and not (tmp_path / "train.lock").exists()


# --- 7, 8. Special tokens from the command line; your own translation pairs -----------------


@pytest.mark.slow
def test_special_tokens_in_a_prompt_are_refused_unless_allowed(straight):
  line = error_line(
    run_module("launch.sample", f"--workdir={straight}", "--prompt=ROMEO<|endoftext|>", "--max_new_tokens=5")
  )
  assert "prompt 1: text contains the special token '<|endoftext|>' at character 5" in line
  assert "--allow_special" in line
  allowed = run_module(
    "launch.sample", f"--workdir={straight}", "--prompt=ROMEO<|endoftext|>", "--max_new_tokens=5", "--allow_special"
  )
  assert allowed.returncode == 0, allowed.stderr[-3000:]


@pytest.mark.slow
def test_own_translation_pairs_refuse_a_data_sets_direction_before_preparing(tmp_path):
  pairs = tmp_path / "pairs.tsv"
  pairs.write_text("".join(f"das haus {i}\tthe house {i}\n" for i in range(300)))
  common = [
    "--config=experiments/translation.py:tiny",
    f"--config.data.input_files={pairs}",
    f"--config.data.root={tmp_path / 'data'}",
    "--config.data.tokenizer=char",
  ]
  line = error_line(
    run_module("launch.train", *common, "--config.data.direction=de-en", f"--workdir={tmp_path / 'bad'}")
  )
  assert "--config.data.direction: unknown direction 'de-en'" in line and "'source-target'" in line, line
  assert not (tmp_path / "data").exists()  # refused before the data was prepared
  # Without --config.data.direction the pairs train source-target: test_translation.py's 8-device run.
