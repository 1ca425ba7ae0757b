"""launch.sample as a real process: from a training workdir (latest/best) and from GPT-2
safetensors; prompts from flags, a file and stdin; streaming; bad input."""

import dataclasses
import re

import numpy as np
import pytest

from experiments import shakespeare
from transformer import evaluation, inference, tokenizers, train
from transformer.errors import DataError
from transformer.generation import sampling as sampler
from transformer.models.formats.gpt2 import export_hf_gpt2, import_hf_gpt2
from transformer.models.gpt import GPT, GPTConfig

from conftest import compiled_init, run_cases, run_module


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("run")
  config = shakespeare.get_config("tiny")
  config.data.root = str(tmp_path_factory.mktemp("data"))
  config.num_train_steps = 30
  config.eval_every_steps = 10
  config.checkpoint_every_steps = 10
  config.sample.max_new_tokens = 0
  train.train_and_evaluate(config, workdir)
  return workdir


def _sample(*args, stdin=None):
  return run_module("launch.sample", *args, stdin=stdin)


@pytest.mark.slow
def test_workdir_completions_match_the_library(workdir):
  proc = _sample(f"--workdir={workdir}", "--prompt=ROMEO:", "--prompt=", "--temperature=0", "--max_new_tokens=30")
  assert proc.returncode == 0, proc.stderr
  trained = inference.restore(workdir)
  assert trained.step == 30
  want = sampler.complete(
    trained.model,
    trained.params,
    trained.tokenizer,
    ["ROMEO:", ""],
    max_new_tokens=30,
    sampling=sampler.Sampling(temperature=0),
  )
  assert proc.stdout == f"ROMEO:{want[0]}\n{'-' * 40}\n{want[1]}\n"
  assert len(want[0]) > 5


@pytest.mark.slow
def test_best_and_numbered_steps(workdir):
  for step in ("best", "10"):
    proc = _sample(f"--workdir={workdir}", f"--step={step}", "--prompt=KING:", "--max_new_tokens=5")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("KING:")
  trained = inference.restore(workdir, "best")
  assert trained.step in (10, 20, 30)


@pytest.mark.slow
def test_prompts_file_stdin_and_streaming_agree(workdir, tmp_path):
  common = [f"--workdir={workdir}", "--temperature=0", "--max_new_tokens=25"]
  by_flag = _sample(*common, "--prompt=To be", "--prompt=Alas,\npoor")
  assert by_flag.returncode == 0, by_flag.stderr
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("To be\nAlas,\\npoor\n")  # "\n" written as two characters: a newline in a prompt
  by_file = _sample(*common, f"--prompts_file={prompts}")
  by_stdin = _sample(*common, "--prompts_file=-", stdin=prompts.read_text())
  assert by_file.stdout == by_flag.stdout == by_stdin.stdout
  streamed = _sample(*common, "--prompt=To be", "--prompt=Alas,\npoor", "--stream")
  assert streamed.returncode == 0, streamed.stderr
  assert streamed.stdout == by_flag.stdout.replace("-" * 40 + "\n", "")


@pytest.mark.slow
def test_sampling_flags_and_seeds(workdir):
  common = [f"--workdir={workdir}", "--prompt=ROMEO:", "--max_new_tokens=30", "--num_samples=3"]
  a = _sample(*common, "--seed=1", "--top_p=0.9", "--top_k=20").stdout
  b = _sample(*common, "--seed=1", "--top_p=0.9", "--top_k=20").stdout
  c = _sample(*common, "--seed=2", "--top_p=0.9", "--top_k=20").stdout
  assert a == b != c
  assert len(set(a.split("-" * 40))) == 3  # three different samples


@pytest.mark.slow
def test_from_gpt2_safetensors(tmp_path):
  """A GPT-2-shaped model with the real vocabulary, exported to HF safetensors, sampled via --hf."""
  cfg = GPTConfig().replace(vocab_size=50257, max_len=64, num_layers=2, num_heads=2, d_model=32)
  params = compiled_init(GPT(cfg), np.zeros((1, 8), np.int32))
  export_hf_gpt2(cfg, params, tmp_path)
  proc = _sample(f"--hf={tmp_path}", "--prompt=Every effort moves you", "--temperature=0", "--max_new_tokens=8")
  assert proc.returncode == 0, proc.stderr
  cfg2, params2 = import_hf_gpt2(tmp_path)
  [want] = sampler.complete(
    GPT(cfg2),
    params2,
    tokenizers.get_tokenizer("gpt2"),
    ["Every effort moves you"],
    max_new_tokens=8,
    sampling=sampler.Sampling(temperature=0),
  )
  assert proc.stdout == f"Every effort moves you{want}\n"


@pytest.mark.parametrize(
  "args,message",
  [
    (
      ["--workdir=/nonexistent/run"],
      "/nonexistent/run is not a training workdir: looked for "
      "/nonexistent/run/config.json, /nonexistent/run/tokenizer, /nonexistent/run/checkpoints",
    ),
    ([], "give exactly one of --workdir"),
    (["--hf=/nonexistent/gpt2"], "no GPT-2 safetensors at /nonexistent/gpt2"),
    (["--step=7"], "no checkpoint for step 7 in .*checkpoints; it has steps \\[10, 20, 30\\]"),
    (["--step=last"], "step must be 'latest', 'best' or a step number, got 'last'"),
    (
      ["--max_new_tokens=64"],
      "prompt 0 \\(1 token\\) \\+ max_new_tokens=64 is longer than the model's context of "
      "64 tokens; .*lower max_new_tokens to 63.*--sliding_window",
    ),
    (["--prompts_file=/nonexistent/prompts.txt"], "--prompts_file=/nonexistent/prompts.txt: no such file"),
    (["--top_p=1.5"], "top_p must be in \\(0, 1\\]"),
  ],
)
@pytest.mark.slow
def test_bad_input_is_one_clear_error(workdir, args, message):
  if not any(a.startswith(("--workdir", "--hf")) for a in args) and args:
    args = [f"--workdir={workdir}", *args]
  proc = _sample(*args)
  assert proc.returncode == 1
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and re.search(message, errors[0]), proc.stderr
  assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_sliding_window_past_the_context(workdir):
  proc = _sample(
    f"--workdir={workdir}", "--prompt=ROMEO:", "--max_new_tokens=80", "--sliding_window", "--temperature=0"
  )
  assert proc.returncode == 0, proc.stderr
  trained = inference.restore(workdir)
  [want] = sampler.complete(
    trained.model,
    trained.params,
    trained.tokenizer,
    ["ROMEO:"],
    max_new_tokens=80,
    sampling=sampler.Sampling(temperature=0),
    sliding_window=True,
  )
  assert proc.stdout == f"ROMEO:{want}\n"
  assert len(trained.tokenizer.encode(want)) > 64 - 6  # char-level: past the 64-token context


def _evaluated(result: dict) -> dict:
  """launch.evaluate's `name value` lines (comments left out) as {name: value}, from `run_cases`."""
  assert result["status"] == 0, result["stderr"][-3000:]
  return dict(line.rsplit(None, 1) for line in result["stdout"].splitlines() if not line.startswith("#"))


@pytest.mark.slow
def test_evaluate_scores_a_file_a_split_and_gpt2_weights(workdir, tmp_path):
  """launch.evaluate's numbers are transformer.evaluation's on the same text (its bits per byte are
  computed by hand in test_evaluation.py), for a workdir on a file and on its validation split, and
  for GPT-2 safetensors; a character the model lacks is folded, and the run says so; bad window
  sizes are one error each."""
  text = "ROMEO: But soft, what light through yonder window breaks?\nJULIET: Ay me, café!\n" * 3
  (tmp_path / "text.txt").write_text(text)
  cfg = GPTConfig().replace(vocab_size=50257, max_len=64, num_layers=2, num_heads=2, d_model=32)
  params = compiled_init(GPT(cfg), np.zeros((1, 8), np.int32), seed=1)
  export_hf_gpt2(cfg, params, tmp_path / "gpt2")
  runs = [
    [f"--workdir={workdir}", f"--input_file={tmp_path / 'text.txt'}", "--stride=16"],
    [f"--workdir={workdir}", "--split=validation"],
    [f"--hf={tmp_path / 'gpt2'}", f"--input_file={tmp_path / 'text.txt'}"],
    [f"--workdir={workdir}", "--split=validation", "--context=-3"],
    [f"--workdir={workdir}", "--split=validation", "--context=65"],
    [f"--workdir={workdir}", "--split=validation", "--stride=99"],
  ]
  by_file, by_split, by_hf, *bad = run_cases("launch.evaluate", [{"args": a} for a in runs], tmp_path)

  assert "warning: 3 character(s) of" in by_file["stderr"]  # the é of café, not in Shakespeare's characters
  for result in (by_file, by_hf):  # the first line of a launch: the forms the model runs
    assert "\nkernels: cpu (auto on cpu: " in "\n" + result["stderr"], result["stderr"][:300]
  trained = inference.restore(workdir)
  want = evaluation.score_text(
    trained.model, trained.params, trained.tokenizer, text.replace("é", "e"), context=64, stride=16
  )
  got = _evaluated(by_file)
  assert got["tokens"] == f"{want.tokens:,}" and float(got["bits per byte"]) == pytest.approx(
    want.bits_per_byte, abs=1e-4
  )
  got = _evaluated(by_split)
  validation = inference.split_task(trained, workdir).data.tokens("validation")
  assert got["tokens"] == f"{len(validation):,}" and 2.0 < float(got["bits per byte"]) < 8.0
  cfg, params = import_hf_gpt2(tmp_path / "gpt2")
  want = evaluation.score_text(GPT(cfg), params, tokenizers.get_tokenizer("gpt2"), text, context=64)
  assert float(_evaluated(by_hf)["bits per byte"]) == pytest.approx(want.bits_per_byte, abs=1e-4)
  messages = [
    "--context must be positive (0: the run's seq_len), got -3",
    "--context=65 is longer than the model reads (64 tokens)",
    "stride must be in 1..context=64, got 99",
  ]
  for result, message in zip(bad, messages):
    errors = [line for line in result["stderr"].splitlines() if line.startswith("error: ")]
    assert result["status"] == 1 and len(errors) == 1 and message in errors[0], result["stderr"][-2000:]


@pytest.mark.slow
def test_a_split_in_another_tokenizers_ids_is_refused(workdir):
  """Scoring a split reads the run's data as prepared now: ids of a tokenizer other than the run's
  (here the run's own, one character short) are one error naming both and the fix."""
  trained = inference.restore(workdir)
  assert inference.split_task(trained, workdir).data.tokens("validation").size > 0
  other = tokenizers.CharTokenizer(trained.tokenizer.chars[:-1])
  with pytest.raises(DataError, match=r"holds ids of another tokenizer .* than the run in .* reads .*launch.prepare"):
    inference.split_task(dataclasses.replace(trained, tokenizer=other), workdir)
