"""Marian (Hugging Face MarianMTModel) weights in our encoder-decoder, against golden fixtures that
transformers made (tests/make_marian_fixtures.py; tests/fixtures/marian_tiny)."""

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from transformer.errors import CheckpointError
from transformer.generation import beam_search
from transformer.models.hf_marian import import_hf_marian
from transformer.models.seq2seq import Transformer

from conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "marian_tiny"


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_imported_logits_equal_hugging_faces(kernels):
  """Teacher-forced logits of a padded batch (sources of different lengths): transformers' own, to 1e-4."""
  cfg, params = import_hf_marian(FIXTURE)
  assert (cfg.num_layers, cfg.decoder_layers(), cfg.block.num_heads, cfg.block.d_mlp) == (2, 3, 4, 80)
  assert (cfg.sinusoids, cfg.scale_embeddings, cfg.logits_bias, cfg.block.activation) == ("halves", True, True, "swish")
  reference = np.load(FIXTURE / "reference.npz")
  assert not reference["attention_mask"].all()  # the batch has padding
  logits = Transformer(cfg.replace(kernels=kernels)).apply(
    {"params": params},
    jnp.asarray(reference["input_ids"]),
    jnp.asarray(reference["decoder_input_ids"]),
    source_valid_BxS=jnp.asarray(reference["attention_mask"] == 1),
  )
  np.testing.assert_allclose(logits, reference["logits"], atol=1e-4)


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
      "is missing tensor 'decoder.layers.2.fc1.weight' for 2+3 layers",
    ),
    (
      lambda d: _edit_tensors(d, lambda t: t.update({"model.encoder.layers.0.fc1.bias": np.zeros(81, np.float32)})),
      "['encoder']['layer_0']['mlp']['fc']['bias'] comes out (81,), our model needs (80,)",
    ),
    (
      lambda d: _edit_tensors(d, lambda t: t.update({"model.encoder.layers.2.fc1.bias": np.zeros(80, np.float32)})),
      "has tensors our model does not: encoder.layers.2.fc1.bias",
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
