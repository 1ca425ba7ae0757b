"""Golden fixtures for the open families (Llama, Mistral, Qwen2, Qwen3, SmolLM, Gemma, Gemma 2, Gemma 3,
GPT-NeoX/Pythia, OLMo 2): tiny random models made with Hugging Face transformers, each with every option
its family's released checkpoints use, and what transformers computes with them.

Not run by the test suite (torch is not a dependency of this project). Regenerate with the Python 3.11
venv of tests/make_gpt2_fixtures.py (torch's CPU build; transformers 5.x):

  /tmp/torchenv/bin/pip install torch==2.13.0 transformers safetensors numpy
  /tmp/torchenv/bin/python tests/make_family_fixtures.py          # writes tests/fixtures/families/<name>/
  /tmp/torchenv/bin/python tests/make_family_fixtures.py --check DIR NAME
      # loads an exported DIR with AutoModelForCausalLM and prints the largest difference of its
      # logits from fixture NAME's reference (tests/test_families.py, with TRANSFORMER_TORCH_PYTHON)
  .venv/bin/python tests/test_families.py DIR       # our export of every fixture, into DIR/<name>
  /tmp/torchenv/bin/python tests/make_family_fixtures.py --check-exports DIR
      # each DIR/<name> loaded by transformers: writes tests/fixtures/families/<name>/export_check.json
      # (the difference of its logits from the reference, and the sha256 of the config.json checked)

Each fixture directory holds what `save_pretrained` writes (config.json, model.safetensors) and
reference.npz: a batch of 3 rows of 24 tokens, left-padded (input_ids, attention_mask, and the
position_ids transformers' generate computes from the mask: each row's real tokens from 0), the float32
logits at every position, and a greedy generation with the KV cache of 40 new tokens from a left-padded
batch of prompts (prompt_ids, prompt_mask, generated), past every sliding window.
"""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "families"
COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, max_position_embeddings=128)
CONFIGS = {
  # Llama 3.2's recipe: GQA, theta 500,000 with Llama 3's scaling, an untied head.
  "llama": (
    "LlamaConfig",
    dict(
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      rms_norm_eps=1e-5,
      tie_word_embeddings=False,
      rope_parameters=dict(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=16,
      ),
    ),
  ),
  # SmolLM2's: a Llama with tied embeddings and multi-query-like GQA (9 heads, 3 kv in the real one).
  "smollm": (
    "LlamaConfig",
    dict(
      num_hidden_layers=2,
      num_attention_heads=6,
      num_key_value_heads=2,
      hidden_size=48,
      tie_word_embeddings=True,
      rope_parameters=dict(rope_type="default", rope_theta=100000.0),
    ),
  ),
  # Mistral's: every layer a sliding window (8 here, so that 40 generated tokens pass it).
  "mistral": (
    "MistralConfig",
    dict(
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, sliding_window=8, tie_word_embeddings=False
    ),
  ),
  # Qwen2's: q/k/v biases, no output bias.
  "qwen2": (
    "Qwen2Config",
    dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
  ),
  # Qwen3's: QK-norm per head, heads wider than hidden/heads, YaRN as Qwen documents it.
  "qwen3": (
    "Qwen3Config",
    dict(
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=32,
      tie_word_embeddings=True,
      rope_parameters=dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0, original_max_position_embeddings=32),
    ),
  ),
  # Pythia's: parallel attention and MLP, a quarter of each head rotated, LayerNorms with biases.
  "gpt_neox": (
    "GPTNeoXConfig",
    dict(
      num_hidden_layers=2,
      num_attention_heads=4,
      use_parallel_residual=True,
      rotary_pct=0.25,
      hidden_act="gelu",
      tie_word_embeddings=False,
    ),
  ),
  # OLMo 2's: norms after each branch and none before, QK-norm over all heads.
  "olmo2": ("Olmo2Config", dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4)),
  # Gemma's: multi-query, wide heads, GeGLU, (1 + w) norms, embeddings times sqrt(d_model).
  "gemma": (
    "GemmaConfig",
    dict(
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=1,
      head_dim=32,
      hidden_activation="gelu_pytorch_tanh",
    ),
  ),
  # Gemma 2's: local and global layers, soft-capped scores and logits, query_pre_attn_scalar, pre and
  # post norms.
  "gemma2": (
    "Gemma2Config",
    dict(
      num_hidden_layers=3,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=16,
      sliding_window=8,
      query_pre_attn_scalar=24,
      # caps of the scale these small random weights reach (the released 50 and 30 would never bind)
      attn_logit_softcapping=0.5,
      final_logit_softcapping=0.8,
    ),
  ),
  # Gemma 3's: QK-norm with (1 + w), a local base for the local layers and a scaled global one.
  "gemma3_text": (
    "Gemma3TextConfig",
    dict(
      num_hidden_layers=3,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=16,
      sliding_window=8,
      query_pre_attn_scalar=16,
      layer_types=["sliding_attention", "sliding_attention", "full_attention"],
      rope_parameters={
        "full_attention": dict(rope_type="linear", rope_theta=1000000.0, factor=8.0),
        "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
      },
    ),
  ),
}
B, T, PROMPT, NEW = 3, 24, 6, 40
# Tokenizers (tokenizer.json + tokenizer_config.json) trained here with Hugging Face `tokenizers` in the
# two forms the families ship, each beside the model whose vocabulary it fills: a byte-level BPE whose
# tokenizer.json adds the BOS itself (Llama 3, SmolLM2, Qwen, Pythia, OLMo), and a SentencePiece-like
# BPE ("▁" for spaces) whose tokenizer_config.json asks for the BOS (Gemma, Llama 2, Mistral).
TOKENIZERS = {
  "smollm": dict(
    kind="byte_level",
    specials=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
    bos="<|begin_of_text|>",
    eos="<|end_of_text|>",
  ),
  "gemma": dict(kind="metaspace", specials=["<pad>", "<eos>", "<bos>", "<unk>"], bos="<bos>", eos="<eos>"),
}
VOCAB = 320  # of both tokenizers, and so of those two models


def _corpus() -> list[str]:
  """Text to train on and held-out text (with special tokens) to compare ids on: the standard library's
  docstrings, which every Python has."""
  import argparse  # noqa: E401
  import collections
  import csv
  import email
  import inspect
  import json as json_module
  import logging
  import pathlib
  import textwrap

  train = [inspect.getdoc(m) or "" for m in (argparse, collections, csv, email, logging, pathlib)]
  held_out = (inspect.getdoc(textwrap.dedent) or "") + "\n" + (inspect.getdoc(json_module.dumps) or "")[:600]
  return [line for doc in train for line in doc.splitlines() if line.strip()], held_out


def make_tokenizer(name: str) -> None:
  """A tokenizer trained on `_corpus`, saved by transformers beside model `name`, and the ids AutoTokenizer
  gives held-out text (tokenizer_reference.json)."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, processors, trainers

  spec = TOKENIZERS[name]
  lines, held_out = _corpus()
  if spec["kind"] == "byte_level":
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(
      lines, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=spec["specials"], initial_alphabet=alphabet)
    )
    bos = spec["bos"]
    tok.post_processor = processors.TemplateProcessing(
      single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    config = dict(bos_token=bos, eos_token=spec["eos"])
  else:
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=spec["specials"]))
    config = dict(
      bos_token=spec["bos"],
      eos_token=spec["eos"],
      unk_token="<unk>",
      pad_token="<pad>",
      add_bos_token=True,
      add_eos_token=False,
    )
  wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **config)
  out = FIXTURES / name
  wrapped.save_pretrained(out)
  auto = transformers.AutoTokenizer.from_pretrained(out)
  specials = spec["specials"]
  texts = [
    held_out,
    f"{specials[1]}Two{specials[0]} documents,\n  one line. {specials[-1]}",
    "",
    "  spaces  and\ttabs\n",
  ]
  ids = [auto(text)["input_ids"] for text in texts]
  decoded = [auto.decode(row, skip_special_tokens=False) for row in ids]
  reference = dict(texts=texts, ids=ids, decoded=decoded, vocab_size=len(auto), tokenizer_class=type(auto).__name__)
  (out / "tokenizer_reference.json").write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
  print(name, "tokenizer:", len(auto), "tokens,", type(auto).__name__, ids[1])


def _model(name: str, seed: int):
  cls_name, options = CONFIGS[name]
  vocab = {"vocab_size": VOCAB} if name in TOKENIZERS else {}
  config = getattr(transformers, cls_name)(**{**COMMON, **options, **vocab})
  config.attn_implementation = "eager"
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
  with torch.no_grad():  # fresh init has unit norms and zero biases: perturb so that every tensor matters
    for p in model.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  return model


def _left_padded(rows: int, length: int, pads: list[int], generator) -> tuple[torch.Tensor, torch.Tensor]:
  ids = torch.randint(1, COMMON["vocab_size"], (rows, length), generator=generator)  # (ids below any vocabulary here)
  mask = torch.ones(rows, length, dtype=torch.long)
  for row, pad in enumerate(pads):
    ids[row, :pad], mask[row, :pad] = 0, 0
  return ids, mask


def make(name: str, seed: int) -> None:
  model = _model(name, seed)
  out = FIXTURES / name
  model.save_pretrained(out, safe_serialization=True)
  if name in TOKENIZERS:
    make_tokenizer(name)
  generator = torch.Generator().manual_seed(seed)
  ids, mask = _left_padded(B, T, [0, 3, 7], generator)
  positions = (mask.cumsum(-1) - 1).clamp(min=0)
  with torch.no_grad():
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float().numpy()
  prompt_ids, prompt_mask = _left_padded(B, PROMPT, [0, 2, 4], generator)
  generated = model.generate(
    input_ids=prompt_ids,
    attention_mask=prompt_mask,
    max_new_tokens=NEW,
    min_new_tokens=NEW,
    do_sample=False,
    pad_token_id=0,
    eos_token_id=None,
  )[:, PROMPT:]
  np.savez(
    out / "reference.npz",
    input_ids=ids.numpy().astype(np.int32),
    attention_mask=mask.numpy().astype(np.int32),
    position_ids=positions.numpy().astype(np.int32),
    logits=logits,
    prompt_ids=prompt_ids.numpy().astype(np.int32),
    prompt_mask=prompt_mask.numpy().astype(np.int32),
    generated=generated.numpy().astype(np.int32),
  )
  print(name, sum(p.numel() for p in model.parameters()), "parameters;", json.dumps(model.config.model_type))


def check(directory: str, name: str) -> dict:
  """The largest difference between the logits transformers computes with an exported `directory`
  and fixture `name`'s reference (the same weights, exported back), and the checked config's sha256."""
  model = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
  reference = np.load(FIXTURES / name / "reference.npz")
  args = {k: torch.from_numpy(reference[k]).long() for k in ("input_ids", "attention_mask", "position_ids")}
  with torch.no_grad():
    logits = model(**args).logits.float().numpy()
  real = reference["attention_mask"].astype(bool)
  config_sha256 = hashlib.sha256((Path(directory) / "config.json").read_bytes()).hexdigest()
  return {"max_abs_diff": float(np.abs(logits - reference["logits"])[real].max()), "config_sha256": config_sha256}


if __name__ == "__main__":
  if sys.argv[1:2] == ["--check"]:
    print(json.dumps(check(sys.argv[2], sys.argv[3])))
  elif sys.argv[1:2] == ["--check-exports"]:
    for name in CONFIGS:
      checked = check(str(Path(sys.argv[2]) / name), name)
      (FIXTURES / name / "export_check.json").write_text(json.dumps(checked, indent=2) + "\n")
      print(name, checked)
  else:
    for name in sys.argv[1:] or CONFIGS:
      make(name, seed=list(CONFIGS).index(name))
