"""Marian (Hugging Face MarianMTModel) weights in our encoder-decoder, against golden fixtures that
transformers made (tests/make_marian_fixtures.py; tests/fixtures/marian_tiny)."""

import hashlib
import json
import shutil
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from transformer import data, inference, metrics, tasks, tokenizers
from transformer.errors import CheckpointError, ConfigError, TokenizerError
from transformer.generation import beam_search
from transformer.models.formats.marian import export_hf_marian, import_hf_marian
from transformer.models.seq2seq import Transformer
from transformer.tasks.translation import Translation
from transformer.tokenizers import load_tokenizer

from conftest import REPO, run_cases, run_module

FIXTURE = REPO / "tests" / "fixtures" / "marian_tiny"


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_imported_logits_equal_hugging_faces(kernels):
  """Teacher-forced logits of a padded batch (sources of different lengths): transformers' own, to 1e-4."""
  cfg, params = import_hf_marian(FIXTURE)
  assert (cfg.num_layers, cfg.decoder_layers(), cfg.block.num_heads, cfg.block.d_mlp) == (2, 3, 4, 80)
  assert (cfg.sinusoids, cfg.scale_embeddings, cfg.logits_bias, cfg.block.activation) == ("halves", True, True, "swish")
  reference = np.load(FIXTURE / "reference.npz")
  assert not reference["attention_mask"].all()  # the batch has padding
  logits = _teacher_forced(cfg.replace(kernels=kernels), params, reference)
  np.testing.assert_allclose(logits, reference["logits"], atol=1e-4)


def _teacher_forced(cfg, params, reference) -> np.ndarray:
  """The logits of the fixture's batch, compiled as one program (not op by op)."""
  logits = jax.jit(Transformer(cfg).apply)(
    {"params": params},
    jnp.asarray(reference["input_ids"]),
    jnp.asarray(reference["decoder_input_ids"]),
    source_valid_BxS=jnp.asarray(reference["attention_mask"] == 1),
  )
  return np.asarray(logits)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_greedy_and_beam_translations_equal_hugging_faces(beam_size):
  """`generate(num_beams=1)` and `generate(num_beams=4, length_penalty=1.0)` of transformers, token for
  token: the decoder starting from <pad>, ending at </s>, beams scored as Hugging Face scores them
  (penalty="hf": log-probability / length; GNMT's penalty picks other beams on this fixture)."""
  cfg, params = import_hf_marian(FIXTURE)
  hf = json.loads((FIXTURE / "config.json").read_text())
  reference = np.load(FIXTURE / "reference.npz")
  theirs = json.loads((FIXTURE / "reference.json").read_text())["greedy" if beam_size == 1 else "beam4"]
  sources = [row[mask == 1].tolist() for row, mask in zip(reference["input_ids"], reference["attention_mask"])]
  translate = lambda penalty: beam_search.translate_ids(
    Transformer(cfg),
    params,
    sources,
    bos_id=hf["decoder_start_token_id"],
    eos_id=hf["eos_token_id"],
    beam_size=beam_size,
    alpha=1.0,
    penalty=penalty,
    max_len=24,
  )
  expected = [row[1 : row.index(hf["eos_token_id"])] for row in theirs]  # after the start, before </s>
  assert translate("hf") == expected
  if beam_size > 1:
    assert translate("gnmt") != expected


def _copy(tmp_path):
  directory = tmp_path / "marian"
  shutil.copytree(FIXTURE, directory)
  return directory


def _edit_config(directory, **changes):
  path = directory / "config.json"
  path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _edit_tensors(directory, edit):
  tensors = load_file(directory / "model.safetensors")
  edit(tensors)
  save_file(tensors, directory / "model.safetensors")


@pytest.mark.parametrize(
  "damage,message",
  [
    (lambda d: (d / "config.json").unlink(), "has no config.json: give a Marian model's directory"),
    (lambda d: _edit_config(d, model_type="bart"), "is not a Marian config (model_type 'bart', not 'marian')"),
    (
      lambda d: _edit_config(d, decoder_attention_heads=8),
      "encoder_attention_heads=4 and decoder_attention_heads=8 differ; our encoder and decoder blocks share their heads",
    ),
    (lambda d: _edit_config(d, share_encoder_decoder_embeddings=False), "separate source and target vocabularies"),
    (lambda d: _edit_config(d, activation_function="tanh"), "activation_function 'tanh' is not one of ours"),
    (
      lambda d: _edit_tensors(d, lambda t: t.pop("model.decoder.layers.2.fc1.weight")),
      "is missing tensor 'model.decoder.layers.2.fc1.weight' (expected shape (80, 48))",
    ),
    (
      lambda d: _edit_tensors(d, lambda t: t.update({"model.encoder.layers.0.fc1.bias": np.zeros(81, np.float32)})),
      "tensor 'model.encoder.layers.0.fc1.bias' in",
    ),
    (
      lambda d: _edit_tensors(d, lambda t: t.update({"model.encoder.layers.2.fc1.bias": np.zeros(80, np.float32)})),
      "has a tensor a Marian of this config.json does not: 'model.encoder.layers.2.fc1.bias'",
    ),
    (
      lambda d: _edit_tensors(d, lambda t: t.update({"lm_head.weight": t["model.shared.weight"] + 1})),
      "lm_head.weight differs from the shared embedding; ours ties them",
    ),
  ],
)
def test_a_bad_marian_directory_is_one_error_naming_it(tmp_path, damage, message):
  directory = _copy(tmp_path)
  damage(directory)
  with pytest.raises(CheckpointError) as e:
    import_hf_marian(directory)
  assert message in str(e.value)


# --- The tokenizer pair. ---


def test_the_tokenizer_pair_gives_transformers_ids_and_texts(tmp_path):
  """Sources (ending in </s>) and targets encode to MarianTokenizer's ids, and decode to its texts, on 60
  Ding sentences and texts where tokenizers part ways (tokenizer_reference.json); the sentences round-trip."""
  tokenizer = load_tokenizer(FIXTURE)
  reference = json.loads((FIXTURE / "tokenizer_reference.json").read_text(encoding="utf-8"))
  assert (tokenizer.name, tokenizer.vocab_size, tokenizer.eot_id, tokenizer.decoder_start_id) == ("marian", 483, 0, 482)
  for (source, target), source_ids, target_ids, decoded in zip(
    reference["pairs"], reference["source_ids"], reference["target_ids"], reference["decoded_targets"]
  ):
    assert tokenizer.encode(source) == source_ids, source
    assert tokenizer.encode_target(target) + [tokenizer.eot_id] == target_ids, target  # the pipeline adds </s>
    assert tokenizer.decode(target_ids) == decoded
  # transformers decodes with the source model by default (one vocab.json): the same texts here.
  assert reference["decoded_targets_default"] == reference["decoded_targets"]
  for ids, decoded in zip(reference["translations"], reference["decoded_translations"]):
    assert tokenizer.decode(ids) == decoded  # <pad> and </s> left out
  # decode(encode(x)) == x for every Ding sentence; the odd texts come back as SentencePiece's NFKC
  # normalisation, its unknown characters and the >>xx<< code leave them (as in transformers).
  sentences = [target for target, _ in reference["pairs"][:60]]
  assert [tokenizer.decode(tokenizer.encode_target(s)) for s in sentences] == sentences
  assert tokenizer.decode(tokenizer.encode_target("ﬁnden")) == "finden"
  # Saved with a run and loaded back: the same tokenizer, its files checked.
  saved = tokenizer.save(tmp_path / "tokenizer")
  assert tokenizers.identical(tokenizer, load_tokenizer(saved))
  (saved / "vocab.json").write_text((saved / "vocab.json").read_text().replace('"x"', '"y"'))
  with pytest.raises(TokenizerError, match="is not the file .* records: the saved tokenizer was modified"):
    load_tokenizer(saved)


def test_the_tokenizer_pair_refuses_special_tokens_in_text_and_bad_directories(tmp_path):
  tokenizer = load_tokenizer(FIXTURE)
  with pytest.raises(TokenizerError, match="contains the special token '</s>'"):
    tokenizer.encode_target("Ende </s>")
  directory = _copy(tmp_path)
  (directory / "target.spm").unlink()
  with pytest.raises(TokenizerError, match=r"has no target\.spm: a Marian tokenizer is its model directory's"):
    load_tokenizer(directory)
  (directory / "target.spm").write_bytes(b"not a model")
  with pytest.raises(TokenizerError, match=r"a \.spm file is not a SentencePiece model"):
    load_tokenizer(directory)


def test_banned_tokens_never_appear_in_greedy_or_beam_translations():
  """Marian's <pad> is its decoder's start and never generated (transformers' bad_words_ids): here a
  token the fixture's translations do use is banned instead, and is then absent."""
  cfg, params = import_hf_marian(FIXTURE)
  reference = np.load(FIXTURE / "reference.npz")
  sources = [row[mask == 1].tolist() for row, mask in zip(reference["input_ids"], reference["attention_mask"])]
  for beam_size in (1, 4):
    # Unbanned, the very searches the test above compiled (alpha 1, GNMT's penalty, 24 tokens): one new program each.
    translate = lambda banned: beam_search.translate_ids(
      Transformer(cfg),
      params,
      sources,
      bos_id=482,
      eos_id=0,
      beam_size=beam_size,
      alpha=1.0,
      penalty="gnmt",
      max_len=24,
      banned_ids=banned,
    )
    used = {t for row in translate(()) for t in row}
    assert 2 in used and not any(2 in row for row in translate((2,)))


# --- Export: ours -> MarianMTModel. The export that tests/make_marian_fixtures.py --check loaded with
# transformers is the fixture's model with every tensor moved by seeded noise (so that no tensor is the
# one imported), written by export_hf_marian; export_check.json holds what transformers made of it. ---


def perturbed_export(out_dir) -> tuple:
  """(config, params) of the fixture moved by seeded noise, exported to `out_dir` with our logits on
  the fixture's batch beside it (our_logits.npy, which the check compares with transformers')."""
  cfg, params = import_hf_marian(FIXTURE)
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: x + np.float32(0.01) * rng.standard_normal(x.shape, np.float32), params)
  export_hf_marian(cfg, params, load_tokenizer(FIXTURE), out_dir)
  reference = np.load(FIXTURE / "reference.npz")
  np.save(Path(out_dir) / "our_logits.npy", _teacher_forced(cfg, params, reference))
  return cfg, params


def test_an_export_is_the_one_transformers_loaded_with_our_logits_and_translations(tmp_path):
  cfg, params = perturbed_export(tmp_path)
  checked = json.loads((FIXTURE / "export_check.json").read_text())
  # What transformers made of it: our logits (to 1e-4), the tokenizer's ids, and its translations.
  assert checked["max_abs_diff"] <= 1e-4
  assert checked["tokenizer_sources_equal"] and checked["tokenizer_targets_equal"]
  sha = lambda b: hashlib.sha256(b).hexdigest()
  # ... of this very export: every tensor and the config, byte for byte.
  tensors = load_file(tmp_path / "model.safetensors")
  assert {k: sha(v.tobytes()) for k, v in sorted(tensors.items())} == checked["tensors_sha256"]
  assert sha((tmp_path / "config.json").read_bytes()) == checked["config_sha256"]
  # Every file as readable as the others (safetensors alone would write its file 0600).
  assert {p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {(tmp_path / "config.json").stat().st_mode & 0o777}
  # Our translations of the exported model are transformers' generate() under the export's own
  # generation_config.json (the <pad> start, </s>, <pad> banned), greedy and with 4 beams.
  reference = np.load(FIXTURE / "reference.npz")
  sources = [row[mask == 1].tolist() for row, mask in zip(reference["input_ids"], reference["attention_mask"])]
  exported = inference.import_marian(tmp_path)
  for beam_size, theirs in ((1, checked["greedy"]), (4, checked["beam4"])):
    assert all(len(row) < 32 and row[-1] == 0 for row in theirs)  # each ended by itself, before the limit
    ours = inference.translate(exported, sources, beam_size=beam_size, max_len=32)
    assert ours == [exported.tokenizer.decode(row) for row in theirs]
  # And our own import gives back what was exported.
  again_cfg, again = import_hf_marian(tmp_path)
  assert again_cfg == cfg
  jax.tree.map(np.testing.assert_array_equal, again, params)


def test_export_refuses_what_marians_format_cannot_hold(tmp_path):
  cfg, params = import_hf_marian(FIXTURE)
  tokenizer = load_tokenizer(FIXTURE)
  with pytest.raises(ConfigError, match=r"block.pre_layer_norm=True \(Marian's: False\); sinusoids='interleaved'"):
    export_hf_marian(cfg.replace(pre_layer_norm=True, sinusoids="interleaved"), params, tokenizer, tmp_path)
  with pytest.raises(ConfigError, match="logits_bias=False"):
    export_hf_marian(cfg.replace(logits_bias=False), params, tokenizer, tmp_path)
  with pytest.raises(ConfigError, match="MarianTokenizer reads SentencePiece pairs"):
    export_hf_marian(cfg, params, tokenizers.get_tokenizer("gpt2"), tmp_path)
  assert not list(tmp_path.iterdir())  # nothing written


def _drop_a_piece(directory) -> None:
  """vocab.json without the piece "x", the rest numbered 0..481: a vocabulary of another model."""
  vocab = json.loads((directory / "vocab.json").read_text())
  del vocab["x"]
  (directory / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(sorted(vocab, key=vocab.get))}))


def test_a_vocabulary_that_disagrees_with_the_embedding_is_one_error(tmp_path):
  directory = _copy(tmp_path)
  _drop_a_piece(directory)
  with pytest.raises(CheckpointError, match="vocab.json has 482 pieces but the model's embedding 483 rows"):
    inference.import_marian(directory)
  (directory / "source.spm").unlink()
  with pytest.raises(TokenizerError, match=r"has no source\.spm"):
    inference.import_marian(directory)


if __name__ == "__main__":  # the export that make_marian_fixtures.py --check loads
  perturbed_export(sys.argv[1])


# --- Fine-tuning: a Marian directory through the ordinary training loop. ---


def _pairs_tsv(path) -> Path:
  """60 Ding pairs (German<TAB>English: the fixture model's direction), from tokenizer_reference.json."""
  pairs = json.loads((FIXTURE / "tokenizer_reference.json").read_text(encoding="utf-8"))["pairs"][:60]
  path.write_text("".join(f"{de}\t{en}\n" for de, en in pairs), encoding="utf-8")
  return path


def test_fine_tuning_starts_from_the_marian_weights_and_refuses_another_model_or_tokenizer(tmp_path):
  from experiments import translation as experiment

  config = experiment.get_config(f"marian={FIXTURE}")
  run, task, _, _ = inference._on_this_machine(tasks.resolve(config), load_tokenizer(FIXTURE))
  # Shapes only (nothing compiled): every parameter comes from the Marian directory, as the check below says.
  fresh = nn.unbox(jax.eval_shape(task.model.init, jax.random.key(0), *task.init_inputs())["params"])
  _, imported = import_hf_marian(FIXTURE)
  jax.tree.map(np.testing.assert_array_equal, task.init_params(fresh, None), imported)
  assert (run.model.block.pre_layer_norm, run.model.sinusoids, run.task_config.eval.length_penalty) == (
    False,
    "halves",
    "hf",
  )

  config.model.block.pre_layer_norm = True
  with pytest.raises(ConfigError, match=r"is another model than --config.model: block.pre_layer_norm=True"):
    tasks.resolve(config)
  # A run restored where the directory is not resolves (its checkpoints hold the weights); a new run fails.
  moved = config.copy_and_resolve_references()
  moved.init_from = str(tmp_path / "moved")
  _, task, _, _ = inference._on_this_machine(tasks.resolve(moved), load_tokenizer(FIXTURE))
  with pytest.raises(ConfigError, match=r"init_from=.*moved is not a Marian model's directory"):
    task.init_params(fresh, None)
  config.model.block.pre_layer_norm = False
  chars = tokenizers.get_tokenizer("char", corpus=["Ich habe keine Zeit."])
  _, task, _, _ = inference._on_this_machine(tasks.resolve(config), chars)
  with pytest.raises(ConfigError, match=r"reads other tokens .* --config.data.tokenizer="):
    task.init_params(fresh, None)
  config.data.input_files = (str(_pairs_tsv(tmp_path / "pairs.tsv")),)
  config.data.direction = "target-source"
  run = tasks.resolve(config)
  with pytest.raises(ConfigError, match="a Marian tokenizer pair encodes the first column with its source model"):
    Translation.check_source(run, data.source_of(run.data, "pairs"))


@pytest.mark.slow
def test_fine_tuning_through_launch_train_resumes_exactly_and_exports_what_it_trained(tmp_path):
  """A few steps on a TSV from the fixture (`experiments/translation.py:marian=DIR`), straight and
  stopped halfway then resumed: the same losses and params, bit for bit. The run exports
  (launch.translate --export) as a Marian directory that imports to its params and translates as it
  does, and launch.evaluate --hf scores it."""
  tsv = _pairs_tsv(tmp_path / "pairs.tsv")
  common = [
    f"--config=experiments/translation.py:marian={FIXTURE}",
    f"--config.data.input_files={tsv}",
    f"--config.data.root={tmp_path / 'data'}",
    "--config.data.max_len=48",
    "--config.batch_tokens=256",
    "--config.optimizer.lr=1e-3",
    "--config.optimizer.warmup_steps=2",
    "--config.eval_every_steps=3",
    "--config.checkpoint_every_steps=3",
    "--config.eval.bleu_sentences=4",
    "--config.log_every_steps=1",
  ]
  train = lambda workdir, steps: run_module(
    "launch.train", *common, f"--config.num_train_steps={steps}", f"--workdir={workdir}"
  )
  for workdir, steps in ((tmp_path / "straight", 6), (tmp_path / "resumed", 3), (tmp_path / "resumed", 6)):
    proc = train(workdir, steps)
    assert proc.returncode == 0, proc.stderr[-3000:]
  assert "resumed from" in proc.stdout
  losses = [
    metrics.last_per_step(metrics.read_jsonl(tmp_path / name / "metrics.jsonl"), "loss")
    for name in ("straight", "resumed")
  ]
  assert losses[0] == losses[1] and len(losses[0]) == 6
  straight, resumed = (inference.restore(tmp_path / name) for name in ("straight", "resumed"))
  jax.tree.map(np.testing.assert_array_equal, straight.params, resumed.params)
  _, imported = import_hf_marian(FIXTURE)
  assert not np.array_equal(straight.params["final_logits_bias"], imported["final_logits_bias"])  # it trained

  exported = tmp_path / "exported"
  proc = run_module("launch.translate", f"--workdir={tmp_path / 'straight'}", f"--export={exported}")
  assert proc.returncode == 0 and "MarianMTModel.from_pretrained" in proc.stdout, proc.stderr[-3000:]
  jax.tree.map(np.testing.assert_allclose, import_hf_marian(exported)[1], jax.device_get(straight.params))
  sentence = ["--sentence=Ich habe nichts Besseres gefunden.", "--beam_size=4"]
  results = run_cases(
    "launch.translate",
    [{"args": [f"--workdir={tmp_path / 'straight'}", *sentence]}, {"args": [f"--hf={exported}", *sentence]}],
    tmp_path,
  )
  assert results[0]["status"] == results[1]["status"] == 0 and results[0]["stdout"] == results[1]["stdout"]
  [scored] = run_cases("launch.evaluate", [{"args": [f"--hf={exported}", f"--input_file={tsv}"]}], tmp_path)
  assert scored["status"] == 0 and "BLEU" in scored["stdout"] and "hf length penalty, alpha 1.0" in scored["stdout"]


@pytest.mark.slow
def test_bad_marian_directories_end_the_launch_programs_with_one_error_line(tmp_path):
  """A missing .spm, a vocab.json that disagrees with the embedding, a config.json of another model:
  launch.translate, launch.evaluate and launch.probe each end with one `error:` line naming it."""
  damaged = {}
  for name, damage in {
    "no_spm": lambda d: (d / "source.spm").unlink(),
    "short_vocab": _drop_a_piece,
    "bart": lambda d: _edit_config(d, model_type="bart"),
  }.items():
    directory = shutil.copytree(FIXTURE, tmp_path / name)
    damage(directory)
    damaged[name] = directory
  expected = {
    "no_spm": "has no source.spm",
    "short_vocab": "pieces but the model's embedding 483 rows",
    "bart": "is not a Marian config (model_type 'bart'",
  }
  tsv = _pairs_tsv(tmp_path / "pairs.tsv")
  programs = {
    "launch.translate": lambda d: [f"--hf={d}", "--sentence=Guten Morgen."],
    "launch.evaluate": lambda d: [f"--hf={d}", f"--input_file={tsv}"],
    "launch.probe": lambda d: [f"--hf={d}", "--text=Guten Morgen.", f"--out={tmp_path / 'out'}"],
  }
  for program, args in programs.items():
    cases = [{"args": args(damaged[name])} for name in ("no_spm", "short_vocab")]
    if program == "launch.translate":  # evaluate and probe read a non-Marian config.json as GPT-2's
      cases.append({"args": args(damaged["bart"])})
    for case, name in zip(run_cases(program, cases, tmp_path), expected):
      errors = [line for line in case["stderr"].splitlines() if line.startswith("error: ")]
      assert case["status"] == 1 and len(errors) == 1 and expected[name] in errors[0], (program, name, case["stderr"])
  assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
  "change, message",
  [
    (
      {"layernorm_embedding": True},
      "a marian's config.json with layernorm_embedding=True: this key is not one we read",
    ),
    ({"normalize_before": True}, r"a marian with normalize_before=True \(we compute False\) is not one we run"),
  ],
)
def test_a_config_key_we_do_not_compute_is_one_error_naming_it(tmp_path, change, message):
  """The allowlist: a Marian config.json key the format does not read, or a BART-era one at another value."""
  shutil.copytree(FIXTURE, tmp_path / "marian")
  config = json.loads((tmp_path / "marian" / "config.json").read_text())
  (tmp_path / "marian" / "config.json").write_text(json.dumps({**config, **change}))
  with pytest.raises(CheckpointError, match=message):
    import_hf_marian(tmp_path / "marian")
