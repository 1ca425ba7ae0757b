"""Config resolution (transformer.config): every experiment resolves into typed, frozen pieces and
back; every bad value fails before anything is built, naming the --config. flag; derived values are
computed once."""

import dataclasses
import json
from pathlib import Path

import ml_collections
import pytest

from experiments import english, gpt2, grokking, induction, pos, sae, sentiment, shakespeare, translation
from transformer import config, tasks, workdir
from transformer.errors import ConfigError
from transformer.tasks import resolve
from transformer.tasks.lm import LMConfig

# sentiment:gpt_finetune reads the main job's run, and the gpt_english presets the English GPT's,
# which a fresh clone has not made (below; test_labelled.py runs them on a tiny pretraining run).
PRESETS = [
  (m, p)
  for m in (shakespeare, gpt2, translation, sentiment, pos, english, induction, grokking)
  for p in m.PRESETS
  if (m, p) != (sentiment, "gpt_finetune") and p not in english.LABELLED_PRESETS
] + [(sae, "synthetic"), (sae, "tiny")]  # char and english read trained runs


@pytest.mark.parametrize("module,preset", PRESETS)
def test_every_experiment_resolves_and_round_trips(module, preset):
  c = module.get_config(preset)
  run = resolve(c)
  assert run.task == c.task and run.loop.num_train_steps == c.num_train_steps
  assert run.optimizer.lr == c.optimizer.lr and run.model.family == c.model.family
  with pytest.raises(dataclasses.FrozenInstanceError):
    run.loop.seed = 1
  # config.json holds to_config_dict(run): resolving it again gives the same run.
  assert resolve(ml_collections.ConfigDict(config.to_config_dict(run).to_dict())) == run


def test_a_preset_whose_pretrained_run_is_missing_says_so(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ConfigError, match="--config.run='workdirs/shakespeare-char' is not a training workdir"):
    resolve(sae.get_config("char"))
  with pytest.raises(
    ConfigError,
    match="tokenizer 'workdirs/shakespeare-char/tokenizer' is neither one of gpt2, .* "
    "nor a directory holding a saved tokenizer",
  ):
    resolve(sentiment.get_config("gpt_finetune"))


@pytest.mark.parametrize(
  "labelled,pretraining",
  [
    (sentiment.get_config("gpt_finetune"), shakespeare.get_config("char")),
    *[(m.get_config(p), english.get_config("gpt")) for m in (sentiment, pos) for p in english.LABELLED_PRESETS],
  ],
)
def test_a_fine_tuning_preset_has_its_pretraining_runs_model(labelled, pretraining):
  """init_from loads the body tensor by tensor: a preset whose model drifted from the run it starts
  from (as `gpt_finetune` once did when the main job changed) would be refused when it is run."""
  body = labelled.model.to_dict()
  body["block"]["dropout_rate"] = pretraining.model.block.dropout_rate  # fine-tuning's own regulariser
  assert body == pretraining.model.to_dict()


def test_the_model_family_picks_the_model_config():
  assert resolve(sentiment.get_config("lstm")).model.bidirectional is False
  assert type(resolve(pos.get_config("encoder")).model).__name__ == "EncoderConfig"
  c = shakespeare.get_config("char")
  c.model.family = "lstm"  # the GPT preset's fields are not an LSTM's
  with pytest.raises(
    ConfigError,
    match=r"--config.model.block.activation is not a field .* \(config.model.family=.lstm.: "
    "config.model must hold that family's fields",
  ):
    resolve(c)
  saved = resolve(shakespeare.get_config("char"))
  assert config.resume_changes(saved, resolve(shakespeare.get_config("lstm")))[0] == [
    "model.family=lstm (the run's: gpt)"
  ]


def test_defaults_are_the_typed_fields_defaults():
  c = tasks.defaults("lm")
  assert c.seq_len == LMConfig.seq_len and c.data.sampling == "windows" and c.sample.temperature == 0.8
  assert c.optimizer.b2 == config.OptimizerConfig.b2 and c.mesh.data == -1
  assert "batch_tokens" in tasks.defaults("translation") and "batch_tokens" not in c


def test_derived_mesh_shape_and_data_parallel_size():
  c = shakespeare.get_config("tiny")
  c.mesh.fsdp, c.mesh.tensor = 2, 2
  run = resolve(c, num_devices=8)
  assert run.mesh.shape == (2, 2, 2) and run.mesh.data_parallel == 4  # batch splits over data x fsdp
  assert resolve(c).mesh.shape == ()  # without devices nothing is derived


def test_model_vocabulary_from_the_tokenizer():
  run = resolve(shakespeare.get_config("tiny"))
  assert run.model.vocab_size == 0 and run.model_config(85).vocab_size == 85
  padded = dataclasses.replace(run, model=run.model.replace(vocab_size=96))
  assert padded.model_config(85).vocab_size == 96
  with pytest.raises(ConfigError, match="--config.model.vocab_size=96 is smaller than the tokenizer's 100"):
    padded.model_config(100)


def _set(c, key, value):
  *sections, name = key.split(".")
  for s in sections:
    c = c[s]
  c[name] = value


@pytest.mark.parametrize(
  "key,value,message",
  [
    ("num_train_steps", 0, "--config.num_train_steps must be positive, got 0"),
    ("keep_checkpoints", 0, "--config.keep_checkpoints must be positive"),
    ("optimizer.schedule", "step", "--config.optimizer.schedule='step' is unknown; choose one of cosine"),
    ("optimizer.lr", -1.0, "--config.optimizer.lr must be positive"),
    ("optimizer.b2", 1.0, r"--config.optimizer.b2 must be in \[0, 1\)"),
    ("optimizer.accumulation_steps", 0, "--config.optimizer.accumulation_steps must be positive"),
    ("data.validation_fraction", 1.5, r"--config.data: validation_fraction must be in \[0, 1\)"),
    ("model.block.num_heads", 3, "--config.model: block.d_model=64 is not divisible by block.num_heads=3"),
    ("model.block.attention", "flash", "--config.model: unknown block.attention implementation 'flash'"),
    ("data.sampling", "random", "--config.data.sampling='random' is unknown; choose one of windows, packed"),
    ("sample.temperature", -1.0, "temperature must be >= 0"),
    ("batch_size", 6, "--config.batch_size=6 is not divisible by --config.optimizer.accumulation_steps=4"),
  ],
)
def test_bad_values_name_their_flag(key, value, message):
  c = shakespeare.get_config("tiny")
  c.optimizer.accumulation_steps = 4 if key == "batch_size" else 1
  _set(c, key, value)
  with pytest.raises(ConfigError, match=message):
    resolve(c, num_devices=1)


def test_unknown_fields_and_wrong_types_are_refused():
  c = shakespeare.get_config("tiny")
  c.optimizer.lrr = 0.1  # a typo would otherwise be silently ignored
  with pytest.raises(
    ConfigError,
    match="--config.optimizer.lrr is not a field .* the fields of config.optimizer are accumulation_steps, b1, b2",
  ):
    resolve(c)
  c = translation.get_config("tiny")
  c.sample = ml_collections.ConfigDict({"prompt": "x"})  # a field of another task
  with pytest.raises(ConfigError, match="--config.sample.prompt is not a field"):
    resolve(c)
  d = shakespeare.get_config("tiny").to_dict()
  d["num_train_steps"] = "ten"  # e.g. a hand-edited config.json
  with pytest.raises(ConfigError, match="--config.num_train_steps='ten' is not a int"):
    resolve(ml_collections.ConfigDict(d))


def test_mesh_that_does_not_fit_the_devices():
  c = shakespeare.get_config("tiny")
  c.mesh.data = 3
  with pytest.raises(ConfigError, match="needs 3 devices but 1 are available"):
    resolve(c, num_devices=1)
  assert resolve(c).mesh.data == 3  # restoring elsewhere does not check the devices


def test_resume_changes_split_what_may_change_from_what_may_not():
  saved = resolve(shakespeare.get_config("tiny"))
  c = shakespeare.get_config("tiny")
  c.num_train_steps, c.optimizer.lr, c.mesh.fsdp, c.sample.temperature = 99, 1e-4, 2, 0.5
  c.data.root = "elsewhere"  # where the data is prepared; its content is checked by sha256
  fixed, allowed = config.resume_changes(saved, resolve(c))
  assert fixed == []
  assert allowed == [
    "num_train_steps=99 (the run's: 40)",
    "optimizer.lr=0.0001 (the run's: 0.001)",
    "mesh.fsdp=2 (the run's: 1)",
    "data.root='elsewhere' (the run's: 'data')",
    "sample.temperature=0.5 (the run's: 0.8)",
  ]
  c.seed, c.model.block.d_model, c.data.tokenizer, c.seq_len = 1, 96, "gpt2", 32
  fixed, _ = config.resume_changes(saved, resolve(c))
  assert fixed == [
    "seed=1 (the run's: 0)",
    "data.tokenizer='gpt2' (the run's: 'char')",
    "model.block.d_model=96 (the run's: 64)",
    "seq_len=32 (the run's: 64)",
  ]
  assert config.resume_changes(saved, resolve(translation.get_config("tiny")))[0] == [
    "task=translation (the run's: lm)"
  ]


def test_nonfinite_policy_is_checked():
  c = shakespeare.get_config("tiny")
  c.on_nonfinite = "ignore"
  with pytest.raises(ConfigError, match=r"--config.on_nonfinite='ignore' is unknown; choose one of stop, skip"):
    resolve(c)


# config.json files an earlier version wrote (tests/fixtures/configs_before_block: the experiments'
# configs as of 2026-11-25, when each model config held its block's fields flat and a GPT's or an
# LSTM's longest sequence was `context_length`).
BEFORE_BLOCK = Path(__file__).parent / "fixtures" / "configs_before_block"


@pytest.mark.parametrize(
  "name,model,block",
  [
    (
      "translation_tiny",
      {"max_len": 32, "num_layers": 2, "share_embeddings": True},
      {
        "d_model": 64,
        "num_heads": 2,
        "d_mlp": 128,
        "layer_norm_epsilon": 1e-6,
        "pre_layer_norm": False,
        "activation": "relu",
        "kernel_init": "xavier",
      },
    ),
    (
      "sentiment_encoder",
      {"max_len": 64, "num_layers": 2},
      {"d_model": 128, "num_heads": 4, "d_mlp": 512, "dropout_rate": 0.3, "pre_layer_norm": True, "activation": "relu"},
    ),
    (
      "sentiment_gpt",
      {"max_len": 128, "num_layers": 4},
      {
        "d_model": 128,
        "num_heads": 4,
        "d_mlp": 0,
        "dropout_rate": 0.1,
        "activation": "gelu_tanh",
        "kernel_init": "gpt2",
      },
    ),
    ("sentiment_lstm", {"max_len": 1024, "num_layers": 1, "d_model": 256, "dropout_rate": 0.3}, None),
  ],
)
def test_configs_written_before_the_block_was_nested_resolve_to_the_same_model(name, model, block):
  saved = json.loads((BEFORE_BLOCK / f"{name}.json").read_text())
  assert "block" not in saved["model"]  # the old layout, flat
  run = resolve(ml_collections.ConfigDict(workdir.upgraded_config(saved)))
  assert {k: getattr(run.model, k) for k in model} == model
  if block is not None:
    assert {k: getattr(run.model.block, k) for k in block} == block
  # Written again, it is the new layout, which resolves to the same run.
  assert resolve(ml_collections.ConfigDict(config.to_config_dict(run).to_dict())) == run
  # Only what config.json holds is upgraded: the old names on a command line are refused, named.
  c = ml_collections.ConfigDict(saved)
  with pytest.raises(ConfigError, match="is not a field of this task's config"):
    resolve(c)


def test_an_sae_config_written_with_the_keys_it_no_longer_has_resolves_to_the_same_run():
  """An SAE's config.json once held model.vocab_size (unused) and model.layers (a cross-layer transcoder's span,
  taken from the model it reads): read back, they are dropped, and the run is the one written today."""
  run = resolve(sae.get_config("synthetic"))
  saved = config.to_config_dict(run).to_dict()
  assert "vocab_size" not in saved["model"] and "layers" not in saved["model"]
  old = {**saved, "model": {**saved["model"], "vocab_size": 0, "layers": 0}}
  assert resolve(ml_collections.ConfigDict(workdir.upgraded_config(old))) == run
  with pytest.raises(ConfigError, match="is not a field of this task's config"):
    resolve(ml_collections.ConfigDict(old))
