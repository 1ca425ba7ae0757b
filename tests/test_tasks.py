"""The task interface and registry (transformer.tasks): a task defined here, outside the package (a
copy task on synthetic digits), is registered with one line and trains, evaluates, checkpoints,
resumes and restores through the same `train_and_evaluate` and `inference.restore` as the built-in
tasks, without a change to either."""

import dataclasses
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments import base
from transformer import config, inference, metrics, tasks, tokenizers, train
from transformer.errors import ConfigError
from transformer.generation import sampling
from transformer.models.gpt import GPT

from conftest import run_module

DIGITS = "0123456789"


@dataclasses.dataclass(frozen=True)
class CopyConfig:
  length: int = 5  # digits to copy
  batch_size: int = 32

  def check(self, run, data_parallel) -> None:
    config.check_positive(self, ("length", "batch_size"))
    if 2 * self.length + 2 > run.model.max_len:
      raise ConfigError(f"--config.length={self.length} does not fit --config.model.max_len")


class Copy(tasks.Task):
  """ "31415|31415": a GPT learns to repeat the digits before the bar. Only the copy is scored."""

  name = "copy"
  Config = CopyConfig
  families = ("gpt",)
  data_kind = "synthetic"

  @classmethod
  def load_data(cls, run):  # no files: the data is made on the fly, the tokenizer is fixed
    return types.SimpleNamespace(tokenizer=tokenizers.CharTokenizer.from_corpus(DIGITS + "|"))

  def batch(self, index: int) -> np.ndarray:
    """(batch_size, 2 * length + 2): digits, bar, the same digits, end-of-text."""
    c, tok = self.config, self.tokenizer
    digits = np.random.default_rng([7, index]).integers(0, 10, (c.batch_size, c.length))
    ids = np.array(tok.encode(DIGITS))[digits]
    bar = np.full((c.batch_size, 1), tok.encode("|")[0])
    eot = np.full((c.batch_size, 1), tok.eot_id)
    return np.concatenate([ids, bar, ids, eot], axis=1).astype(np.int32)

  def build_model(self, model_config):
    return GPT(model_config)

  def init_inputs(self):
    return (jnp.zeros((1, 8), jnp.int32),)

  def loss(self, params, batch_BxL, rng, train: bool):
    logits_BxTxV = self.model.apply(
      {"params": params}, batch_BxL[:, :-1], deterministic=not train, rngs={"dropout": rng}
    )
    nll_BxT = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, batch_BxL[:, 1:])
    copied_T = jnp.arange(nll_BxT.shape[1]) >= self.config.length  # the copy and its end, not the random digits
    return (nll_BxT * copied_T).sum(), copied_T.sum() * jnp.float32(nll_BxT.shape[0])

  def train_batches(self):
    return _Batches(self.batch)

  def eval_batches(self):
    return [self.batch(10**9)]  # never a training batch

  def count_tokens(self, batch) -> int:
    return batch.size

  def flops_per_token(self, num_params: int) -> float:
    return 6 * num_params


class _Batches:
  """Batch i of a seeded stream; the position is the index."""

  def __init__(self, make):
    self.make, self.index = make, 0

  def __next__(self):
    self.index += 1
    return self.make(self.index - 1)

  def get_state(self) -> dict:
    return {"index": self.index}

  def set_state(self, state: dict) -> None:
    self.index = state["index"]


@pytest.fixture(scope="module", autouse=True)
def registered():
  tasks.register(Copy)  # the one line a new task needs
  yield
  tasks.TASKS.pop("copy")


def _copy_config(steps: int):
  c = tasks.defaults("copy")
  c.model = base.model_fields("cpu-tiny", max_len=16, d_model=64, num_heads=4)
  c.num_train_steps = steps
  c.eval_every_steps = c.checkpoint_every_steps = steps // 2
  c.log_every_steps = 10
  c.optimizer.lr = 3e-3
  c.optimizer.schedule = "constant"  # the same learning rates whether a run stops at 100 or 200
  c.optimizer.warmup_steps = 20
  c.optimizer.weight_decay = 0.0
  return c


@pytest.mark.slow
def test_a_registered_task_trains_resumes_and_restores_through_the_shared_loop(tmp_path):
  result = train.train_and_evaluate(_copy_config(200), tmp_path / "w")
  records = metrics.read_jsonl(tmp_path / "w" / "metrics.jsonl")
  val = metrics.last_per_step(records, "val_loss")
  assert val[100] < np.log(10) and val[200] < 0.3, val  # chance is ln 10 per copied digit
  assert result["val_loss"] == val[200] and (tmp_path / "w" / "checkpoints" / "200").exists()
  # Stop at step 100, then resume to 200: the same losses as the uninterrupted run.
  train.train_and_evaluate(_copy_config(100), tmp_path / "r")
  train.train_and_evaluate(_copy_config(200), tmp_path / "r")
  resumed = metrics.last_per_step(metrics.read_jsonl(tmp_path / "r" / "metrics.jsonl"), "loss")
  straight = metrics.last_per_step(records, "loss")
  np.testing.assert_allclose([resumed[s] for s in (150, 200)], [straight[s] for s in (150, 200)], rtol=1e-5)
  # Restored for inference like any task; its model copies digits it has never seen.
  trained = inference.restore(tmp_path / "w", task="copy")
  assert isinstance(trained.task, Copy) and trained.step == 200
  tok = trained.tokenizer
  prompts = [tok.encode("31415|"), tok.encode("27182|")]
  out = sampling.generate(
    trained.model,
    trained.params,
    prompts,
    max_new_tokens=6,
    sampling=sampling.Sampling(temperature=0),
    stop_id=tok.eot_id,
  )
  assert [tok.decode(o) for o in out] == ["31415", "27182"]
  with pytest.raises(inference.WrongTaskError, match=r"holds a 'copy' model \(config.task\), not a 'lm' one"):
    inference.restore(tmp_path / "w", task="lm")


def test_the_registry_refuses_what_is_not_a_task():
  with pytest.raises(TypeError, match="not a subclass of transformer.tasks.Task"):
    tasks.register(CopyConfig)
  with pytest.raises(
    ConfigError,
    match="--config.task='nope' is unknown; choose one of lm, translation, classification, tagging, sae, modular, copy",
  ):
    tasks.get("nope")
  assert set(tasks.TASKS) >= {"lm", "translation", "copy"}


class EarlyStoppedCopy(Copy):
  """The copy task scored at its best checkpoint by a metric the first evaluation wins (the highest
  validation loss, as a stand-in for a dev metric that peaked early)."""

  name = "early_stopped_copy"
  best_metric = ("val_loss", "max")
  finish_with_best = True

  def finish(self, params, workdir, mean_of_last):
    return {"params_sum": float(sum(jnp.sum(x) for x in jax.tree.leaves(params)))}


@pytest.mark.slow
def test_a_task_that_finishes_with_its_best_checkpoint_scores_and_serves_it(tmp_path):
  """finish_with_best (classification and tagging): the end of the run scores the best checkpoint's
  params, not the last step's, says which step it was, and programs serve it by default."""
  tasks.register(EarlyStoppedCopy)
  try:
    c = _copy_config(60)
    c.task = "early_stopped_copy"
    result = train.train_and_evaluate(c, tmp_path / "w")
    assert result["best_step"] == 30
    best = inference.restore(tmp_path / "w", 30)
    assert result["params_sum"] == pytest.approx(float(sum(jnp.sum(x) for x in jax.tree.leaves(best.params))))
    last = inference.restore(tmp_path / "w", 60)
    assert result["params_sum"] != pytest.approx(float(sum(jnp.sum(x) for x in jax.tree.leaves(last.params))))
    assert inference.default_step(tmp_path / "w") == "best" and inference.restore(tmp_path / "w", "best").step == 30
  finally:
    tasks.TASKS.pop("early_stopped_copy")


# A user's own module, outside the package: it registers an attention mechanism (the mean of the
# dot-product scores subtracted, a change that keeps the softmax's result and so learns like dot products).
_USER_MODULE = """
from transformer import layers

def centred_scores(attn, x_BxTxD, q_BxTxHxK, k_BxSxHxK, positions):
  scores_BxHxTxS = layers.dot_product_scores(attn, x_BxTxD, q_BxTxHxK, k_BxSxHxK, positions)
  return scores_BxHxTxS - scores_BxHxTxS.mean(axis=-1, keepdims=True)

layers.register_mechanism("centred", layers.Mechanism(centred_scores))
"""


@pytest.mark.slow
def test_a_mechanism_registered_in_a_users_module_crosses_the_process_boundary(tmp_path):
  """launch.train with --config.imports=the user's module, then launch.sample, launch.probe and
  launch.evaluate on that run, each a new process that never imported the module itself: each reads
  config.imports from the run and imports it. Without the module on the path, one error naming it."""
  (tmp_path / "user_code").mkdir()
  (tmp_path / "user_code" / "my_mechanisms.py").write_text(_USER_MODULE)
  env = {"PYTHONPATH": str(tmp_path / "user_code")}
  workdir = tmp_path / "w"
  trained = run_module(
    "launch.train",
    "--config=experiments/shakespeare.py:tiny",
    f"--config.data.root={tmp_path / 'data'}",
    "--config.imports=my_mechanisms",
    "--config.model.block.attention_mechanism=centred",
    "--config.num_train_steps=20",
    f"--workdir={workdir}",
    env=env,
  )
  assert trained.returncode == 0, trained.stderr[-3000:]
  assert json.loads((workdir / "config.json").read_text())["imports"] == ["my_mechanisms"]
  sample = run_module("launch.sample", f"--workdir={workdir}", "--prompt=ROMEO:", "--max_new_tokens=8", env=env)
  assert sample.returncode == 0 and sample.stdout.startswith("ROMEO:"), sample.stderr[-3000:]
  probe = run_module("launch.probe", f"--workdir={workdir}", "--text=ROMEO: O", f"--out={tmp_path / 'p'}", env=env)
  assert probe.returncode == 0 and (tmp_path / "p" / "attention.png").exists(), probe.stderr[-3000:]
  evaluate = run_module("launch.evaluate", f"--workdir={workdir}", "--split=validation", env=env)
  assert evaluate.returncode == 0 and "bits per char" in evaluate.stdout, evaluate.stderr[-3000:]
  lost = run_module("launch.sample", f"--workdir={workdir}", "--prompt=ROMEO:", "--max_new_tokens=8")
  assert lost.returncode == 1 and lost.stderr.strip().splitlines()[-1].startswith(
    "error: --config.imports: module 'my_mechanisms' cannot be imported"
  ), lost.stderr[-3000:]
