"""config.task="modular" (grokking's setting) and transformer.interp.fourier (its analysis): the split, the loss
at the answer, the model without norms, the Fourier projections on logits whose frequencies are known,
and bad input; in the slow tier (CI runs it all the same), a short run that memorises and resumes bit
for bit."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments import grokking
from transformer import inference, sharding, tasks
from transformer.errors import ConfigError
from transformer.interp import fourier
from transformer.models.gpt import GPT, GPTConfig
from transformer.tasks.modular import all_pairs, split
from transformer.train import train_and_evaluate

from conftest import compiled_init, run_module

P = 23


def test_the_split_is_fixed_by_its_seed_and_disjoint():
  tokens_Nx3, answers_N = all_pairs(P, "add")
  assert tokens_Nx3.shape == (P * P, 3) and (tokens_Nx3[:, 2] == P).all()
  np.testing.assert_array_equal(answers_N, (tokens_Nx3[:, 0] + tokens_Nx3[:, 1]) % P)
  train = split(P * P, 0.3, seed=0)
  np.testing.assert_array_equal(train, split(P * P, 0.3, seed=0))
  assert len(train) == round(0.3 * P * P) and len(set(train.tolist())) == len(train)
  assert not np.array_equal(train, split(P * P, 0.3, seed=1))
  test = np.setdiff1d(np.arange(P * P), train)
  assert len(np.intersect1d(train, test)) == 0 and len(train) + len(test) == P * P
  tokens, answers = all_pairs(7, "divide")  # b ≠ 0; a = c * b
  assert (tokens[:, 1] > 0).all() and ((answers * tokens[:, 1]) % 7 == tokens[:, 0]).all()


def _task(**changes):
  c = grokking.get_config("tiny")
  for key, value in changes.items():
    c[key] = value
  run = tasks.resolve(c, num_devices=jax.device_count())
  task_cls = tasks.get("modular")
  data = task_cls.load_data(run)
  return task_cls(run, data.tokenizer, sharding.make_mesh(run.mesh.shape), data)


def test_the_loss_reads_only_the_answer_position_and_the_numbers_logits():
  task = _task()
  params = compiled_init(task.model, *task.init_inputs())
  batch = next(task.train_batches())

  # The task's loss and the numbers' cross-entropy read at a position of the logits, one program (not op by op).
  @jax.jit
  def loss_and_read_at(p):
    logits_NxTxV = task.model.apply({"params": p}, batch["tokens"])
    read_at = lambda t: optax.softmax_cross_entropy_with_integer_labels(logits_NxTxV[:, t, :P], batch["answers"][:, 0])
    return task.loss(p, batch, jax.random.key(0), False), read_at(2).sum(), read_at(1).sum()

  (loss_sum, count), expected, wrong = loss_and_read_at(params)
  np.testing.assert_allclose(loss_sum, expected, rtol=1e-6)
  assert count == len(batch["answers"])
  # The tokens' logits at "a" and "b" do not enter: a loss of position 1 differs.
  assert abs(float(wrong - loss_sum)) > 1e-3
  # Another operation is scored and described too (without addition's restricted and excluded losses).
  other = _task(operation="x2_xy_y2")
  result = other.evaluate(params, None, other.eval_batches())
  assert "restricted_loss" not in result and result["val_loss"] == result["test_loss"]
  assert "key frequencies" in other.describe(result)


def test_norm_none_has_no_norm_parameters_and_computes_no_normalisation():
  cfg = GPTConfig(vocab_size=P + 3, max_len=3, num_layers=1).replace(norm="none", d_model=32, num_heads=4).check()
  model = GPT(cfg)
  tokens = jnp.zeros((2, 3), jnp.int32)
  params = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]  # shapes are all a trace needs
  names = "/".join(jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0])
  assert "ln_" not in names and "scale" not in names, names
  program = str(jax.make_jaxpr(lambda p: model.apply({"params": p}, tokens))(params))
  assert "rsqrt" not in program and "sqrt" not in program.replace("rsqrt", "")
  layer_norm = GPT(cfg.replace(norm="layer_norm"))
  ln_params = jax.eval_shape(layer_norm.init, jax.random.key(0), tokens)["params"]
  assert "rsqrt" in str(jax.make_jaxpr(lambda p: layer_norm.apply({"params": p}, tokens))(ln_params))


def test_the_fourier_basis_is_orthonormal_and_the_key_projection_recovers_known_frequencies():
  basis, names = fourier.fourier_basis(P)
  np.testing.assert_allclose(basis @ basis.T, np.eye(P), atol=1e-12)
  assert names[:3] == ["const", "cos 1", "sin 1"] and len(names) == P
  # Logits built from frequencies 3 and 7: logit(a, b, c) = 2 cos(w3(a+b-c)) + 0.5 cos(w7(a+b-c)).
  a, b, c = np.meshgrid(np.arange(P), np.arange(P), np.arange(P), indexing="ij")
  w = lambda k: 2 * np.pi * k / P
  logits_NxC = (2 * np.cos(w(3) * (a + b - c)) + 0.5 * np.cos(w(7) * (a + b - c))).reshape(P * P, P)
  np.testing.assert_allclose(fourier.restricted(logits_NxC, P, [3, 7]), logits_NxC, atol=1e-10)
  np.testing.assert_allclose(fourier.excluded(logits_NxC, P, [3, 7]), 0, atol=1e-10)
  np.testing.assert_allclose(
    fourier.ablate(logits_NxC, P, [7]), 2 * np.cos(w(3) * (a + b - c)).reshape(P * P, P), atol=1e-10
  )
  explained, alpha = fourier.interference_fit(logits_NxC, P, [3, 7])
  assert explained > 1 - 1e-10
  np.testing.assert_allclose(alpha, [2, 0.5], atol=1e-10)
  # An embedding on frequencies 3 and 7 only: those are its key frequencies, its Gini is high.
  x = np.arange(P)[:, None]
  W_pxD = np.concatenate([np.cos(w(3) * x), np.sin(w(7) * x), 0.1 * np.cos(w(7) * x)], 1)
  norms = fourier.frequency_norms(W_pxD)
  assert fourier.key_frequencies(norms, 2) == [3, 7]
  assert fourier.gini(norms) > 0.8 and fourier.gini(np.ones(11)) == 0
  # A neuron cos(w5 a) cos(w5 b) is all frequency 5.
  best, explained = fourier.neuron_frequencies((np.cos(w(5) * a[..., 0]) * np.cos(w(5) * b[..., 0])).reshape(-1, 1), P)
  assert best.tolist() == [5] and explained[0] == pytest.approx(1.0)


def test_restricted_and_excluded_sum_to_the_identity():
  logits_NxC = np.random.default_rng(0).normal(size=(P * P, P))
  total = fourier.restricted(logits_NxC, P, [1, 4, 9]) + fourier.excluded(logits_NxC, P, [1, 4, 9])
  np.testing.assert_allclose(total, logits_NxC, atol=1e-12)
  assert np.abs(fourier.excluded(logits_NxC, P, [1, 4, 9])).sum() > 0


@pytest.mark.slow
def test_a_short_run_memorises_logs_the_measures_and_resumes_bit_for_bit(tmp_path):
  """The tiny preset (p 23, 80% of pairs) to 100% training accuracy; 200 steps straight against 100
  then a relaunch: the same params, bit for bit (20 steps a compiled call)."""
  c = grokking.get_config("tiny")
  straight = tmp_path / "straight"
  result = train_and_evaluate(c, straight)
  assert result["train_accuracy"] == 1.0, result
  records = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
  measured = [r for r in records if "gini" in r]
  assert [r["step"] for r in measured] == [100, 200]
  for r in measured:
    assert len(r["frequency_norms"]) == (P - 1) // 2 and len(r["key_frequencies"]) == 3
    assert r["restricted_loss"] > 0 and r["excluded_loss"] > 0 and r["weight_norm"] > 0
  assert (
    (straight / "grokking.png").exists()
    and (straight / "mechanism.png").exists()
    and (straight / "modular_split.npz").exists()
  )
  mechanism = json.loads((straight / "mechanism.json").read_text())
  assert len(mechanism["neurons"]["best_frequency"]) == 256 and "neurons_restricted_loss" in mechanism
  assert mechanism["phases"]["train_accuracy_100"]["step"] == 100
  resumed = tmp_path / "resumed"
  shutil.copytree(straight, resumed)
  shutil.rmtree(resumed / "checkpoints" / "200")
  train_and_evaluate(c, resumed)
  # A relaunch whose steps_per_call does not divide the step it resumes at is refused, before it writes.
  c.num_train_steps, c.steps_per_call = 210, 30
  c.log_every_steps = c.eval_every_steps = c.checkpoint_every_steps = 30
  with pytest.raises(ConfigError, match="resumes at step 200, not a multiple of --config.steps_per_call=30"):
    train_and_evaluate(c, straight)
  jax.tree.map(
    np.testing.assert_array_equal,
    inference.restore(resumed, step=200).params,
    inference.restore(straight, step=200).params,
  )


@pytest.mark.parametrize(
  "changes,message",
  [
    ({"operation": "divide", "p": 100}, "--config.operation='divide' needs a prime modulus"),
    ({"train_fraction": 1.0}, r"--config.train_fraction must be in \(0, 1\), got 1.0"),
    ({"operation": "power"}, "--config.operation='power' is unknown; choose one of add, subtract"),
    ({"steps_per_call": 30}, "--config.num_train_steps=200 is not a multiple of --config.steps_per_call=30"),
  ],
)
def test_bad_input_is_one_clear_error(changes, message):
  c = grokking.get_config("tiny")
  for key, value in changes.items():
    c[key] = value
  with pytest.raises(ConfigError, match=message):
    tasks.resolve(c)


def test_a_launch_with_bad_input_prints_one_error_line_and_writes_nothing(tmp_path):
  workdir = tmp_path / "w"
  done = run_module(
    "launch.train",
    "--config=experiments/grokking.py:tiny",
    f"--workdir={workdir}",
    "--config.operation=divide",
    "--config.p=100",
  )
  errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
  assert done.returncode != 0 and len(errors) == 1, done.stderr[-2000:]
  assert "needs a prime modulus" in errors[0] and not workdir.exists()


@pytest.mark.slow
def test_steps_in_one_compiled_call_train_as_steps_one_at_a_time(tmp_path):
  """config.steps_per_call runs its steps as a lax.scan: the same updates as a Python loop of them."""
  params = {}
  for n in (1, 20):
    c = grokking.get_config("tiny")
    c.num_train_steps = c.log_every_steps = c.eval_every_steps = c.checkpoint_every_steps = 40
    c.steps_per_call = n
    train_and_evaluate(c, tmp_path / str(n))
    params[n] = inference.restore(tmp_path / str(n)).params
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), params[1], params[20])
