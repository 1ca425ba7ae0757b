"""config.task="sae" on the one loop: an SAE on a trained GPT's point (scores, the spliced losses), on
an array a user brings, resumed bit for bit, and every bad input one error with nothing written. The
trainings of SAEs on a GPT (scores and resume, feature pages, eight devices, a GPT-2 directory) and the
loop's JumpReLU and BatchTopK thresholds (their mechanisms are test_sae.py's, in the fast tier) are in
the slow tier, which CI runs all the same."""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from experiments import sae as sae_experiment
from experiments import shakespeare
from transformer import dictionaries, inference, metrics, tasks
from transformer.errors import ConfigError, InputWarning, UserError
from transformer.interp import features, interventions
from transformer.interp.interventions import Patch
from transformer.models.formats.gpt2 import export_hf_gpt2
from transformer.models.gpt import GPT, GPTConfig
from transformer.models.sae import SAE, SAEConfig
from transformer.tasks.sae import SAETaskConfig, spliced_losses
from transformer.train import train_and_evaluate

from conftest import REPO, compiled_init, run_module


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
  """A tiny GPT trained 10 steps on Shakespeare's characters: the model whose activations SAEs learn."""
  workdir = tmp_path_factory.mktemp("lm")
  c = shakespeare.get_config("tiny")
  c.data.root = str(workdir / "data")
  c.num_train_steps = c.eval_every_steps = c.checkpoint_every_steps = 10
  c.sample.max_new_tokens = 0
  train_and_evaluate(c, workdir)
  return workdir


def _sae_config(**changes):
  c = tasks.defaults("sae")
  c.point, c.layer, c.seq_len = "resid_pre", 1, 32
  c.batch_size, c.buffer_sequences, c.lm_batch_size, c.eval_sequences = 128, 16, 8, 4
  c.model.d_sae, c.model.k = 256, 8
  c.num_train_steps, c.eval_every_steps, c.checkpoint_every_steps, c.log_every_steps = 12, 6, 6, 6
  c.keep_checkpoints = 4
  c.optimizer.lr, c.optimizer.warmup_steps, c.optimizer.weight_decay = 1e-3, 2, 0.0
  c.dead_tokens = 1000
  for key, value in changes.items():
    *parents, name = key.split(".")
    section = c
    for parent in parents:
      section = section[parent]
    section[name] = value
  return c


@pytest.fixture(scope="module")
def sae_run(lm_run, tmp_path_factory):
  """A TopK SAE trained 12 steps on the tiny GPT's resid_pre of block 1: (its workdir, the result)."""
  workdir = tmp_path_factory.mktemp("sae") / "straight"
  return workdir, train_and_evaluate(_sae_config(run=str(lm_run)), workdir)


@pytest.mark.slow
def test_an_sae_on_a_gpts_point_is_scored_as_saelens_scores_and_resumes_bit_for_bit(lm_run, sae_run, tmp_path):
  """12 steps straight, against 6 then a relaunch from step 6 (the activation store mid-refill: 16
  windows x 32 tokens = 4 batches a refill): the same params, bit for bit."""
  straight, result = sae_run
  for key in ("l0", "mse", "explained_variance", "fvu", "dead_latents", "dense_latents", "ce_loss_score"):
    assert np.isfinite(result[key]), (key, result)
  assert result["l0"] <= 8 and result["ce_loss_clean"] < result["ce_loss_spliced"] < result["ce_loss_zero"], result
  records = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if "ce_loss_score" in r] == [6, 12]

  trained = inference.restore(straight, step=12)
  assert trained.run.task == "sae" and trained.model.config.d_in == 64
  resumed = tmp_path / "resumed"
  shutil.copytree(straight, resumed)
  shutil.rmtree(resumed / "checkpoints" / "12")
  train_and_evaluate(_sae_config(run=str(lm_run)), resumed)
  again = inference.restore(resumed, step=12)
  jax.tree.map(np.testing.assert_array_equal, again.params, trained.params)


@pytest.mark.slow
def test_a_features_page_shows_top_contexts_histograms_logits_and_a_texts_latents(sae_run, tmp_path):
  trained, source = dictionaries.load_sae(sae_run[0])
  report = features.feature_pages(
    trained.model, trained.params, source, trained.tokenizer, count=3, text="ROMEO: O Juliet", out=tmp_path
  )
  assert len(report.latents) == 3
  z = features.latents_of(trained.model, trained.params, source, source.eval_tokens_BxT())
  for latent in report.latents:
    assert latent.top_contexts and latent.density == pytest.approx(float((z[..., latent.index] > 0).mean()))
    peaks = latent.top_activations
    assert peaks == sorted(peaks, reverse=True) and peaks[0] == pytest.approx(float(z[..., latent.index].max()))
    assert all(max(a for _, a in context) >= peak for context, peak in zip(latent.top_contexts, peaks))
    assert len(latent.promoted) == 8 and latent.promoted[0][1] >= latent.suppressed[0][1]
  assert [token for token, _ in report.text_latents] == list("ROMEO: O Juliet")
  page = report.path.read_text()
  assert (
    page.count("data:image/png;base64,") == 3 and "background:rgba(192,57,43," in page and "Juliet" not in page[:200]
  )
  assert (tmp_path / f"latent_{report.latents[0].index}.png").stat().st_size > 1000
  with pytest.raises(UserError, match="latent 9999 is not one of this SAE's 256"):
    features.feature_pages(trained.model, trained.params, source, trained.tokenizer, latents=[9999])


@pytest.mark.slow
def test_the_tiny_synthetic_preset_reports_its_recovery_of_the_true_features(tmp_path):
  result = train_and_evaluate(sae_experiment.get_config("tiny"), tmp_path / "w")
  assert 0 < result["mcc"] <= result["mean_max_cosine"] <= 1 and result["l0"] <= 4, result


@pytest.mark.slow
def test_the_loop_learns_jumprelus_threshold_and_sets_batchtopks(tmp_path):
  """JumpReLU's θ is a parameter the optimizer moves; BatchTopK's is a statistic the step sets."""
  thresholds = {}
  for activation in ("jumprelu", "batchtopk"):
    c = sae_experiment.get_config("tiny")
    c.model.activation, c.model.l0_coefficient, c.num_train_steps = activation, 1.0, 10
    train_and_evaluate(c, tmp_path / activation)
    thresholds[activation] = np.asarray(inference.restore(tmp_path / activation).params["threshold"])
  assert np.all(thresholds["jumprelu"] != SAEConfig.initial_threshold), thresholds["jumprelu"][:8]
  assert len(set(thresholds["batchtopk"].tolist())) == 1 and thresholds["batchtopk"][0] > 0


def test_a_perfect_reconstruction_spliced_in_leaves_the_loss_and_zeroing_is_the_point_zeroed(lm_run):
  """An SAE whose decoder inverts its encoder (ReLU latents x⁺ and x⁻, decoded as x⁺ - x⁻) changes
  nothing; zeroing mlp_out of block 1 is the model with that MLP's output projection zeroed."""
  data = tasks.load_data(tasks.resolve(_sae_config(run=str(lm_run), point="mlp_out")), inference.load)
  source = data.source
  D = source.d_in
  sae = SAE(SAEConfig(d_in=D, d_sae=2 * D, activation="relu").check())
  params = compiled_init(sae, np.zeros((2, D), np.float32))
  identity = np.eye(D, dtype=np.float32)
  params = {
    **params,
    "W_enc": np.concatenate([identity, -identity], 1),
    "W_dec": np.concatenate([identity, -identity], 0),
    "b_enc": np.zeros(2 * D, np.float32),
    "b_dec": np.zeros(D, np.float32),
  }
  losses = spliced_losses(source, sae, params)
  assert abs(losses["ce_loss_spliced"] - losses["ce_loss_clean"]) < 1e-5, losses
  assert losses["ce_loss_zero"] > losses["ce_loss_clean"] + 0.01, losses

  mlp = source.params["h"]["layer_1"]["mlp"]
  zeroed_proj = jax.tree.map(np.zeros_like, mlp["proj"])
  without_mlp = {
    **source.params,
    "h": {**source.params["h"], "layer_1": {**source.params["h"]["layer_1"], "mlp": {**mlp, "proj": zeroed_proj}}},
  }
  tokens_BxT = jnp.asarray(source.eval_tokens_BxT())
  zeroed = float(interventions.next_token_losses(source.model, without_mlp, tokens_BxT).mean())
  assert abs(losses["ce_loss_zero"] - zeroed) < 1e-5, (losses, zeroed)
  patched = float(
    interventions.next_token_losses(source.model, source.params, tokens_BxT, {("mlp_out", 1): Patch.ablate()}).mean()
  )
  assert abs(patched - zeroed) < 1e-5


@pytest.mark.parametrize("suffix", [".npy", ".safetensors"])
def test_an_sae_learns_an_array_a_user_brings(tmp_path, suffix):
  rows = np.random.default_rng(0).normal(size=(1000, 2, 16)).astype(np.float32)  # leading axes are rows
  path = tmp_path / f"acts{suffix}"
  if suffix == ".npy":
    np.save(path, rows)
  else:
    safetensors.numpy.save_file({"activations": rows, "tokens": np.zeros(3, np.int32)}, str(path))
  c = _sae_config(**{"data.input_files": (str(path),)})
  c.model.d_sae, c.model.k, c.eval_rows = 64, 4, 256
  with pytest.warns(InputWarning, match=r"shape \(1000, 2, 16\): its leading axes are read as 2000 rows of 16"):
    result = train_and_evaluate(c, tmp_path / "w")
    assert inference.restore(tmp_path / "w").model.config.d_in == 16  # (it reads the array's width again)
  assert 0 < result["explained_variance"] < 1 and result["l0"] <= 4 and "ce_loss_score" not in result


@pytest.mark.slow
def test_an_sae_on_gpt2_weights_reads_the_mlp_of_a_hugging_face_directory(tmp_path):
  """--config.hf: a GPT-2 directory (Hugging Face's files: a small random GPT-2 exported), on
  config.data's text (Shakespeare in GPT-2's tokens); mlp_post is 4 x d_model wide."""
  cfg = GPTConfig(vocab_size=50257, max_len=64, num_layers=2).replace(d_model=32, num_heads=2)
  params = compiled_init(GPT(cfg), jnp.zeros((1, 8), jnp.int32))
  export_hf_gpt2(cfg, params, tmp_path / "gpt2")
  c = _sae_config(hf=str(tmp_path / "gpt2"), point="mlp_post", layer=1)
  c.data.root, c.model.k = str(tmp_path / "data"), 4
  c.num_train_steps = c.eval_every_steps = c.checkpoint_every_steps = 4
  result = train_and_evaluate(c, tmp_path / "w")
  assert inference.restore(tmp_path / "w").model.config.d_in == 128
  assert np.isfinite(result["ce_loss_score"]) and result["ce_loss_zero"] != result["ce_loss_clean"], result


@pytest.mark.slow
def test_an_sae_on_an_open_familys_weights_reads_its_text_with_its_tokenizer(tmp_path):
  """--config.hf: a Llama-family directory (tests/fixtures/families/smollm, with its tokenizer.json), on
  config.data's text tokenized as the model reads it; its gated MLP's mlp_post is d_mlp (96) wide."""
  smollm = REPO / "tests" / "fixtures" / "families" / "smollm"
  c = _sae_config(hf=str(smollm), point="mlp_post", layer=1)
  c.data.root, c.data.tokenizer, c.model.k = str(tmp_path / "data"), str(smollm), 4
  c.num_train_steps = c.eval_every_steps = c.checkpoint_every_steps = 4
  result = train_and_evaluate(c, tmp_path / "w")
  assert inference.restore(tmp_path / "w").model.config.d_in == 96
  assert np.isfinite(result["ce_loss_score"]) and result["ce_loss_zero"] != result["ce_loss_clean"], result


@pytest.mark.slow
def test_a_transcoder_learns_an_mlp_from_its_input_to_its_output_and_replaces_it(tmp_path):
  """--config.target_point: mlp_in -> mlp_out of block 1 of a Llama-family model (the smollm fixture): rows
  of both points side by side, the output width its own; scored on the MLP's output, and spliced in place
  of the MLP against the loss with the MLP's output zeroed (the zero-MLP loss)."""
  smollm = REPO / "tests" / "fixtures" / "families" / "smollm"
  c = _sae_config(hf=str(smollm), point="mlp_in", target_point="mlp_out", layer=1)
  c.data.root, c.data.tokenizer, c.model.k, c.model.d_sae = str(tmp_path / "data"), str(smollm), 8, 192
  c.num_train_steps = c.eval_every_steps = c.checkpoint_every_steps = 30
  c.optimizer.lr = 3e-3
  result = train_and_evaluate(c, tmp_path / "w")
  config = inference.restore(tmp_path / "w").model.config
  assert (config.d_in, config.d_out, config.transcoder) == (48, 48, True)
  assert 0 < result["explained_variance"] <= 1 and result["l0"] <= 8
  assert result["ce_loss_zero"] != result["ce_loss_clean"] and np.isfinite(result["ce_loss_score"]), result
  with pytest.raises(ConfigError, match="--config.target_point='mlp_out' makes a transcoder, which reads two points"):
    tasks.resolve(_sae_config(synthetic_features=128, target_point="mlp_out"))


@pytest.mark.slow  # a training run in its own process
def test_a_transcoder_of_a_hugging_face_model_trains_on_your_own_text_in_one_command(tmp_path):
  """launch.train --config=experiments/sae.py:hf:DIR with --config.data.input_files: the text given (not an array,
  with a model to read it) read by the model's own tokenizer, a transcoder on circuit-tracer's hooks (mlp.hook_in
  -> mlp.hook_out) of the Llama fixture; the replacement model takes it."""
  smollm = REPO / "tests" / "fixtures" / "families" / "smollm"
  text = tmp_path / "mine.txt"
  text.write_text("\n\n".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(400)))
  flags = [f"--config=experiments/sae.py:hf:{smollm}", f"--config.data.input_files={text}", "--config.seq_len=32"]
  flags += ["--config.point=blocks.1.mlp.hook_in", "--config.target_point=mlp.hook_out", f"--workdir={tmp_path / 'w'}"]
  flags += [f"--config.data.root={tmp_path / 'data'}", "--config.data.piece_chars=2000", "--config.batch_size=128"]
  flags += ["--config.buffer_sequences=16"]
  flags += ["--config.lm_batch_size=8", "--config.eval_sequences=4", "--config.model.d_sae=96", "--config.model.k=8"]
  flags += ["--config.num_train_steps=4", "--config.eval_every_steps=4", "--config.checkpoint_every_steps=4"]
  done = run_module("launch.train", *flags)
  assert done.returncode == 0, done.stderr[-3000:]
  trained = inference.restore(tmp_path / "w")
  c = trained.run.task_config
  assert (c.point, c.target_point, c.layer, trained.model.config.d_in) == ("mlp_input", "mlp_output", 1, 48)
  assert trained.run.data.input_files == (str(text),)
  assert any("mine" in p.name for p in (tmp_path / "data").iterdir())  # the text prepared is the one given


def test_a_point_named_as_transformer_lens_names_it_is_ours_with_its_block():
  """--config.point and --config.target_point in TransformerLens's words (as SAELens's cfg.json carries them)
  resolve to our names, and the block the name says is the run's layer."""
  run = tasks.resolve(_sae_config(synthetic_features=128, point="blocks.1.hook_mlp_in", layer=-1))
  assert (run.task_config.point, run.task_config.layer) == ("mlp_in", 1)
  transcoder = SAETaskConfig(point="blocks.1.hook_mlp_in", target_point="L1.mlp_out")
  assert (transcoder.point, transcoder.target_point, transcoder.layer) == ("mlp_in", "mlp_out", 1)
  with pytest.raises(ConfigError, match="--config.point in block 0, --config.target_point in block 1"):
    SAETaskConfig(point="L0.mlp_in", target_point="L1.mlp_out")
  with pytest.raises(ConfigError, match="names a head; an SAE reads a whole point"):
    SAETaskConfig(point="L1H0.z")


@pytest.mark.parametrize(
  "changes,array,message",
  [
    (
      {"point": "resid_middle"},
      None,
      "--config.point='resid_middle' is not a named point of this model; choose one of",
    ),
    ({"layer": 7}, None, r"--config.layer=7 is beyond the model's 2 layers; choose 0 to 1"),
    ({"point": "blocks.0.hook_resid_pre"}, None, r"--config.point in block 0 and --config.layer=1: name one block"),
    ({"point": "blocks.0.hook_nothing"}, None, r"--config.point: no named point 'blocks.0.hook_nothing'"),
    ({"point": "pattern"}, None, "--config.point='pattern' is not a vector per token"),
    ({"run": "NOT_A_RUN"}, None, "is not a training workdir"),
    ({"run": "", "synthetic_features": 8, "hf": "x"}, None, "give exactly one of"),
    (
      {"run": "", "model.d_in": 12},
      np.ones((100, 8), np.float32),
      r"--config.model.d_in=12, but the activations are 8 wide",
    ),
    ({"run": ""}, np.array([[1.0, np.nan]] * 50, np.float32), r"row 0 is not finite"),
    ({"run": ""}, np.zeros((0, 8), np.float32), r"shape \(0, 8\); activations are rows x d_in"),
  ],
)
def test_bad_input_is_one_error_and_nothing_written(lm_run, tmp_path, changes, array, message):
  changes = {"run": str(lm_run), **changes}
  if changes["run"] == "NOT_A_RUN":
    changes["run"] = str(tmp_path)
  if array is not None:
    np.save(tmp_path / "acts.npy", array)
    changes["data.input_files"] = (str(tmp_path / "acts.npy"),)
  c = _sae_config(**changes)
  c.num_train_steps = 1
  workdir = tmp_path / "w"
  with pytest.raises(UserError, match=message):
    train_and_evaluate(c, workdir)
  assert not workdir.exists()


@pytest.mark.slow
def test_launch_probe_writes_an_saes_pages_and_refuses_a_model_that_is_not_one(lm_run, sae_run, tmp_path):
  shown = run_module("launch.probe", f"--sae={sae_run[0]}", "--latents=0,5", "--text=ROMEO:", f"--out={tmp_path}")
  assert shown.returncode == 0, shown.stderr[-3000:]
  assert "latent 0: density" in shown.stdout and "latent 5: density" in shown.stdout
  assert (tmp_path / "features.html").is_file() and (tmp_path / "latent_5.png").is_file()
  refused = run_module("launch.probe", f"--sae={lm_run}", f"--out={tmp_path / 'no'}")
  assert refused.returncode != 0 and "holds a 'lm' model (config.task), not a 'sae' one" in refused.stderr
  assert not (tmp_path / "no").exists()


def _losses_on_one_and_eight_devices(args: list[str], tmp_path) -> list[dict]:
  """The per-step losses of launch.train with `args` on one device (tmp_path/one) and on 8 fake devices of mesh
  data 2 x fsdp 2 x tensor 2 (tmp_path/eight)."""
  one = run_module("launch.train", *args, f"--workdir={tmp_path / 'one'}")
  assert one.returncode == 0, one.stderr[-3000:]
  mesh = ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"]
  eight = run_module("launch.train", *args, *mesh, f"--workdir={tmp_path / 'eight'}", env={"JAX_NUM_CPU_DEVICES": "8"})
  assert eight.returncode == 0 and "8 x cpu" in eight.stdout, eight.stderr[-3000:]
  return [metrics.last_per_step(metrics.read_jsonl(tmp_path / w / "metrics.jsonl"), "loss") for w in ("one", "eight")]


@pytest.mark.slow
def test_an_sae_trains_on_eight_devices_as_on_one(tmp_path):
  """The latents split over the tensor axis, the encoder's input over fsdp, the rows over data and
  fsdp (the logical axis rules): the same losses as one device's."""
  args = ["--config=experiments/sae.py:tiny", "--config.log_every_steps=1"]
  losses = _losses_on_one_and_eight_devices(args, tmp_path)
  assert len(losses[0]) == 20
  np.testing.assert_allclose([losses[1][s] for s in range(1, 21)], [losses[0][s] for s in range(1, 21)], rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("cross_layer", [False, True])
def test_a_transcoder_and_a_cross_layer_one_train_on_eight_devices_as_on_one(tmp_path, cross_layer):
  """A Hugging Face model's transcoder (mlp.hook_in -> mlp.hook_out of block 1) and cross-layer transcoder, the
  model run on the mesh too, its latents over the tensor axis (a cross-layer one's every layer's), the rows over
  data and fsdp: the same losses as one device's, and the latents' axis sharded in the checkpoint."""
  smollm = REPO / "tests" / "fixtures" / "families" / "smollm"
  text = tmp_path / "text.txt"
  text.write_text(
    "\n\n".join(f"Line {i}: the quick brown fox jumps over the lazy dog, then sleeps." for i in range(600))
  )
  args = [f"--config=experiments/sae.py:hf:{smollm}", f"--config.data.input_files={text}", "--config.seq_len=32"]
  args += ["--config.data.piece_chars=2000", f"--config.data.root={tmp_path / 'data'}", "--config.log_every_steps=1"]
  args += ["--config.point=blocks.1.mlp.hook_in", "--config.target_point=mlp.hook_out", "--config.batch_size=128"]
  args += [
    "--config.buffer_sequences=16",
    "--config.lm_batch_size=8",
    "--config.eval_sequences=8",
    "--config.model.k=8",
  ]
  args += ["--config.model.d_sae=64", "--config.num_train_steps=6", "--config.eval_every_steps=6"]
  args += ["--config.checkpoint_every_steps=6", f"--config.cross_layer={cross_layer}"]
  losses = _losses_on_one_and_eight_devices(args, tmp_path)
  assert len(losses[0]) == 6
  np.testing.assert_allclose([losses[1][s] for s in range(1, 7)], [losses[0][s] for s in range(1, 7)], rtol=1e-5)
  check = (
    "import sys; from transformer import inference; p = inference.restore(sys.argv[1]).params['W_enc']; "
    "print(getattr(p, 'value', p).sharding.spec)"
  )
  env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8"}
  spec = subprocess.run(
    [sys.executable, "-c", check, str(tmp_path / "eight")], cwd=REPO, env=env, capture_output=True, text=True
  )
  assert "'tensor'" in spec.stdout, spec.stdout + spec.stderr[-2000:]


def test_the_pages_show_by_default_latents_a_reader_learns_from():
  """Not the densest (a latent firing on every token), not the rare (one token), not a window-start
  artifact (firing on each window's first token): of the rest, one per band of density, the strongest."""
  rng = np.random.default_rng(0)
  B, T, S = 8, 16, 12
  z = np.zeros((B, T, S), np.float32)
  z[:, :, 0] = 1.0  # dense: every token
  z[0, 3, 1] = 5.0  # rare: one token
  z[:, 0, 2] = 3.0  # where each window starts
  for s, density in zip(range(3, S), (0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.095)):
    z[..., s] = (rng.random((B, T)) < density) * (1 + s / 10)
  chosen = features.readable_latents(z, count=4)
  assert len(chosen) == 4 and not {0, 1, 2} & set(chosen)
  assert len(set(chosen)) == 4
  assert set(features.readable_latents(z, count=12)) == set(range(12))  # the others after them, none lost
