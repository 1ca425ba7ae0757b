"""Hugging Face checkpoints <-> our params and configs, without torch: one `Format` a model type
(formats/base.py), chosen by config.json's `model_type` from one registry (`FORMATS`), and one streaming
importer and exporter for the open families.

  llama.py     Llama, Mistral, Qwen2, Qwen3 (and SmolLM, a Llama)   gemma.py     Gemma 1, 2, 3 (text)
  olmo2.py     OLMo 2                                               gpt_neox.py  GPT-NeoX (Pythia)
  gpt2.py      GPT-2 (its Conv1D layout, config from the tensors)   marian.py    Marian (OPUS-MT) encoder-decoders
  decoder.py   what the decoder families' config.json files share   base.py      Format, the layout's Tensor entries

    >>> config, params = import_hf("path/to/SmolLM2-135M")         # config.json + *.safetensors
    >>> logits = GPT(config).apply({"params": params}, tokens)
    >>> export_hf(config, params, "out/", "llama")    # AutoModelForCausalLM.from_pretrained("out/") loads it

A checkpoint split into shards (model.safetensors.index.json) is read one shard at a time, each param placed
on its devices as soon as its tensors are read, in the stored dtype. Every key and shape is checked and the
offending one named; a family, a config.json key or a value we do not compute is one error naming it.
Adding a family: a module here with its DecoderFormat(s) and layout, a line in `FORMATS`, its fixture.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

from transformer import layers, tokenizers
from transformer.errors import CheckpointError, ConfigError
from transformer.models import hf_files
from transformer.models.formats import gemma, gpt2, gpt_neox, llama, marian, olmo2
from transformer.models.formats.base import Format
from transformer.models.formats.gpt2 import export_hf_gpt2, import_hf_gpt2
from transformer.models.gpt import GPTConfig, param_shapes

# config.json's model_type -> its format: the open families (read and written by the streaming importer and
# exporter below), then GPT-2 and Marian (whose files import_lm and transformer.inference read).
FAMILIES: dict[str, Format] = {f.model_type: f for m in (llama, gemma, olmo2, gpt_neox) for f in m.FORMATS}
FORMATS: dict[str, Format] = {**FAMILIES, "gpt2": gpt2.FORMAT, "marian": marian.FORMAT}


def supported() -> str:
  return ", ".join(FORMATS)


def is_family(directory: str | Path) -> bool:
  """A directory whose config.json names one of the open families' model types (FAMILIES)."""
  path = Path(directory) / "config.json"
  try:
    return json.loads(path.read_text()).get("model_type") in FAMILIES
  except (OSError, ValueError, AttributeError):
    return False


def format_of(hf: dict, where: str) -> Format:
  """The format of a config.json's model_type, one error naming those we have."""
  model_type = hf.get("model_type")
  if model_type not in FORMATS:
    raise CheckpointError(f"{where}: model_type {model_type!r} is not one we open; supported: {supported()}")
  return FORMATS[model_type]


def config_from_hf(hf: dict, where: str = "config.json"):
  """Our model config of a Hugging Face config.json (as a dict) of any of FORMATS' model types."""
  return format_of(hf, where).config_from_hf(hf, where)


def export_config(cfg: GPTConfig, model_type: str) -> dict:
  """The config.json transformers reads for `cfg` as an open family's `model_type` (`Format.config_to_hf`)."""
  if model_type not in FAMILIES:
    raise ConfigError(f"no weight format for model_type {model_type!r}; supported: {', '.join(FAMILIES)}")
  return FAMILIES[model_type].config_to_hf(cfg)


def read_model_config(directory: str | Path) -> GPTConfig:
  """The GPTConfig of a Hugging Face language model's directory: a family's from its config.json alone
  (no weights read); GPT-2's from its tensors' shapes (import_lm)."""
  if not is_family(directory):
    return import_lm(directory)[0]
  return config_from_hf(hf_files.read_config(directory), str(Path(directory) / "config.json"))


def import_hf(path: str | Path, shardings=None, **overrides) -> tuple[GPTConfig, dict]:
  """Loads a Hugging Face checkpoint of one of the open families (FAMILIES) (config.json and its safetensors,
  one file or shards, read one at a time). The params keep the checkpoint's stored dtype (config.json's
  dtype: a bfloat16 model is never a float32 copy on the host); `shardings` (a tree like the params'
  of `jax.sharding.Sharding`s), when given, places each param on its shards as soon as it is read.
  `overrides` change fields that do not alter shapes (param_dtype, dtype, attention, scan_layers,
  max_len, ...). Returns (config, params)."""
  directory = Path(path)
  hf = hf_files.read_config(directory)
  fmt = format_of(hf, str(directory / "config.json"))
  if hf["model_type"] not in FAMILIES:
    raise CheckpointError(f"{directory} holds a {hf['model_type']}: open it with import_lm or inference.load(hf=...)")
  scan = overrides.pop("scan_layers", False)
  cfg = fmt.config_from_hf(hf, str(directory / "config.json")).replace(**overrides).check()
  entries = list(fmt.layout(cfg))
  wanted = {key: (entry, shape) for entry in entries for key, shape in zip(entry.keys, entry.shapes)}
  dtypes = jax.tree.map(lambda x: x.dtype, nn.unbox(param_shapes(cfg)))
  place = (
    (lambda ours, x: jax.device_put(x, hf_files.get_path(shardings, ours))) if shardings and not scan else _on_device
  )
  params, pieces = {}, {}
  for file in hf_files.shard_files(directory):
    for key, value in _tensors(file, fmt, cfg):
      entry, shape = _checked(key, value, wanted, file, cfg, fmt.model_type)
      pieces[key] = value
      if all(k in pieces for k in entry.keys):  # every piece of this param read: convert and place it
        value = entry.to_ours([pieces.pop(k) for k in entry.keys])
        # contiguous, in the param's dtype (a strided array costs a device program)
        value = np.ascontiguousarray(value, hf_files.get_path(dtypes, entry.ours))
        hf_files.set_path(params, entry.ours, place(entry.ours, value))
  missing = [key for key in wanted if hf_files.get_path(params, wanted[key][0].ours, None) is None]
  if missing:
    raise CheckpointError(f"{directory} is missing tensor {missing[0]!r} (expected shape {wanted[missing[0]][1]})")
  if scan:
    cfg = cfg.replace(scan_layers=True).check()
    params["h"] = layers.stack_layers(params["h"], cfg.num_layers)
    params = jax.device_put(params, shardings) if shardings else params
  return cfg, params


def _on_device(ours, x):
  return jax.device_put(x)  # (jnp.asarray of a NumPy array compiles a program for each shape)


def _checked(key: str, value, wanted: dict, file: Path, cfg: GPTConfig, model_type: str):
  """(the mapping entry, its shape) of tensor `key` of `file`, or the error naming what is wrong."""
  if key not in wanted:
    raise CheckpointError(f"{file} has a tensor a {model_type} of this config.json does not: {key!r}")
  entry, shape = wanted[key]
  if value.shape != shape:
    raise CheckpointError(
      f"tensor {key!r} in {file} has shape {value.shape}, expected {shape} for the config.json beside it "
      f"({cfg.num_layers} layers, d_model={cfg.block.d_model}, {cfg.block.num_heads} heads, vocab={cfg.vocab_size})"
    )
  return entry, shape


def _tensors(file: Path, fmt: Format, cfg: GPTConfig) -> Iterator[tuple[str, np.ndarray]]:
  """(key, array) of one safetensors file, less the buffers and a tied model's copy of its embedding."""
  tied = cfg.tie_embeddings
  skip = lambda key: (fmt.ignored is not None and fmt.ignored.search(key)) or (tied and key in fmt.tied_copies)
  return hf_files.read_tensors(file, skip)


def import_lm(path: str | Path, **overrides) -> tuple[GPTConfig, dict]:
  """A Hugging Face language model's directory, whichever format: an open family's (`import_hf`) or
  GPT-2's (formats.gpt2.import_hf_gpt2)."""
  return import_hf(path, **overrides) if is_family(path) else import_hf_gpt2(path, **overrides)


def export_hf(config: GPTConfig, params: dict, out_dir: str | Path, model_type: str) -> Path:
  """Writes config.json + model.safetensors that transformers' AutoModelForCausalLM loads as
  `model_type`. A model the format cannot hold is refused, each such field named: what is written must
  read back (as `import_hf` reads it) as this model."""
  hf = export_config(config, model_type)
  theirs = config_from_hf(hf, "the export")
  other = hf_files.differences(config, theirs, model_type, hf_files.FREE)
  if other:
    raise ConfigError(f"the Hugging Face {model_type} format cannot hold this model: {'; '.join(other)}")
  params = hf_files.unrolled(config, params)
  tensors = {}
  for entry in FAMILIES[model_type].layout(config):
    value = np.asarray(jax.device_get(hf_files.get_path(params, entry.ours)))  # in its dtype: bfloat16 stays
    for key, array in zip(entry.keys, entry.to_hf(value)):
      tensors[key] = np.ascontiguousarray(array)
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  hf_files.save_safetensors(tensors, out_dir / "model.safetensors")
  (out_dir / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
  return out_dir


def export_lm(config: GPTConfig, params: dict, out_dir: str | Path, model_type: str, tokenizer=None) -> Path:
  """A language model written as a Hugging Face directory of `model_type` (an open family's, or gpt2),
  with the tokenizer's tokenizer.json and tokenizer_config.json when it has them (an HFTokenizer): what
  `launch.sample --export` writes. Refused, before anything is written, where the format cannot hold it."""
  out_dir = Path(out_dir)
  if model_type == "gpt2":
    export_hf_gpt2(config, params, out_dir)
  else:
    export_hf(config, params, out_dir, model_type)
  if tokenizer is not None and not isinstance(tokenizer, tokenizers.NoTokenizer):
    # the ids generation starts and stops on (transformers' generate reads them from config.json)
    path = out_dir / "config.json"
    hf = json.loads(path.read_text())
    bos = getattr(tokenizer, "bos_id", tokenizer.eot_id)  # (GPT-2's: its <|endoftext|>, both)
    hf.update(eos_token_id=tokenizer.eot_id, **({} if bos is None else {"bos_token_id": bos}))
    path.write_text(json.dumps(hf, indent=2) + "\n")
  if isinstance(tokenizer, tokenizers.HFTokenizer):
    tokenizer.save(out_dir)
  return out_dir
