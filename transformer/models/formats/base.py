"""What a Hugging Face weight format is here (`Format`), and the entries of its layout (`Tensor`).

A format knows one family of checkpoints: the `model_type`s of config.json it reads, the config.json keys it
handles (every other key is refused by name: an allowlist, so that an option we do not compute is never
silently dropped), config.json -> our model config (`config_from_hf`) and back (`config_to_hf`), and its
layout: for each of our params, the Hugging Face tensors it is made of and the two conversions. The one
importer and exporter (transformer.models.formats) drive import and export from the layout alike.
torch's Linear stores [out, in], our kernels (in, out...): import transposes.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import jax
import numpy as np

from transformer import tokenizers
from transformer.errors import CheckpointError
from transformer.models import gpt, hf_files

# config.json keys that never change the function a model computes: which class saved it, special tokens'
# ids, generation and caching switches, initialisation, dropout (training only), the attention's
# implementation. Any format may meet them.
METADATA = frozenset(
  {
    "_name_or_path",
    "architectures",
    "attn_implementation",
    "bos_token_id",
    "cache_implementation",
    "classifier_dropout",
    "decoder_start_token_id",
    "eos_token_id",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "initializer_range",
    "init_std",
    "is_decoder",
    "model_type",
    "pad_token_id",
    "pretraining_tp",  # Llama's tensor-parallel split of its products: the same sums
    "return_dict",
    "transformers_version",
    "use_cache",
    "attention_dropout",
    "hidden_dropout",
    "activation_dropout",
    "dropout",
    # generation's settings and a classifier's labels, which some older files carry
    "bad_words_ids",
    "max_length",
    "num_beams",
    "id2label",
    "label2id",
    "gradient_checkpointing",
    "_num_labels",
    "attention_probs_dropout_prob",
    "hidden_dropout_prob",
  }
)


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One of our params (`ours`, its path) and the Hugging Face tensors it is made of (`keys`, of
  `shapes`): `to_ours(arrays) -> array` on import, `to_hf(array) -> arrays` on export."""

  ours: tuple[str, ...]
  keys: tuple[str, ...]
  shapes: tuple[tuple[int, ...], ...]
  to_ours: Callable
  to_hf: Callable


def as_is(ours, key, shape) -> Tensor:
  return Tensor(ours, (key,), (shape,), lambda ws: ws[0], lambda x: [x])


def reshaped(ours, key, hf_shape, shape) -> Tensor:
  """A tensor stored as `hf_shape`, ours of `shape` (the same values in the same order)."""
  return Tensor(ours, (key,), (hf_shape,), lambda ws: ws[0].reshape(shape), lambda x: [x.reshape(hf_shape)])


def linear(ours, key, out_in, shape) -> Tensor:
  """A torch Linear's weight [out, in] as our kernel of `shape` (in..., out...)."""
  return Tensor(ours, (key,), (out_in,), lambda ws: ws[0].T.reshape(shape), lambda x: [x.reshape(out_in[::-1]).T])


def vector(ours, key, shape) -> Tensor:
  n = int(np.prod(shape))
  return Tensor(ours, (key,), ((n,),), lambda ws: ws[0].reshape(shape), lambda x: [x.reshape(n)])


def stacked(ours, keys, out_ins, shape) -> Tensor:
  """Linears stacked on our kernel's axis 1 (q, k, v -> qkv: D x 3 x H x K; k, v -> kv)."""
  D, per = shape[0], shape[2:]
  return Tensor(
    ours,
    keys,
    out_ins,
    lambda ws: np.stack([w.T.reshape(D, *per) for w in ws], axis=1),
    lambda x: [x[:, i].reshape(D, -1).T for i in range(len(keys))],
  )


def stacked_bias(ours, keys, shape) -> Tensor:
  n = int(np.prod(shape[1:]))
  return Tensor(
    ours,
    keys,
    ((n,),) * len(keys),
    lambda ws: np.stack([w.reshape(shape[1:]) for w in ws]),
    lambda x: [x[i].reshape(n) for i in range(len(keys))],
  )


class Format:
  """One weight format: a family's model types, the config.json keys it handles, the two config
  conversions and the layout. A family's module defines one (or one per model type) and registers it in
  transformer.models.formats.FORMATS."""

  model_type: str  # config.json's
  architecture: str  # transformers' class, written into an export's config.json
  handled: ClassVar[frozenset[str]] = frozenset()  # the keys config_from_hf reads
  fixed: ClassVar[dict] = {}  # keys read only at this value (what we compute); another value is refused
  ignored: ClassVar[re.Pattern | None] = None  # buffers older checkpoints carry, not parameters
  tied_copies: ClassVar[tuple[str, ...]] = ()  # a tied checkpoint's copy of its embedding, skipped
  prefix: ClassVar[str] = ""  # what stored keys may start with that the layout's do not (GPT-2's "transformer.")

  @property
  def name(self) -> str:
    """The format's name in messages."""
    return self.model_type

  def config_from_hf(self, hf: dict, where: str) -> Any:
    raise NotImplementedError

  def config_to_hf(self, config, tokenizer=None) -> dict:
    """The config.json an export writes for `config` (and its `tokenizer`, for a format whose config holds
    the tokenizer's ids: Marian's)."""
    raise NotImplementedError

  def layout(self, config) -> Iterator[Tensor]:
    raise NotImplementedError

  def param_shapes(self, config) -> dict:
    """The model's params as ShapeDtypeStructs (unrolled layers), allocating nothing."""
    return gpt.param_shapes(config)

  def stacks(self, config) -> dict[str, int]:
    """Our params' layer stacks (name -> layers) that a scanned model holds as one."""
    return {"h": config.num_layers}

  def copies(self, config) -> tuple[str, ...]:
    """Stored tensors outside the layout that copy what our model holds once (read, then `check_copies`)."""
    return ()

  def check_copies(self, copies: dict, params: dict, config, where: str) -> None:
    """One error for a copy (`copies`: key -> array) that is not what our model computes."""

  def cannot_hold(self, config, hf: dict) -> list[str]:
    """ "field=ours (the format's: theirs)" for every field of `config` that the config.json `hf` written for
    it would read back as another value of: what an export refuses."""
    return hf_files.differences(config, self.config_from_hf(hf, "the export"), self.name, hf_files.FREE)

  def exported(self, params: dict, entry: Tensor, config) -> np.ndarray:
    """Our param of `entry` as the host array the export converts (in its dtype: bfloat16 stays)."""
    return np.asarray(jax.device_get(hf_files.get_path(params, entry.ours)))

  def stored_key(self, key: str) -> str:
    """The key an export writes for the layout's `key`."""
    return key

  def write_beside(self, out_dir: Path, hf: dict, tokenizer) -> None:
    """What an export writes beside the weights and `hf` (out_dir's config.json) from the model's `tokenizer`
    (None: nothing). A language model's: the ids generation starts and stops on, in config.json (where
    transformers' generate reads them), and an HFTokenizer's tokenizer.json and tokenizer_config.json."""
    if tokenizer is None or isinstance(tokenizer, tokenizers.NoTokenizer):
      return
    bos = getattr(tokenizer, "bos_id", tokenizer.eot_id)  # (GPT-2's: its <|endoftext|>, both)
    hf = {**hf, "eos_token_id": tokenizer.eot_id, **({} if bos is None else {"bos_token_id": bos})}
    (out_dir / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    if isinstance(tokenizer, tokenizers.HFTokenizer):
      tokenizer.save(out_dir)

  def check_keys(self, hf: dict, where: str) -> None:
    """One error naming every config.json key neither this format handles nor is metadata (`METADATA`), or
    one of its `fixed` keys at another value than the one we compute."""
    other = [f"{k}={hf[k]!r} (we compute {v!r})" for k, v in self.fixed.items() if k in hf and hf[k] != v]
    if other:
      raise CheckpointError(f"{where}: a {self.model_type} with {', '.join(other)} is not one we run")
    unknown = sorted(set(hf) - self.handled - set(self.fixed) - METADATA)
    if unknown:
      raise CheckpointError(
        f"{where}: a {self.model_type}'s config.json with {', '.join(f'{k}={hf[k]!r}' for k in unknown)}: "
        f"{'this key is' if len(unknown) == 1 else 'these keys are'} not one we read, and may change the model; "
        f"we read {', '.join(sorted(self.handled))}"
      )
