"""One function opens what a user points at, as plain values every tool takes: `open_path`.

  a training run's workdir                    -> Model (a checkpoint of it: transformer.inference.load)
  a Hugging Face directory                    -> Model (GPT-2, Marian, an open model: transformer.models.formats;
                                                 the module, params and tokenizer alone, no training run built)
  an SAE task's workdir, SAELens's files      -> Dictionary (an SAE or a transcoder, and the point it reads)
  (cfg.json), a Gemma Scope params.npz
  circuit-tracer's transcoder set             -> Dictionary (every layer's transcoders: replacement.Transcoders)
  (config.yaml), a cross-layer transcoder's workdir

    >>> model = open_path("path/to/SmolLM2-135M")                  # or mesh=jax.make_mesh(...): onto its shards
    >>> logits, cache = interventions.run_with_cache(model.module, model.params, tokens_BxT)
    >>> sae = open_path("path/to/saelens-sae")                     # sae.module, sae.params, sae.point, sae.layer

A Model opened from files carries no training config: what trains it again (a task) is built by the programs
that train (`--config=experiments/hf.py:DIR`), and the instrument needs only the module and its params.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import dictionaries, inference, sharding
from transformer import workdir as workdir_files
from transformer.config import MeshConfig
from transformer.errors import CheckpointError
from transformer.layers.points import Point
from transformer.models import formats, hf_files, sae_formats, tracer_formats
from transformer.models.formats.marian import import_hf_marian
from transformer.models.gpt import GPT
from transformer.models.sae import SAE
from transformer.models.seq2seq import Transformer


@dataclasses.dataclass(frozen=True)
class Model:
  """A model as a value: its linen module, its params, the tokenizer of its ids, where it came from, and
  the params' shardings when it was opened onto a mesh (None: on the default device)."""

  module: nn.Module
  params: Any
  tokenizer: Any
  source: str
  shardings: Any = None


@dataclasses.dataclass(frozen=True)
class Dictionary:
  """A sparse dictionary as a value: an SAE or one transcoder (`module` an SAE), or a model's transcoders
  (`module` a replacement.Transcoders, `params` theirs); the point it reads in our words and its block, as
  its files name them (None where they do not say); where it came from."""

  module: Any
  params: Any
  point: str | None
  layer: int | None
  source: str


def open_path(path: str | Path, *, mesh=None, rules: tuple | None = None, tokenizer: str = "gpt2"):
  """The Model or Dictionary at `path` (see the module docstring for what each kind of file set opens as).
  `mesh` (a jax Mesh): a Hugging Face model's params are placed on their shards as they are read, by the
  logical axis `rules` (default: MeshConfig's); `tokenizer`: the tokenizer of a GPT-2 directory (gpt2 for
  OpenAI's). Anything else is one error naming what was looked for."""
  path = Path(path)
  if path.suffix == ".npz" or (path / "params.npz").is_file():  # Gemma Scope
    config, params = sae_formats.import_gemma_scope(path)
    return Dictionary(SAE(config), jax.device_put(params), None, None, f"{path} (Gemma Scope)")
  if (path / sae_formats.CONFIG).is_file():
    return _saelens(path)
  if tracer_formats.kind(path):
    _, transcoders = dictionaries.load_transcoders([str(path)])
    return Dictionary(transcoders, transcoders.params, transcoders.point_in, None, f"{path} (circuit-tracer)")
  if (path / workdir_files.CHECKPOINTS).is_dir() and (path / workdir_files.CONFIG).is_file():
    return _workdir(path)
  if (path / "config.json").is_file() or (path / "model.safetensors").is_file():
    return _hugging_face(path, mesh, MeshConfig().rules if rules is None else rules, tokenizer)
  raise CheckpointError(
    f"{path} holds nothing this library opens: looked for a training workdir ({workdir_files.CONFIG} and "
    f"{workdir_files.CHECKPOINTS}/), a Hugging Face directory (config.json, model.safetensors), SAELens's "
    f"{sae_formats.CONFIG}, a Gemma Scope params.npz, or circuit-tracer's config.yaml"
  )


def _saelens(directory: Path) -> Dictionary:
  config, params = sae_formats.import_saelens(directory)
  cfg = json.loads((directory / sae_formats.CONFIG).read_text())
  hook = (cfg.get("metadata") or {}).get("hook_name") or cfg.get("hook_name")
  point = Point.parse(hook) if hook else None  # SAELens's hook_name: TransformerLens's name of the point
  name, layer = (point.name, point.layer) if point else (None, None)
  return Dictionary(SAE(config), jax.device_put(params), name, layer, f"{directory} (SAELens)")


def _workdir(workdir: Path) -> Model | Dictionary:
  """A training run's latest checkpoint: a model, or an SAE task's dictionary."""
  saved = workdir_files.saved_config_dict(workdir)
  if saved.get("task", "lm") != "sae":
    trained = inference.load(workdir=workdir)
    return Model(trained.model, trained.params, trained.tokenizer, trained.source)
  if saved.get("cross_layer", False):
    _, transcoders = dictionaries.load_transcoders([str(workdir)])
    return Dictionary(transcoders, transcoders.params, transcoders.point_in, None, str(workdir))
  trained = inference.restore(workdir, task="sae")
  c = trained.run.task_config
  return Dictionary(trained.model, nn.unbox(trained.params), c.point, c.layer, f"{workdir} step {trained.step}")


def _hugging_face(directory: Path, mesh, rules: tuple, tokenizer_name: str) -> Model:
  """A Hugging Face directory's module, params (onto `mesh` where given) and tokenizer: no task, no run."""
  model_type = hf_files.read_config(directory).get("model_type") if (directory / "config.json").is_file() else None
  if model_type == "marian":
    config, params = import_hf_marian(directory)
    module, tokenizer = Transformer(config), inference.marian_tokenizer(directory, config.vocab_size)
    shardings = _shardings(module, (jnp.zeros((1, 2), jnp.int32),) * 2, mesh, rules)
    params = jax.device_put(params, shardings) if shardings is not None else jax.device_put(params)
    return Model(module, params, tokenizer, f"{directory} ({model_type})", shardings)
  # A language model (an open model's, or GPT-2's, whose files may come without config.json): read onto its
  # shardings as each tensor is read.
  config = formats.read_model_config(directory)
  module = GPT(config)
  shardings = _shardings(module, (jnp.zeros((1, min(8, config.max_len)), jnp.int32),), mesh, rules)
  config, params = formats.import_lm(directory, shardings=shardings)
  if formats.is_open_model(directory):
    tokenizer = inference.open_model_tokenizer(directory, config.vocab_size)
  else:
    tokenizer = inference.gpt2_tokenizer(directory, tokenizer_name, config.vocab_size, required=False)
  return Model(module, params, tokenizer, f"{directory} ({model_type or 'gpt2'})", shardings)


def _shardings(module: nn.Module, inputs: tuple, mesh, rules: tuple):
  """The params' NamedShardings on `mesh` by the logical axis names the module declares (None: no mesh)."""
  if mesh is None:
    return None
  _, shardings = sharding.param_shardings(module, inputs, mesh, rules)
  return shardings
