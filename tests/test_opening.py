"""transformer.opening: one function opens what a user points at as plain values (a Model, a Dictionary), and
the instrument runs on them; a Hugging Face directory opens without a training run's config being built."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import config, opening, sharding, tasks
from transformer.errors import CheckpointError
from transformer.interp import interventions, replacement
from transformer.models import formats, sae_formats
from transformer.models.gpt import GPT
from transformer.models.sae import SAE, SAEConfig

from conftest import REPO

FIXTURES = REPO / "tests" / "fixtures"
TOKENS = np.array([[1, 5, 9, 2, 7, 3]], np.int32)


@pytest.fixture
def no_training_run(monkeypatch):
  """Building a run's config (what a training run is made from) fails the test."""

  def refuse(*args, **kwargs):
    raise AssertionError("a training run's config was built to open a model")

  monkeypatch.setattr(config, "resolve_for", refuse)
  monkeypatch.setattr(tasks, "resolve", refuse)


@pytest.mark.parametrize("name, kind", [("gpt2_tiny_a", "gpt2"), ("families/llama", "llama")])
def test_a_hugging_face_directory_opens_as_a_model_without_a_training_run(no_training_run, name, kind):
  """GPT-2's and an open family's directory open as module, params and tokenizer (none that fits: ids alone);
  a tool (the cache of a run, read by TransformerLens's names) works on them, with the checkpoint's logits."""
  model = opening.open_path(FIXTURES / name)
  assert isinstance(model, opening.Model) and model.source.endswith(f"({kind})")
  assert model.tokenizer.vocab_size <= model.module.config.vocab_size
  logits, cache = interventions.run_with_cache(model.module, model.params, TOKENS, names=("blocks.0.hook_resid_post",))
  assert cache["L0.resid_post"].shape[:2] == TOKENS.shape
  config, params = formats.import_lm(FIXTURES / name)
  np.testing.assert_allclose(logits, jax.jit(GPT(config).apply)({"params": params}, TOKENS), atol=1e-6)


def test_a_marian_directory_and_a_mesh(no_training_run):
  """Marian's directory opens as the encoder-decoder with its tokenizer pair; an open family opened onto a mesh
  has its params on the shardings the module declares."""
  marian = opening.open_path(FIXTURES / "marian_tiny")
  assert type(marian.module).__name__ == "Transformer" and marian.tokenizer.name == "marian"
  mesh = sharding.make_mesh((1, 1, 1))
  llama = opening.open_path(FIXTURES / "families" / "llama", mesh=mesh)
  kernel = llama.params["h"]["layer_0"]["mlp"]["fc"]["kernel"]
  assert kernel.sharding == llama.shardings["h"]["layer_0"]["mlp"]["fc"]["kernel"]


def test_dictionaries_open_with_the_point_their_files_name(tmp_path):
  """SAELens's files (their hook_name in TransformerLens's words read as our point), a Gemma Scope params.npz
  and circuit-tracer's transcoder set open as Dictionaries."""
  cfg = SAEConfig(d_in=12, d_sae=32, activation="relu")
  params = SAE(cfg).init(jax.random.key(0), jnp.zeros((1, 12)))["params"]  # boxed, as SAE.init gives them
  sae_formats.export_saelens(cfg, params, tmp_path / "sae", hook_name="blocks.1.hook_resid_pre")
  sae = opening.open_path(tmp_path / "sae")
  assert (sae.point, sae.layer, sae.module.config.d_in) == ("resid_pre", 1, 12)
  rng = np.random.default_rng(0)
  npz = {"W_enc": rng.normal(size=(12, 32)), "W_dec": rng.normal(size=(32, 12)), "b_enc": np.zeros(32)}
  np.savez(tmp_path / "params.npz", **npz, b_dec=np.zeros(12), threshold=np.full(32, 0.1))
  assert opening.open_path(tmp_path / "params.npz").module.config.activation == "jumprelu"
  transcoders = opening.open_path(FIXTURES / "graph" / "relu")
  # its config.yaml's hook_resid_mid, read as the MLP's input
  assert isinstance(transcoders.module, replacement.PerLayerTranscoders) and transcoders.point == "mlp_in"
  (tmp_path / "empty").mkdir()
  with pytest.raises(CheckpointError, match="holds nothing this library opens: looked for a training workdir"):
    opening.open_path(tmp_path / "empty")
  json.dumps(sae.source)  # where it came from, printable
