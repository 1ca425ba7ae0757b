"""The open families (Llama, SmolLM, Mistral, Qwen2, Qwen3, GPT-NeoX/Pythia, OLMo 2, Gemma, Gemma 2,
Gemma 3) in the one GPT, against golden fixtures that transformers made (tests/make_family_fixtures.py;
tests/fixtures/families/<name>): the same logits, the same greedy generation, the export transformers
loads, and one error for each bad directory."""

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from experiments import shapes
from transformer import inference, layers, tokenizers
from transformer.errors import CheckpointError, ConfigError, TokenizerError
from transformer.generation import sampling
from transformer.interp import interventions, patching
from transformer.interp.interventions import Patch
from transformer.models import formats
from transformer.models.gpt import GPT, GPTConfig, count_params

from conftest import REPO, compiled_apply, run_module

FIXTURES = REPO / "tests" / "fixtures" / "families"
FAMILIES = ["llama", "smollm", "mistral", "qwen2", "qwen3", "gpt_neox", "olmo2", "gemma", "gemma2", "gemma3_text"]


@functools.lru_cache  # imported once per fixture in a test process (tests copy what they change)
def _imported(name: str) -> tuple[GPTConfig, dict]:
  return formats.import_hf(FIXTURES / name)


def _reference(name: str):
  return np.load(FIXTURES / name / "reference.npz")


def _logits(cfg: GPTConfig, params, reference) -> np.ndarray:
  mask = reference["attention_mask"].astype(bool)
  return np.asarray(compiled_apply(GPT(cfg), {"params": params}, reference["input_ids"], valid_BxT=mask))


def _largest_difference(cfg: GPTConfig, params, reference) -> float:
  """Of our logits from transformers', over the real (not padding) positions of the padded batch."""
  real = reference["attention_mask"].astype(bool)
  return float(np.abs(_logits(cfg, params, reference) - reference["logits"])[real].max())


@pytest.mark.parametrize("name", FAMILIES)
def test_logits_equal_transformers_on_a_padded_batch(name):
  cfg, params = _imported(name)
  assert _largest_difference(cfg, params, _reference(name)) <= 1e-4


# What each family's fixture needs: with the option as its config.json sets it the logits are
# transformers' (above); with it changed they are not. (Options that change the params' shapes, such as
# grouped-query attention or the norms' places, cannot even load otherwise: the shapes check refuses.)
WITHOUT = {
  "llama": [dict(rotary=layers.RotaryConfig(theta=500000.0)), dict(rotary=layers.RotaryConfig())],
  "smollm": [dict(rotary=layers.RotaryConfig())],
  "mistral": [dict(sliding_window=0)],
  "qwen3": [dict(rotary=layers.RotaryConfig(theta=1e6))],
  "gpt_neox": [dict(parallel=False), dict(rotary=layers.RotaryConfig()), dict(activation="gelu_tanh")],
  "gemma": [dict(norm_offset=0.0), dict(scale_embeddings=False), dict(activation="swiglu")],
  "gemma2": [
    dict(sliding_window=0),
    dict(global_layers=()),
    dict(attention_softcap=0.0, attention="xla"),
    dict(logits_softcap=0.0),
    dict(attention_scale=0.0),
  ],
  "gemma3_text": [
    dict(rotary=layers.RotaryConfig(theta=1e6, scaling="linear", factor=8.0)),
    dict(global_layers=(0, 1, 2)),
  ],
}


@pytest.mark.slow  # a program for each change
@pytest.mark.parametrize("name", sorted(WITHOUT))
def test_each_option_is_needed_for_its_family(name):
  cfg, params = _imported(name)
  reference = _reference(name)
  for change in WITHOUT[name]:
    changed = cfg.replace(**change).check()
    assert changed != cfg
    assert _largest_difference(changed, params, reference) > 1e-4, change  # not equal, at the tolerance above


def _greedy(cfg: GPTConfig, params, reference) -> list[list[int]]:
  prompts = [row[mask == 1].tolist() for row, mask in zip(reference["prompt_ids"], reference["prompt_mask"])]
  return sampling.generate(GPT(cfg), params, prompts, max_new_tokens=40, sampling=sampling.Sampling(temperature=0.0))


@pytest.mark.parametrize("name", ["mistral"])  # grouped-query attention's cache, past the sliding window
def test_greedy_generation_with_the_cache_equals_transformers_generate(name):
  cfg, params = _imported(name)
  reference = _reference(name)
  assert _greedy(cfg, params, reference) == reference["generated"].tolist()


@pytest.mark.slow  # a sampler program for each family
@pytest.mark.parametrize("name", [n for n in FAMILIES if n != "mistral"])
def test_greedy_generation_of_every_family_equals_transformers_generate(name):
  test_greedy_generation_with_the_cache_equals_transformers_generate(name)


def test_the_cache_of_grouped_query_attention_holds_the_kv_heads():
  cfg, _ = _imported("llama")
  cache = jax.eval_shape(lambda: sampling.init_cache(GPT(cfg), 3, 32))
  G, K, H = cfg.block.kv_heads, cfg.block.head_dim, cfg.block.num_heads
  assert (G, H) == (2, 4)
  attn = cache["h"]["layer_0"]["attn"]
  assert attn["key"].shape == (3, G, K, 32) and attn["value"].shape == (3, G, 32, K)


# --- Export: import -> export is the fixture transformers wrote, tensor for tensor. ---


def export(name: str, out_dir: Path) -> Path:
  """Our export of fixture `name` (as its own model type) into `out_dir`."""
  cfg, params = _imported(name)
  model_type = json.loads((FIXTURES / name / "config.json").read_text())["model_type"]
  return formats.export_hf(cfg, params, out_dir, model_type)


@pytest.mark.parametrize("name", FAMILIES)
def test_an_export_is_the_checkpoint_transformers_wrote_and_loads_with_the_same_logits(name, tmp_path):
  export(name, tmp_path)
  theirs, ours = load_file(FIXTURES / name / "model.safetensors"), load_file(tmp_path / "model.safetensors")
  assert sorted(ours) == sorted(theirs)
  for key in theirs:
    np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
  # transformers loaded this very config.json (make_family_fixtures.py --check-exports) with our logits.
  checked = json.loads((FIXTURES / name / "export_check.json").read_text())
  assert hashlib.sha256((tmp_path / "config.json").read_bytes()).hexdigest() == checked["config_sha256"]
  assert checked["max_abs_diff"] <= 1e-4
  assert formats.import_hf(tmp_path)[0] == _imported(name)[0]


def test_export_refuses_what_a_format_cannot_hold(tmp_path):
  cfg, params = _imported("llama")
  with pytest.raises(ConfigError, match=r"llama format cannot hold this model: block.parallel=True \(llama's: False\)"):
    formats.export_hf(cfg.replace(parallel=True), params, tmp_path, "llama")
  with pytest.raises(ConfigError, match="no weight format for model_type 'gpt3'; supported: llama, mistral"):
    formats.export_hf(cfg, params, tmp_path, "gpt3")
  assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.skipif(
  not os.environ.get("TRANSFORMER_TORCH_PYTHON"),
  reason="set TRANSFORMER_TORCH_PYTHON to a python with torch + transformers",
)
@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_transformers_loads_an_export_with_the_fixtures_logits(name, tmp_path):
  export(name, tmp_path)
  checked = subprocess.run(
    [os.environ["TRANSFORMER_TORCH_PYTHON"], REPO / "tests" / "make_family_fixtures.py", "--check", tmp_path, name],
    capture_output=True,
    text=True,
    check=True,
  )
  assert json.loads(checked.stdout.splitlines()[-1])["max_abs_diff"] <= 1e-4


# --- Bad directories: one error naming the problem and what is supported. ---


def _copy(tmp_path, name="llama") -> Path:
  return Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def _edit_config(directory: Path, **changes) -> None:
  config = json.loads((directory / "config.json").read_text())
  (directory / "config.json").write_text(json.dumps({**config, **changes}))


def _shard(directory: Path) -> None:
  """The fixture's one file split into two shards with their index, as save_pretrained shards."""
  tensors = load_file(directory / "model.safetensors")
  keys = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
  for file, names in shards.items():
    save_file({k: tensors[k] for k in names}, directory / file)
  weight_map = {k: file for file, names in shards.items() for k in names}
  (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
  (directory / "model.safetensors").unlink()


def test_a_sharded_checkpoint_reads_as_one_file(tmp_path):
  directory = _copy(tmp_path)
  _shard(directory)
  cfg, params = formats.import_hf(directory)
  jax.tree.map(np.testing.assert_array_equal, params, _imported("llama")[1])


def _wrong_shape(directory: Path) -> None:
  tensors = load_file(directory / "model.safetensors")
  tensors["model.layers.1.mlp.up_proj.weight"] = np.zeros((95, 64), np.float32)
  save_file(tensors, directory / "model.safetensors")


def _extra_tensor(directory: Path) -> None:
  tensors = load_file(directory / "model.safetensors")
  save_file(
    {**tensors, "model.layers.0.self_attn.o_proj.bias": np.zeros(64, np.float32)}, directory / "model.safetensors"
  )


def _missing_tensor(directory: Path) -> None:
  tensors = load_file(directory / "model.safetensors")
  del tensors["model.layers.1.self_attn.k_proj.weight"]
  save_file(tensors, directory / "model.safetensors")


def _missing_shard(directory: Path) -> None:
  _shard(directory)
  (directory / "model-00002-of-00002.safetensors").unlink()


@pytest.mark.parametrize(
  "damage, message",
  [
    (lambda d: (d / "config.json").unlink(), "no config.json in .*: a Hugging Face model directory has one"),
    (_missing_shard, r"is missing its weights: no .*model-00002-of-00002.safetensors"),
    (_wrong_shape, r"'model.layers.1.mlp.up_proj.weight' .* has shape \(95, 64\), expected \(96, 64\)"),
    (_extra_tensor, "has a tensor a llama of this config.json does not: 'model.layers.0.self_attn.o_proj.bias'"),
    (_missing_tensor, r"is missing tensor 'model.layers.1.self_attn.k_proj.weight' \(expected shape \(32, 64\)\)"),
    (
      lambda d: _edit_config(d, model_type="falcon"),
      "model_type 'falcon' is not one we open; supported: llama, mistral",
    ),
    (
      lambda d: _edit_config(d, rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}),
      "rope type 'longrope' is not one we compute; supported: default, linear, llama3, yarn",
    ),
    (lambda d: _edit_config(d, hidden_act="relu"), "hidden_act 'relu' of a llama is not one we run; supported: silu"),
    (lambda d: _edit_config(d, mlp_bias=True), "a llama with mlp_bias=true is not one we run"),
    (
      lambda d: _edit_config(d, attention_sink_size=4),
      "a llama's config.json with attention_sink_size=4: this key is not one we read, and may change the model",
    ),
  ],
)
def test_a_bad_directory_is_one_error_naming_it(tmp_path, damage, message):
  directory = _copy(tmp_path)
  damage(directory)
  with pytest.raises(CheckpointError, match=message):
    formats.import_hf(directory)


if __name__ == "__main__":  # our export of every fixture, which make_family_fixtures.py --check-exports loads
  for name in FAMILIES:
    export(name, Path(sys.argv[1]) / name)


# --- Named points, as TransformerLens names them for these families. ---


def test_named_points_of_grouped_query_attention_and_the_parallel_block():
  cfg, params = _imported("llama")
  tokens = _reference("llama")["input_ids"][:1, :8]
  _, cache = interventions.run_with_cache(GPT(cfg), params, tokens, names=("q", "k", "v", "z"))
  L, H, G, K = cfg.num_layers, cfg.block.num_heads, cfg.block.kv_heads, cfg.block.head_dim
  assert cache["q"].shape == cache["z"].shape == (L, 1, 8, H, K)
  assert cache["k"].shape == cache["v"].shape == (L, 1, 8, G, K)  # TL's bridge: keys and values at the kv heads
  # GPT-NeoX's parallel block has no stream between attention and MLP: no resid_mid, and the MLP reads
  # resid_pre (TransformerLens's hook_mlp_in of a parallel block).
  cfg, params = _imported("gpt_neox")
  _, cache = interventions.run_with_cache(GPT(cfg), params, tokens, names=None)
  assert "resid_mid" not in cache
  np.testing.assert_array_equal(cache["mlp_in"], cache["resid_pre"])
  np.testing.assert_allclose(
    cache["resid_post"], cache["resid_pre"] + cache["attn_out"] + cache["mlp_out"], rtol=1e-5, atol=1e-5
  )


@pytest.mark.slow  # path patching's three runs and the direct patch: ~2 s of programs (GPT-2's is in the fast tier)
def test_path_patching_with_grouped_query_attention_patches_the_sender_through_every_reader():
  cfg, params = _imported("llama")
  model, tokens = GPT(cfg), _reference("llama")["input_ids"][:2, :10]
  corrupt = np.where(np.arange(10) == 3, 7, tokens)
  metric = jax.jit(lambda logits: logits[:, -1, 5].mean() - logits[:, -1, 7].mean())  # one program, not one an op
  sender, H, G = (0, 1), cfg.block.num_heads, cfg.block.kv_heads
  # Every reader downstream of L0.H1: layer 0's MLP, layer 1's queries (H heads), keys and values (G
  # kv heads each), layer 1's MLP, the output.
  every = [
    (0, "mlp"),
    *[(1, h, "q") for h in range(H)],
    *[(1, g, r) for g in range(G) for r in "kv"],
    (1, "mlp"),
    "logits",
  ]
  path = patching.path_patching(model, params, tokens, metric, sender=sender, receivers=every, source_BxT=corrupt)
  _, source = interventions.run_with_cache(model, params, corrupt, names=("z",))
  only_head = (np.arange(H) == 1)[:, None]
  direct = interventions.run_with_patches(
    model, params, tokens, patches={("z", 0): Patch.replace(source["z"][0], where=only_head)}
  )
  np.testing.assert_allclose(path, metric(direct), atol=1e-5)
  plain, _ = interventions.run_with_cache(model, params, tokens, names=())
  assert abs(float(path - metric(plain))) > 1e-4  # the sender mattered


# --- Tokenizers (tokenizer.json) and what opens a directory. ---


@pytest.mark.parametrize("name", ["smollm", "gemma"])  # the post-processor's BOS (Llama 3's); a Metaspace BPE (Gemma's)
def test_the_tokenizer_gives_auto_tokenizers_ids_and_texts(name, tmp_path):
  tokenizer = tokenizers.load_tokenizer(FIXTURES / name)
  reference = json.loads((FIXTURES / name / "tokenizer_reference.json").read_text())
  assert isinstance(tokenizer, tokenizers.HFTokenizer) and tokenizer.vocab_size == reference["vocab_size"]
  for text, ids, decoded in zip(reference["texts"], reference["ids"], reference["decoded"]):
    assert tokenizer.encode(text, allow_special=True) == ids
    assert tokenizer.decode(ids) == decoded
  assert [a.tolist() for a in tokenizer.encode_arrays(reference["texts"], allow_special=True)] == reference["ids"]
  with pytest.raises(TokenizerError, match="text contains the special token"):  # not from user text unless allowed
    tokenizer.encode(reference["texts"][1])
  assert tokenizer.encode_piece("Remove") == tokenizer.encode("Remove")[1:]  # a piece: no BOS
  again = tokenizers.load_tokenizer(tokenizer.save(tmp_path / "saved"))  # as a workdir keeps it
  assert again.encode(reference["texts"][0]) == reference["ids"][0]


def test_load_opens_a_family_with_its_tokenizer_or_on_ids_alone(tmp_path):
  trained = inference.load(hf=FIXTURES / "smollm")
  assert isinstance(trained.tokenizer, tokenizers.HFTokenizer) and trained.run.model.tie_embeddings
  assert "(llama)" in trained.source
  bare = inference.load(hf=FIXTURES / "gpt_neox")  # no tokenizer files: the model alone, on token ids
  assert bare.run.model.block.parallel
  with pytest.raises(TokenizerError, match="gpt_neox has no tokenizer.json: the model opens alone, on token ids"):
    bare.tokenizer.encode("hello")
  other = _copy(tmp_path)  # the llama fixture (128 tokens) with another model's tokenizer (320)
  for file in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(FIXTURES / "smollm" / file, other / file)
  with pytest.raises(CheckpointError, match="has 320 tokens but the model's embedding 128 rows"):
    inference.load(hf=other)


@pytest.mark.slow  # three launch programs, each its own process
def test_the_launch_programs_run_on_a_family(tmp_path):
  smollm, text = FIXTURES / "smollm", tmp_path / "text.txt"
  text.write_text("\n".join(json.loads((smollm / "tokenizer_reference.json").read_text())["texts"][:1]) * 4)
  sampled = run_module(
    "launch.sample", f"--hf={smollm}", "--prompt=Remove any", "--max_new_tokens=5", "--temperature=0"
  )
  assert sampled.stdout.strip().splitlines()[-1].startswith("Remove any")
  scored = run_module("launch.evaluate", f"--hf={smollm}", f"--input_file={text}")
  assert "bits per byte" in scored.stdout
  probed = run_module(
    "launch.probe",
    f"--hf={smollm}",
    "--path",
    "--sender=L0.H1",
    "--receivers=L1.k",
    "--target=ing",
    "--clean=Remove any common",
    "--corrupt=Remove any commit",
    f"--out={tmp_path / 'path'}",
  )
  assert (tmp_path / "path" / "path.json").exists(), probed.stdout


# --- Fine-tuning from a family's directory (experiments/hf.py) and its export back. ---


def _text_file(tmp_path) -> Path:
  """~50 KB of the standard library's docstrings: enough for a split of small pieces."""
  import argparse
  import collections
  import csv
  import inspect
  import logging

  path = tmp_path / "text.txt"
  path.write_text("\n\n".join(inspect.getdoc(m) or "" for m in (argparse, collections, logging, csv) * 8))
  return path


@pytest.mark.slow  # a training run and an export, each its own process
def test_fine_tuning_starts_from_the_family_weights_and_exports_what_it_trained(tmp_path):
  smollm, workdir = FIXTURES / "smollm", tmp_path / "run"
  flags = [f"--config.data.input_files={_text_file(tmp_path)}", "--config.data.piece_chars=2000", "--config.seq_len=32"]
  flags += ["--config.num_train_steps=2", "--config.eval_every_steps=2", "--config.checkpoint_every_steps=1"]
  flags += ["--config.sample.max_new_tokens=0", "--config.optimizer.lr=1e-9"]  # steps that barely move it
  trained = run_module("launch.train", f"--config=experiments/hf.py:{smollm}", f"--workdir={workdir}", *flags)
  assert trained.returncode == 0, trained.stderr[-2000:]
  first = inference.load(workdir=workdir, step=1)
  _, imported = _imported("smollm")
  moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), first.params, imported)
  assert max(jax.tree.leaves(moved)) < 1e-6  # the family's weights, not a fresh initialisation
  exported = run_module("launch.sample", f"--workdir={workdir}", f"--export={tmp_path / 'out'}")
  assert "(llama)" in exported.stdout, exported.stderr[-2000:]
  last = inference.load(workdir=workdir)
  again = inference.load(hf=tmp_path / "out")
  jax.tree.map(np.testing.assert_array_equal, again.params, jax.device_get(last.params))
  assert again.tokenizer.encode("Remove any") == last.tokenizer.encode("Remove any")
  hf = json.loads((tmp_path / "out" / "config.json").read_text())  # generate's start and stop: the tokenizer's
  assert (hf["bos_token_id"], hf["eos_token_id"]) == (last.tokenizer.bos_id, last.tokenizer.eot_id) == (0, 1)


def test_fine_tuning_refuses_another_model_or_tokenizer_in_one_line(tmp_path):
  from transformer import sharding, tasks
  from transformer.tasks import lm

  config = lm.hf_defaults(str(FIXTURES / "smollm"))
  config.model.block.num_kv_heads = 3
  with pytest.raises(
    ConfigError, match=r"another model than --config.model: block.num_kv_heads=3 \(the pretrained model's: 2\)"
  ):
    tasks.resolve(config)
  config = lm.hf_defaults(str(FIXTURES / "smollm"))
  config.data.tokenizer = "char"
  run = tasks.resolve(config)
  task = tasks.get("lm")(
    run, tokenizers.get_tokenizer("char", corpus=["abc"]), sharding.make_mesh(run.mesh.fitted(jax.device_count()).shape)
  )
  with pytest.raises(
    ConfigError, match="reads other tokens .* prepare the data with its tokenizer: --config.data.tokenizer="
  ):
    task.init_params({}, None)


def test_a_bfloat16_checkpoint_loads_in_bfloat16_and_computes_as_its_float32_original(tmp_path):
  import ml_dtypes

  directory = _copy(tmp_path)
  tensors = load_file(directory / "model.safetensors")
  save_file({k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}, directory / "model.safetensors")
  _edit_config(directory, dtype="bfloat16")
  cfg, params = formats.import_hf(directory)
  assert cfg.block.param_dtype == cfg.block.dtype == "bfloat16"
  assert {x.dtype for x in jax.tree.leaves(params)} == {np.dtype(ml_dtypes.bfloat16)}  # no float32 copy
  reference = _reference("llama")
  assert _largest_difference(cfg, params, reference) < 0.05  # bfloat16's rounding, not another model
  _edit_config(directory, dtype="float8_e4m3")
  with pytest.raises(CheckpointError, match="dtype 'float8_e4m3' is not one we load; supported: float32, bfloat16"):
    formats.import_hf(directory)


# transformers' num_parameters() of each published shape (built on torch's meta device from the same
# config.json fields): the shapes are those checkpoints'.
PUBLISHED = {
  "llama3-8b": 8_030_261_248,
  "llama3.2-1b": 1_235_814_400,
  "smollm2-135m": 134_515_008,
  "mistral-7b": 7_241_732_096,
  "qwen3-0.6b": 596_049_920,
  "gemma2-2b": 2_614_341_888,
  "pythia-70m": 70_426_624,
  "olmo2-1b": 1_484_916_736,
}


def test_the_published_shapes_have_their_checkpoints_parameter_counts():
  counts = {name: count_params(shapes.shape(name, scan_layers=True)) for name in shapes.SHAPES}
  assert counts == PUBLISHED  # (scanned: one block traced, its params stacked)


@pytest.mark.slow  # three more programs a family
@pytest.mark.parametrize("name", ["gemma2", "gemma3_text", "gpt_neox"])  # mixed layer kinds, local bases, parallel
def test_scanned_rematerialised_and_last_only_forms_compute_the_same_logits(name):
  cfg, params = _imported(name)
  reference = _reference(name)
  scanned_cfg, scanned = formats.import_hf(FIXTURES / name, scan_layers=True)
  assert _largest_difference(scanned_cfg, scanned, reference) <= 1e-4  # local and global layers in one scan
  assert _largest_difference(cfg.replace(remat_policy="full"), params, reference) <= 1e-4
  row = reference["input_ids"][:1]
  last = compiled_apply(GPT(cfg), {"params": params}, row, last_only=True)
  np.testing.assert_allclose(last[0, -1], reference["logits"][0, -1], atol=1e-4)
  prompts = [r[m == 1].tolist() for r, m in zip(reference["prompt_ids"], reference["prompt_mask"])]
  greedy = sampling.generate(GPT(scanned_cfg), scanned, prompts, max_new_tokens=40, sampling=sampling.Sampling(0.0))
  assert greedy == reference["generated"].tolist()  # the scanned cache


@pytest.mark.parametrize("name", ["smollm", "gemma2"])  # grouped-query; local/global layers, soft-caps, pre+post norms
def test_the_named_points_equal_transformer_lens_bridge(name):
  """TransformerLens 4.3's TransformerBridge on the fixture's directory (tests/make_lens_family_fixtures.py):
  the residual stream, the branches' outputs, the pattern, q, k, v (at the kv heads) and z, every layer."""
  cfg, params = _imported(name)
  lens = np.load(FIXTURES / name / "lens.npz")
  names = tuple(k for k in lens.files if k not in ("input_ids", "logits"))
  assert set(names) == {"resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "pattern", "q", "k", "v", "z"}
  logits, cache = interventions.run_with_cache(GPT(cfg), params, lens["input_ids"], names=names)
  np.testing.assert_allclose(logits, lens["logits"], atol=1e-4)
  for point in names:
    np.testing.assert_allclose(cache[point], lens[point], atol=1e-4, err_msg=point)


@pytest.mark.slow  # a planning process on 8 fake devices
def test_a_family_plans_on_a_mesh_with_its_kv_heads_split_over_the_tensor_axis(tmp_path):
  """The mesh's rules shard the new params (q, kv, the kv heads over `tensor`): the training step and the
  sampler compile on fsdp 4 x tensor 2 (SmolLM2's fixture: 6 heads, 2 kv heads)."""
  proc = run_module(
    "launch.plan",
    f"--config=experiments/hf.py:{FIXTURES / 'smollm'}",
    "--devices=8",
    "--config.mesh.data=1",
    "--config.mesh.fsdp=4",
    "--config.mesh.tensor=2",
    "--config.batch_size=8",
    "--config.seq_len=64",
    f"--config.data.root={tmp_path}",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "train step: batch 8 on 8 devices (data 1 × fsdp 4 × tensor 2)" in proc.stdout
  assert "decode: batch 4 on 8 devices" in proc.stdout


def test_interleaved_rotary_is_the_halves_layout_on_paired_channels():
  """GPT-J's layout (channels 2i and 2i + 1 turn together) is Llama's (i and i + R/2) on the channels
  reordered so that the pairs line up; partial rotary leaves the rest of each head as it is."""
  x = np.random.default_rng(0).standard_normal((2, 5, 3, 8)).astype(np.float32)
  positions = np.arange(5)[None].repeat(2, 0)
  config = layers.RotaryConfig(theta=500.0, fraction=0.5)  # 4 of 8 channels rotated
  frequencies = layers.rotary_frequencies(config, 8)
  turn = jax.jit(
    lambda x, layout: layers.rotary(x, positions, frequencies=frequencies, layout=layout), static_argnums=1
  )
  interleaved = np.asarray(turn(x, "interleaved"))
  order = np.array([0, 2, 1, 3, 4, 5, 6, 7])  # the rotated 4 as (0, 2 | 1, 3): pairs (0, 1) and (2, 3)
  halves = np.asarray(turn(x[..., order], "halves"))
  np.testing.assert_allclose(interleaved[..., order], halves, atol=1e-6)
  np.testing.assert_array_equal(interleaved[..., 4:], x[..., 4:])
  assert not np.allclose(interleaved[..., :4], x[..., :4])


@pytest.mark.slow  # a launch program's process
def test_a_directory_of_a_model_type_we_lack_ends_a_launch_program_with_one_error_line(tmp_path):
  directory = _copy(tmp_path)
  _edit_config(directory, model_type="falcon")
  proc = run_module("launch.sample", f"--hf={directory}", "--prompt=hello")
  assert proc.returncode == 1
  [line] = proc.stderr.strip().splitlines()[-1:]
  assert line.startswith("error: ") and "model_type 'falcon' is not one we open; supported: gpt2, marian, llama" in line
