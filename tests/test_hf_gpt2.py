"""Parity with Hugging Face's GPT2LMHeadModel through golden fixtures (tests/make_gpt2_fixtures.py)."""

import json
import os
import shutil
import subprocess

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from transformer.errors import CheckpointError, ConfigError
from transformer.models import formats
from transformer.models.formats.gpt2 import export_hf_gpt2, import_hf_gpt2
from transformer.models.gpt import GPT, GPTConfig

from conftest import REPO

FIXTURES = REPO / "tests" / "fixtures"
NAMES = ["gpt2_tiny_a", "gpt2_tiny_b"]


def _logits(cfg, params, ids):
  return np.asarray(jax.jit(GPT(cfg).apply)({"params": params}, ids))  # one program, not op by op


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("attention", ["einsum", "xla"])
def test_logits_match_reference(name, attention):
  cfg, params = import_hf_gpt2(FIXTURES / name, attention=attention)
  hf = json.loads((FIXTURES / name / "config.json").read_text())
  assert (cfg.num_layers, cfg.block.num_heads, cfg.block.d_model, cfg.vocab_size) == (
    hf["n_layer"],
    hf["n_head"],
    hf["n_embd"],
    hf["vocab_size"],
  )
  ids = np.load(FIXTURES / name / "input_ids.npy")
  diff = np.abs(_logits(cfg, params, ids) - np.load(FIXTURES / name / "logits.npy")).max()
  assert diff <= 1e-4, diff


@pytest.mark.parametrize("name", NAMES)
def test_hub_layout_without_prefix_and_with_mask_buffers(name, tmp_path):
  """The hub's gpt2 files have no `transformer.` prefix and carry `h.N.attn.bias` mask buffers."""
  tensors = {k.removeprefix("transformer."): v for k, v in load_file(FIXTURES / name / "model.safetensors").items()}
  tensors["h.0.attn.bias"] = np.tril(np.ones((1, 1, 8, 8), np.float32))
  save_file(tensors, tmp_path / "model.safetensors")
  shutil.copy(FIXTURES / name / "config.json", tmp_path)
  cfg, params = import_hf_gpt2(tmp_path)
  ids = np.load(FIXTURES / name / "input_ids.npy")
  np.testing.assert_allclose(_logits(cfg, params, ids), np.load(FIXTURES / name / "logits.npy"), atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_import_export_import_is_identical(name, tmp_path):
  cfg, params = import_hf_gpt2(FIXTURES / name)
  export_hf_gpt2(cfg, params, tmp_path)
  cfg2, params2 = import_hf_gpt2(tmp_path)
  assert cfg2 == cfg
  chex.assert_trees_all_equal(params2, params)
  # The export holds exactly the tensors Hugging Face itself wrote, under the same keys.
  ours, theirs = load_file(tmp_path / "model.safetensors"), load_file(FIXTURES / name / "model.safetensors")
  assert ours.keys() == theirs.keys()
  for k in theirs:
    np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)
  config_mode = (tmp_path / "config.json").stat().st_mode & 0o777
  assert (tmp_path / "model.safetensors").stat().st_mode & 0o777 == config_mode  # not safetensors' own 0600
  exported = json.loads((tmp_path / "config.json").read_text())
  hf = json.loads((FIXTURES / name / "config.json").read_text())
  for field in (
    "n_layer",
    "n_head",
    "n_embd",
    "n_positions",
    "vocab_size",
    "n_inner",
    "layer_norm_epsilon",
    "tie_word_embeddings",
    "activation_function",
    "model_type",
  ):
    assert exported[field] == hf[field], field


def test_scanned_import_and_export(tmp_path):
  cfg, params = import_hf_gpt2(FIXTURES / "gpt2_tiny_a")
  scfg, sparams = import_hf_gpt2(FIXTURES / "gpt2_tiny_a", scan_layers=True)
  assert scfg.scan_layers and "layers" in sparams["h"]
  ids = np.load(FIXTURES / "gpt2_tiny_a" / "input_ids.npy")
  np.testing.assert_allclose(_logits(scfg, sparams, ids), _logits(cfg, params, ids), atol=1e-5)
  export_hf_gpt2(scfg, sparams, tmp_path)
  chex.assert_trees_all_equal(import_hf_gpt2(tmp_path)[1], params)


def test_untied_head_round_trip(tmp_path):
  cfg, params = import_hf_gpt2(FIXTURES / "gpt2_tiny_b")
  cfg = cfg.replace(tie_embeddings=False)
  params = {**params, "lm_head": {"kernel": params["wte"]["embedding"].T * 0.5}}
  export_hf_gpt2(cfg, params, tmp_path)
  assert "lm_head.weight" in load_file(tmp_path / "model.safetensors")
  cfg2, params2 = import_hf_gpt2(tmp_path)
  assert not cfg2.tie_embeddings
  chex.assert_trees_all_equal(params2, params)


@pytest.mark.slow
def test_shorter_context_keeps_first_positions():
  cfg, params = import_hf_gpt2(FIXTURES / "gpt2_tiny_a", max_len=16)
  full_cfg, full = import_hf_gpt2(FIXTURES / "gpt2_tiny_a")
  ids = np.load(FIXTURES / "gpt2_tiny_a" / "input_ids.npy")[:, :16]
  np.testing.assert_allclose(_logits(cfg, params, ids), _logits(full_cfg, full, ids), atol=1e-6)


def _broken(tmp_path, edit):
  tensors = load_file(FIXTURES / "gpt2_tiny_a" / "model.safetensors")
  edit(tensors)
  tmp_path.mkdir(parents=True, exist_ok=True)
  save_file(tensors, tmp_path / "model.safetensors")
  shutil.copy(FIXTURES / "gpt2_tiny_a" / "config.json", tmp_path)
  return tmp_path


def test_errors_name_the_tensor(tmp_path):
  with pytest.raises(CheckpointError, match="missing tensor 'h.1.mlp.c_proj.bias'"):
    import_hf_gpt2(_broken(tmp_path / "a", lambda t: t.pop("transformer.h.1.mlp.c_proj.bias")))

  def reshape(t):
    t["transformer.h.0.attn.c_attn.weight"] = t["transformer.h.0.attn.c_attn.weight"][:, :96]

  with pytest.raises(CheckpointError, match=r"'h.0.attn.c_attn.weight' .* has shape \(64, 96\), expected \(64, 192\)"):
    import_hf_gpt2(_broken(tmp_path / "b", reshape))

  def extra(t):
    t["transformer.h.0.attn.rotary"] = np.zeros(3, np.float32)

  with pytest.raises(CheckpointError, match="has a tensor a GPT-2 of this config.json does not: 'h.0.attn.rotary'"):
    import_hf_gpt2(_broken(tmp_path / "c", extra))
  with pytest.raises(CheckpointError, match="no GPT-2 safetensors at /nowhere"):
    import_hf_gpt2("/nowhere")
  (tmp_path / "torch").mkdir()
  (tmp_path / "torch" / "pytorch_model.bin").write_bytes(b"PK")  # PyTorch's weights alone: what to do, said
  with pytest.raises(CheckpointError, match=r"PyTorch's pickled weights \(pytorch_model.bin\).*safe_serialization"):
    import_hf_gpt2(tmp_path / "torch")
  with pytest.raises(CheckpointError, match=r"max_len=64 is longer than the position table .* \(32 rows\)"):
    import_hf_gpt2(FIXTURES / "gpt2_tiny_a", max_len=64)
  (tmp_path / "d").mkdir()
  save_file(load_file(FIXTURES / "gpt2_tiny_a" / "model.safetensors"), tmp_path / "d" / "model.safetensors")
  with pytest.raises(CheckpointError, match="cannot tell the number of heads"):
    import_hf_gpt2(tmp_path / "d")  # d_model 64 is no OpenAI size and there is no config.json


@pytest.mark.parametrize(
  "change, message",
  [
    ({"n_special": 2}, "a gpt2's config.json with n_special=2: this key is not one we read, and may change the model"),
    ({"scale_attn_by_inverse_layer_idx": True}, r"scale_attn_by_inverse_layer_idx=True \(we compute False\)"),
    ({"activation_function": "relu"}, r"activation_function='relu' \(we compute 'gelu_new'\) is not one we run"),
  ],
)
def test_a_config_key_we_do_not_compute_is_one_error_naming_it(tmp_path, change, message):
  """The allowlist: a GPT-2 config.json key the format does not read, or one read only at its value, at another."""
  shutil.copytree(FIXTURES / "gpt2_tiny_a", tmp_path / "gpt2")
  config = json.loads((tmp_path / "gpt2" / "config.json").read_text())
  (tmp_path / "gpt2" / "config.json").write_text(json.dumps({**config, **change}))
  with pytest.raises(CheckpointError, match=message):
    import_hf_gpt2(tmp_path / "gpt2")


def test_export_refuses_what_the_gpt2_format_cannot_hold(tmp_path):
  """The later options have no place in a GPT-2 file: one error naming each (what the written files
  would read back as differs there), and no file written."""
  cfg = GPTConfig().replace(vocab_size=50, max_len=16, num_layers=1, num_heads=2, d_model=16)
  modern = cfg.replace(positions="rope", norm="rms_norm", activation="swiglu", qk_norm=True, logits_softcap=30.0)
  params = jax.eval_shape(GPT(modern).init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
  with pytest.raises(ConfigError) as refused:
    export_hf_gpt2(modern, params, tmp_path / "out")
  assert str(refused.value) == (
    "the Hugging Face GPT-2 format cannot hold this model: block.norm='rms_norm' (GPT-2's: 'layer_norm'); "
    "block.activation='swiglu' (GPT-2's: 'gelu_tanh'); block.qk_norm=True (GPT-2's: False); "
    "positions='rope' (GPT-2's: 'learned'); logits_softcap=30.0 (GPT-2's: 0.0)"
  )
  assert not (tmp_path / "out").exists()


@pytest.mark.skipif(
  not os.environ.get("TRANSFORMER_TORCH_PYTHON"),
  reason="set TRANSFORMER_TORCH_PYTHON to a python with torch + transformers",
)
@pytest.mark.parametrize("name", NAMES)
def test_hf_loads_our_export(name, tmp_path):
  cfg, params = import_hf_gpt2(FIXTURES / name)
  export_hf_gpt2(cfg, params, tmp_path)
  out = subprocess.run(
    [
      os.environ["TRANSFORMER_TORCH_PYTHON"],
      str(REPO / "tests" / "make_gpt2_fixtures.py"),
      "--check",
      str(tmp_path),
      str(FIXTURES / name),
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr
  assert float(out.stdout.split()[-1]) <= 1e-4


def test_the_formats_registry_reads_gpt2s_config_json_as_the_importer_reads_its_tensors():
  """GPT-2 through the one interface: its config.json read by formats.FORMATS["gpt2"] is the config the importer
  infers from the tensors' shapes, its export's config.json is config_to_hf's, and its layout covers every param."""
  hf = json.loads((FIXTURES / "gpt2_tiny_a" / "config.json").read_text())
  fmt = formats.FORMATS["gpt2"]
  config, params = import_hf_gpt2(FIXTURES / "gpt2_tiny_a")
  assert fmt.config_from_hf(hf, "config.json") == config
  assert {e.ours for e in fmt.layout(config)} == {tuple(k.key for k in p) for p, _ in jax.tree.leaves_with_path(params)}
  assert fmt.config_to_hf(config)["n_layer"] == config.num_layers


@pytest.mark.parametrize("files", ["tokenizer.json", "vocab.json + merges.txt"])
def test_a_gpt2_with_its_own_tokenizer_opens_with_transformers_ids_and_logits(files, tmp_path):
  """A GPT-2 of a 320-token byte-level BPE: its directory's tokenizer (save_pretrained's tokenizer.json, or GPT-2's
  older vocab.json + merges.txt) is the one read, by inference.load and by opening.open_path, with AutoTokenizer's
  ids of the text and GPT2LMHeadModel's logits; without the files, one error naming them (not a config flag)."""
  from transformer import inference, opening

  source = FIXTURES / "gpt2_own_tokenizer"
  directory = tmp_path / "model"
  directory.mkdir()
  for name in ("config.json", "model.safetensors"):
    shutil.copy(source / name, directory)
  for name in (
    ("tokenizer.json", "tokenizer_config.json") if files == "tokenizer.json" else ("vocab.json", "merges.txt")
  ):
    shutil.copy(source / name if files == "tokenizer.json" else source / "slow" / name, directory)
  ids = np.load(source / "input_ids.npy")
  text = (source / "text.txt").read_text()
  trained = inference.load(hf=directory)
  assert trained.tokenizer.encode(text) == ids[0].tolist()
  assert trained.tokenizer.decode(ids[0].tolist()) == text
  np.testing.assert_allclose(
    _logits(trained.task.model_config, trained.params, ids), np.load(source / "logits.npy"), atol=1e-5
  )
  assert opening.open_path(directory).tokenizer.encode(text) == ids[0].tolist()
  for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
    (directory / name).unlink(missing_ok=True)
  with pytest.raises(
    CheckpointError,
    match=r"a GPT-2 of 320 tokens with no tokenizer files.*put the model's tokenizer.json \(or vocab.json and merges.txt\) beside",
  ):
    inference.load(hf=directory)
  assert opening.open_path(directory).tokenizer.vocab_size == 320  # ids alone, for the tools that need no text
  (directory / "tokenizer.json").write_text('{"model": ')  # cut short: said so, not "no tokenizer"
  with pytest.raises(Exception, match=r"tokenizer.json is not JSON"):
    inference.load(hf=directory)
