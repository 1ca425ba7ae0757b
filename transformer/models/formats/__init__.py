"""Hugging Face checkpoints <-> our params and configs, without torch: one `Format` a model type
(formats/base.py), chosen by config.json's `model_type` from one registry (`FORMATS`), and one streaming
importer and exporter for all of them (formats/streaming.py).

  llama.py     Llama, Mistral, Qwen2, Qwen3 (and SmolLM, a Llama)   gemma.py     Gemma 1, 2, 3 (text)
  olmo2.py     OLMo 2                                               gpt_neox.py  GPT-NeoX (Pythia)
  gpt2.py      GPT-2 (its Conv1D layout; a config from the tensors) marian.py    Marian (OPUS-MT) encoder-decoders
  decoder.py   what the open models' config.json files share        base.py      Format, the layout's Tensor entries

    >>> config, params = import_hf("path/to/SmolLM2-135M")         # config.json + *.safetensors
    >>> logits = GPT(config).apply({"params": params}, tokens)
    >>> export_hf(config, params, "out/", "llama")    # AutoModelForCausalLM.from_pretrained("out/") loads it

A checkpoint split into shards (model.safetensors.index.json) is read one shard at a time, each param placed
on its devices as soon as its tensors are read, in the stored dtype. Every key and shape is checked and the
offending one named; a model type, a config.json key or a value we do not compute is one error naming it.
Adding a model type: a module here with its Format(s) and layout, a line in `FORMATS`, its fixture.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformer.errors import CheckpointError, ConfigError
from transformer.models import hf_files
from transformer.models.formats import gemma, gpt2, gpt_neox, llama, marian, olmo2, streaming
from transformer.models.formats.base import Format
from transformer.models.gpt import GPTConfig

# config.json's model_type -> its format: the open models (decoders whose config.json says all, with their
# own tokenizer.json), then GPT-2 (whose files may come without config.json, read with tiktoken's gpt2
# tokens by default) and Marian (an encoder-decoder).
OPEN_MODELS: dict[str, Format] = {f.model_type: f for m in (llama, gemma, olmo2, gpt_neox) for f in m.FORMATS}
FORMATS: dict[str, Format] = {**OPEN_MODELS, "gpt2": gpt2.FORMAT, "marian": marian.FORMAT}
DECODERS = {k: f for k, f in FORMATS.items() if k != "marian"}  # the language models' (import_lm, export_lm)


def supported() -> str:
  return ", ".join(FORMATS)


def model_type(directory: str | Path) -> str | None:
  """The model_type a directory's config.json names (None: no config.json, or not one that reads)."""
  try:
    return json.loads((Path(directory) / "config.json").read_text()).get("model_type")
  except (OSError, ValueError, AttributeError):
    return None


def is_open_model(directory: str | Path) -> bool:
  """A directory whose config.json names one of the open models' types (OPEN_MODELS)."""
  return model_type(directory) in OPEN_MODELS


def format_of(hf: dict, where: str) -> Format:
  """The format of a config.json's model_type, one error naming those we have."""
  model_type = hf.get("model_type")
  if model_type not in FORMATS:
    raise CheckpointError(f"{where}: model_type {model_type!r} is not one we open; supported: {supported()}")
  return FORMATS[model_type]


def config_from_hf(hf: dict, where: str = "config.json"):
  """Our model config of a Hugging Face config.json (as a dict) of any of FORMATS' model types."""
  return format_of(hf, where).config_from_hf(hf, where)


def read_model_config(directory: str | Path) -> GPTConfig:
  """The GPTConfig of a Hugging Face language model's directory, from its config.json alone (no weights
  read); a GPT-2's without one from its tensors' shapes (the header)."""
  directory = Path(directory)
  if not (directory / "config.json").is_file():
    return gpt2.config_of_files(directory)[0]
  return config_from_hf(hf_files.read_config(directory), str(directory / "config.json"))


def import_hf(path: str | Path, shardings=None, **overrides) -> tuple:
  """Loads a Hugging Face checkpoint of any of FORMATS (config.json and its safetensors, one file or shards,
  read one at a time). The params keep the checkpoint's stored dtype (config.json's dtype: a bfloat16 model
  is never a float32 copy on the host); `shardings` (a tree like the params' of `jax.sharding.Sharding`s),
  when given, places each param on its shards as soon as it is read. `overrides` change fields that do not
  alter shapes (param_dtype, dtype, attention, scan_layers, max_len, ...). Returns (config, params)."""
  directory = Path(path)
  hf = hf_files.read_config(directory)
  stored = format_of(hf, str(directory / "config.json")).config_from_hf(hf, str(directory / "config.json"))
  return streaming.read(FORMATS[hf["model_type"]], hf_files.shard_files(directory), stored, shardings, overrides)


def import_lm(path: str | Path, shardings=None, **overrides) -> tuple[GPTConfig, dict]:
  """A Hugging Face language model's directory (or a GPT-2's model.safetensors alone), whichever format, as
  `import_hf` reads it."""
  path = Path(path)
  if path.is_file() or not (path / "config.json").is_file():  # GPT-2's files may come without config.json
    files, stored = gpt2.config_of_files(path)
    return streaming.read(gpt2.FORMAT, files, stored, shardings, overrides)
  if model_type(path) == "marian":
    raise CheckpointError(f"{path} holds a Marian translation model, not a language model: open it with import_hf")
  return import_hf(path, shardings, **overrides)


def export_hf(config, params: dict, out_dir: str | Path, model_type: str, tokenizer=None) -> Path:
  """Writes config.json + model.safetensors that transformers loads as `model_type` (AutoModelForCausalLM,
  MarianMTModel with Marian's `tokenizer`), and what `tokenizer` puts beside them (`Format.write_beside`). A
  model the format cannot hold is refused, each such field named, before anything is written: what is written
  must read back (as `import_hf` reads it) as this model."""
  if model_type not in FORMATS:
    raise ConfigError(f"no weight format for model_type {model_type!r}; supported: {supported()}")
  fmt = FORMATS[model_type]
  hf = fmt.config_to_hf(config, tokenizer)
  out_dir = streaming.write(fmt, config, params, out_dir, hf)
  fmt.write_beside(out_dir, hf, tokenizer)
  return out_dir


def export_lm(config: GPTConfig, params: dict, out_dir: str | Path, model_type: str, tokenizer=None) -> Path:
  """A language model written as a Hugging Face directory of `model_type` (an open model's, or gpt2),
  with the tokenizer's tokenizer.json and tokenizer_config.json when it has them (an HFTokenizer): what
  `launch.sample --export` writes. Refused, before anything is written, where the format cannot hold it."""
  if model_type not in DECODERS:
    raise ConfigError(f"no weight format for model_type {model_type!r}; supported: {', '.join(DECODERS)}")
  return export_hf(config, params, out_dir, model_type, tokenizer)
