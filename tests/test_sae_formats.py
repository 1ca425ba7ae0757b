"""SAELens's on-disk format both ways (transformer.models.sae_formats): SAEs and transcoders that SAELens
saved (tests/make_saelens_fixtures.py; tests/fixtures/saelens/<architecture>) encode and decode here as
there; ours written and read back are the same functions; and SAELens loads ours (with sae-lens present)."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from transformer import data, inference
from transformer.errors import CheckpointError
from transformer.interp.activations import ModelActivations
from transformer.models.sae import SAE, SAEConfig
from transformer.models.sae_formats import export_saelens, import_gemma_scope, import_saelens
from transformer.tasks.sae import spliced_losses

from conftest import REPO, compiled_apply, compiled_init, run_module

FIXTURES = REPO / "tests" / "fixtures" / "saelens"
ARCHITECTURES = ["standard", "topk", "jumprelu", "transcoder", "skip_transcoder", "jumprelu_transcoder"]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_what_saelens_saved_encodes_and_decodes_here_as_there(name):
  config, params = import_saelens(FIXTURES / name)
  reference = np.load(FIXTURES / name / "reference.npz")
  y, z = compiled_apply(SAE(config), {"params": params}, reference["x"])
  np.testing.assert_allclose(z, reference["z"], atol=1e-5)
  np.testing.assert_allclose(y, reference["y"], atol=1e-5)
  assert (np.asarray(z) > 0).any() and (np.asarray(z) == 0).any()  # sparse, not empty


def _ours(**changes):
  """A random SAE or transcoder of ours with scales other than 1 (what an export must fold)."""
  config = SAEConfig(d_in=12, d_sae=32, k=5, **changes).check()
  params = dict(compiled_init(SAE(config), np.zeros((2, 12), np.float32)))
  rng = np.random.default_rng(0)
  params.update({k: rng.normal(size=np.shape(v)).astype(np.float32) * 0.3 for k, v in params.items() if k[0] in "Wb"})
  params["input_scale"] = np.float32(2.5)
  if config.transcoder:
    params["output_scale"] = np.float32(0.4)
  if "threshold" in params:
    params["threshold"] = rng.random(32).astype(np.float32) * 0.2
  return config, params


CASES = [
  dict(activation="topk"),
  dict(activation="jumprelu"),
  dict(activation="relu"),
  dict(activation="batchtopk"),
  dict(activation="relu", d_out=10),
  dict(activation="relu", d_out=10, skip=True),
  dict(activation="jumprelu", d_out=10),
]


@pytest.mark.parametrize("changes", CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_ours_written_and_read_back_is_the_same_function(changes, tmp_path):
  config, params = _ours(**changes)
  export_saelens(config, params, tmp_path, hook_name="blocks.1.hook_mlp_out")
  again_config, again = import_saelens(tmp_path)
  assert (again_config.d_in, again_config.latents, again_config.out_width) == (12, 32, config.out_width)
  x = np.random.default_rng(1).normal(size=(16, 12)).astype(np.float32)
  y, z = compiled_apply(SAE(config), {"params": params}, x)
  y_again, z_again = compiled_apply(SAE(again_config), {"params": again}, x)
  np.testing.assert_allclose(z_again, z, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(y_again, y, rtol=1e-5, atol=1e-5)


def test_a_directory_that_is_not_an_sae_is_one_error(tmp_path):
  with pytest.raises(CheckpointError, match="no cfg.json in .*: SAELens's SAE.save_model writes it"):
    import_saelens(tmp_path)
  shutil.copytree(FIXTURES / "topk", tmp_path / "gated")
  cfg = json.loads((tmp_path / "gated" / "cfg.json").read_text())
  (tmp_path / "gated" / "cfg.json").write_text(json.dumps({**cfg, "architecture": "gated"}))
  with pytest.raises(CheckpointError, match="architecture 'gated' is not one we read; supported: standard, topk"):
    import_saelens(tmp_path / "gated")


@pytest.mark.skipif(
  not os.environ.get("TRANSFORMER_SAE_PYTHON"), reason="set TRANSFORMER_SAE_PYTHON to a python with sae-lens"
)
@pytest.mark.parametrize("changes", CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_saelens_loads_ours_with_the_same_encode_and_decode(changes, tmp_path):
  config, params = _ours(**changes)
  export_saelens(config, params, tmp_path)
  x = np.random.default_rng(1).normal(size=(16, 12)).astype(np.float32)
  y, z = compiled_apply(SAE(config), {"params": params}, x)
  np.savez(tmp_path / "ours.npz", x=x, y=np.asarray(y), z=np.asarray(z))
  script = REPO / "tests" / "make_saelens_fixtures.py"
  proc = subprocess.run(
    [os.environ["TRANSFORMER_SAE_PYTHON"], script, "--check", tmp_path], capture_output=True, text=True
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  found = json.loads(proc.stdout.splitlines()[-1])
  assert found["z"] <= 1e-4 and found["y"] <= 1e-4, found


@pytest.mark.slow  # the model's windows of text, prepared and run
def test_an_sae_in_saelenss_format_splices_into_a_model_as_ours_does(tmp_path):
  """An SAE of a family's resid_pre (the SmolLM2 fixture, width 48) written in SAELens's format and read
  back splices into the model with the same loss as the SAE it was written from."""
  smollm = REPO / "tests" / "fixtures" / "families" / "smollm"
  trained = inference.load(hf=smollm)
  text_file = tmp_path / "text.txt"
  text_file.write_text(" ".join(json.loads((smollm / "tokenizer_reference.json").read_text())["texts"][:1]) * 40)
  options = data.PrepareOptions(tokenizer=str(smollm), validation_fraction=0.2, piece_chars=500)
  text = data.ensure_prepared(data.file_source([str(text_file)], "text"), tmp_path / "prepared", options)
  source = ModelActivations(
    trained.model,
    trained.params,
    text,
    point="resid_pre",
    layer=1,
    seq_len=16,
    buffer_sequences=4,
    batch_sequences=4,
    eval_sequences=4,
    seed=0,
  )
  config = SAEConfig(d_in=48, d_sae=96, k=8).check()
  params = dict(compiled_init(SAE(config), np.zeros((2, 48), np.float32)))
  params["input_scale"] = np.float32(1.7)
  export_saelens(config, params, tmp_path / "sae")
  read_config, read = import_saelens(tmp_path / "sae")
  ours, theirs = spliced_losses(source, SAE(config), params), spliced_losses(source, SAE(read_config), read)
  assert ours["ce_loss_spliced"] == pytest.approx(theirs["ce_loss_spliced"], abs=1e-4)
  assert ours["ce_loss_spliced"] != ours["ce_loss_clean"]


def test_a_gemma_scope_params_npz_is_its_jumprelu_sae(tmp_path):
  """Gemma Scope's format: z = JumpReLU_θ(x W_enc + b_enc), x̂ = z W_dec + b_dec, computed here in NumPy from
  the file's arrays (its documented forward pass), equals ours of the file."""
  rng = np.random.default_rng(0)
  arrays = dict(
    W_enc=rng.normal(size=(12, 32)),
    W_dec=rng.normal(size=(32, 12)),
    b_enc=rng.normal(size=32) * 0.1,
    b_dec=rng.normal(size=12),
    threshold=rng.random(32) * 0.5,
  )
  arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
  np.savez(tmp_path / "params.npz", **arrays)
  config, params = import_gemma_scope(tmp_path)
  x = rng.normal(size=(16, 12)).astype(np.float32)
  pre = x @ arrays["W_enc"] + arrays["b_enc"]
  z_want = pre * (pre > arrays["threshold"])
  y, z = compiled_apply(SAE(config), {"params": params}, x)
  np.testing.assert_allclose(z, z_want, atol=1e-5)
  np.testing.assert_allclose(y, z_want @ arrays["W_dec"] + arrays["b_dec"], atol=1e-4)
  np.savez(tmp_path / "other.npz", W_enc=arrays["W_enc"])
  with pytest.raises(CheckpointError, match="lacks W_dec, b_dec, b_enc, threshold: not a Gemma Scope JumpReLU SAE"):
    import_gemma_scope(tmp_path / "other.npz")


@pytest.mark.slow  # launch.probe, a process a case
def test_launch_probe_opens_dictionaries_from_their_files_on_a_model_it_is_given(tmp_path):
  """--sae with SAELens's files (their hook_name the point) and with a Gemma Scope params.npz (--point), and
  --graph through circuit-tracer's set, each on a Hugging Face GPT-2 (--hf) over --input_file's text: the
  feature pages and the graph written; a dictionary of another width, or files that name no point, one error."""
  from transformer.models import tracer_formats

  model = REPO / "tests" / "fixtures" / "gpt2_own_tokenizer"  # d_model 32, its own tokenizer
  text = tmp_path / "text.txt"
  text.write_text(" ".join([(model / "text.txt").read_text()] * 60))
  rng = np.random.default_rng(3)
  config = SAEConfig(d_in=32, d_sae=64, activation="jumprelu").check()
  params = dict(compiled_init(SAE(config), np.zeros((2, 32), np.float32)))
  params.update(W_enc=rng.normal(size=(32, 64)).astype(np.float32), threshold=np.full(64, 0.1, np.float32))
  export_saelens(config, params, tmp_path / "saelens", hook_name="blocks.1.hook_resid_pre")
  gemma = {k: np.asarray(v) for k, v in params.items() if k in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")}
  np.savez(tmp_path / "params.npz", **gemma)
  common = [f"--hf={model}", f"--input_file={text}", "--latents=0,1"]
  for name, extra in [("saelens", []), ("params.npz", ["--point=blocks.1.hook_resid_pre"])]:
    out = tmp_path / f"pages-{name}"
    shown = run_module("launch.probe", f"--sae={tmp_path / name}", *common, *extra, f"--out={out}")
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert (out / "features.html").is_file() and "latent 0: density" in shown.stdout
  refused = run_module("launch.probe", f"--sae={tmp_path / 'params.npz'}", *common, f"--out={tmp_path / 'no'}")
  assert refused.returncode == 1 and "names no point it reads: give --point" in refused.stderr
  narrow = SAEConfig(d_in=16, d_sae=32, activation="relu").check()
  export_saelens(
    narrow, compiled_init(SAE(narrow), np.zeros((2, 16), np.float32)), tmp_path / "narrow", "blocks.0.hook_resid_pre"
  )
  refused = run_module("launch.probe", f"--sae={tmp_path / 'narrow'}", *common, f"--out={tmp_path / 'no'}")
  assert refused.returncode == 1 and "reads 16-wide rows; L0.resid_pre of" in refused.stderr
  assert refused.stderr.count("error:") == 1 and not (tmp_path / "no").exists()
  transcoder = SAEConfig(d_in=32, d_out=32, d_sae=64, activation="relu").check()
  layers = []
  for layer in range(2):
    p = dict(compiled_init(SAE(transcoder), np.zeros((2, 32), np.float32), seed=layer))
    p.update(W_enc=rng.normal(size=(32, 64)).astype(np.float32) * 0.5)
    layers.append((transcoder, p))
  tracer_formats.export_circuit_tracer(layers, tmp_path / "set", point_in="mlp_input", point_out="mlp_output")
  drawn = run_module(
    "launch.probe",
    "--graph",
    f"--transcoders={tmp_path / 'set'}",
    f"--hf={model}",
    "--text=To be, or not",
    f"--out={tmp_path / 'graph'}",
  )
  assert drawn.returncode == 0, drawn.stderr[-3000:]
  meta = json.loads((tmp_path / "graph" / "graph.json").read_text())["metadata"]
  capped = run_module(
    *("launch.probe", "--graph", f"--transcoders={tmp_path / 'set'}", f"--hf={model}", "--text=To be, or not"),
    *("--max_feature_nodes=5", f"--out={tmp_path / 'capped'}"),
  )
  assert capped.returncode == 0 and "(5 of them nodes)" in capped.stdout, capped.stderr[-3000:]
  from transformer import tokenizers

  tok = tokenizers.load_tokenizer(model)
  a, b = (tok.decode([int(i)]) for i in np.load(model / "input_ids.npy")[0][2:4])
  versus = run_module(
    *("launch.probe", "--graph", f"--transcoders={tmp_path / 'set'}", f"--hf={model}", "--text=To be, or not"),
    *(f"--target={a}", f"--versus={b}", f"--out={tmp_path / 'versus'}"),
  )
  assert versus.returncode == 0, versus.stderr[-3000:]
  nodes = json.loads((tmp_path / "versus" / "graph.json").read_text())["nodes"]
  assert [n["clerp"].startswith('Output "logit(') for n in nodes if n["feature_type"] == "logit"] == [True]
  assert meta["scan"] == "set" and len(meta["transcoder_list"]) == 2 and "To be" in meta["prompt"]
