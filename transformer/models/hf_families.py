"""The open families' Hugging Face checkpoints <-> GPT params (import and export), without torch:
Llama (also Mistral, Qwen2, Qwen3, SmolLM), Gemma, Gemma 2, Gemma 3, GPT-NeoX (Pythia) and OLMo 2.

A family is two things here: `config_from_hf`, which reads its config.json into the one GPT's options
(grouped-query attention, rotary scalings, sliding windows, soft-caps, norms, ...), and its mapping
table (`_layout`): for each of our params, the Hugging Face tensors it is made of and the two
conversions. torch's Linear stores [out, in], our kernels (in, out...): import transposes.

    >>> config, params = import_hf("path/to/SmolLM2-135M")         # config.json + *.safetensors
    >>> logits = GPT(config).apply({"params": params}, tokens)
    >>> export_hf(config, params, "out/", "llama")    # AutoModelForCausalLM.from_pretrained("out/") loads it

A checkpoint split into shards (model.safetensors.index.json) is read one shard at a time. Every key
and shape is checked and the offending one named; a family or option we lack is one error naming
what is supported.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

from transformer import layers, tokenizers
from transformer.errors import CheckpointError, ConfigError
from transformer.models import hf_files
from transformer.models.gpt import GPTConfig, param_shapes
from transformer.models.hf_gpt2 import export_hf_gpt2, import_hf_gpt2

# model_type (config.json) -> the weight format its tensors are stored in.
FORMATS = {
  "llama": "llama",
  "mistral": "llama",
  "qwen2": "llama",
  "qwen3": "llama",
  "gemma": "llama",
  "gemma2": "gemma2",
  "gemma3_text": "gemma2",
  "olmo2": "olmo2",
  "gpt_neox": "gpt_neox",
}
# Each format's norms: ours -> the name of the Hugging Face module.
_NORMS = {
  "llama": {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm"},
  "gemma2": {
    "ln_1": "input_layernorm",
    "ln_attn_out": "post_attention_layernorm",
    "ln_2": "pre_feedforward_layernorm",
    "ln_mlp_out": "post_feedforward_layernorm",
  },
  "olmo2": {"ln_attn_out": "post_attention_layernorm", "ln_mlp_out": "post_feedforward_layernorm"},
}
# transformers' defaults for what a config.json may leave out.
_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3_text", "qwen3"}
_ROPE_TYPES = {"default": "none", "linear": "linear", "llama3": "llama3", "yarn": "yarn"}
# Buffers older checkpoints carry (causal masks, rotary tables), not parameters.
_IGNORED = re.compile(r"(\.attention\.(bias|masked_bias)|\.rotary_emb\.inv_freq)$")


# The published shapes (their config.json's fields that matter here) of the checkpoints the field studies,
# for planning and training from scratch at their size (`shape`; experiments/families.py).
SHAPES = {
  "llama3-8b": dict(
    model_type="llama",
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=8192,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
  ),
  "llama3.2-1b": dict(
    model_type="llama",
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    rope_scaling=dict(
      rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
    ),
  ),
  "smollm2-135m": dict(
    model_type="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
  ),
  "mistral-7b": dict(
    model_type="mistral",
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=32768,
    sliding_window=4096,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
  ),
  "qwen3-0.6b": dict(
    model_type="qwen3",
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
  ),
  "gemma2-2b": dict(
    model_type="gemma2",
    vocab_size=256000,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=26,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    max_position_embeddings=8192,
    sliding_window=4096,
    query_pre_attn_scalar=256,
    attn_logit_softcapping=50.0,
    final_logit_softcapping=30.0,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    tie_word_embeddings=True,
  ),
  "pythia-70m": dict(
    model_type="gpt_neox",
    vocab_size=50304,
    hidden_size=512,
    intermediate_size=2048,
    num_hidden_layers=6,
    num_attention_heads=8,
    rotary_pct=0.25,
    rotary_emb_base=10000,
    max_position_embeddings=2048,
    use_parallel_residual=True,
    layer_norm_eps=1e-5,
    hidden_act="gelu",
    tie_word_embeddings=False,
  ),
  "olmo2-1b": dict(
    model_type="olmo2",
    vocab_size=100352,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=16,
    num_key_value_heads=16,
    max_position_embeddings=4096,
    rope_theta=500000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
  ),
}


def shape(name: str, **overrides) -> GPTConfig:
  """The GPTConfig of a published checkpoint's shape (SHAPES), with `overrides` (dtype, scan_layers, ...)."""
  if name not in SHAPES:
    raise ConfigError(f"unknown model shape {name!r}; choose one of {', '.join(SHAPES)}")
  return config_from_hf(SHAPES[name], name).replace(**overrides).check()


def supported() -> str:
  return ", ".join(FORMATS)


def is_family(directory: str | Path) -> bool:
  """A directory whose config.json names one of FORMATS' model types."""
  path = Path(directory) / "config.json"
  try:
    return json.loads(path.read_text()).get("model_type") in FORMATS
  except (OSError, ValueError, AttributeError):
    return False


# --- config.json -> GPTConfig ---


def config_from_hf(hf: dict, where: str = "config.json") -> GPTConfig:
  """The GPTConfig of a Hugging Face config.json (as a dict) of one of FORMATS' model types."""
  model_type = hf.get("model_type")
  if model_type not in FORMATS:
    raise CheckpointError(
      f"{where}: model_type {model_type!r} is not one we open; supported: {supported()} (and gpt2, marian)"
    )
  H = hf["num_attention_heads"]
  window, global_layers = _windows(hf, model_type)
  gemma, stored = model_type.startswith("gemma"), _stored_dtype(hf, where)
  block = layers.BlockConfig(
    d_model=hf["hidden_size"],
    num_heads=H,
    # 0 where the family's value is our default (as many kv heads as heads, heads d_model/H wide)
    num_kv_heads=0 if hf.get("num_key_value_heads", H) in (H, None) else hf["num_key_value_heads"],
    d_head=0 if hf.get("head_dim", 0) in (0, None, hf["hidden_size"] // H) else hf["head_dim"],
    d_mlp=hf["intermediate_size"],
    layer_norm_epsilon=hf.get("rms_norm_eps", hf.get("layer_norm_eps", 1e-6)),
    norm="layer_norm" if model_type == "gpt_neox" else "rms_norm",
    norm_offset=1.0 if gemma else 0.0,
    use_bias=model_type == "gpt_neox",
    qkv_bias=model_type == "qwen2",
    activation=_activation(hf, model_type, where),
    qk_norm=model_type in ("qwen3", "olmo2", "gemma3_text"),
    qk_norm_over="heads" if model_type == "olmo2" else "head",
    attention_scale=hf["query_pre_attn_scalar"] ** -0.5 if model_type in ("gemma2", "gemma3_text") else 0.0,
    attention_softcap=hf.get("attn_logit_softcapping") or 0.0,
    sliding_window=window,
    parallel=model_type == "gpt_neox" and hf.get("use_parallel_residual", True),
    branch_norms={"gemma2": "pre_post", "gemma3_text": "pre_post", "olmo2": "post"}.get(model_type, "pre"),
    rotary=_rotary(hf, model_type, where),
    attention="einsum" if hf.get("attn_logit_softcapping") else "xla",
    dtype=stored,
    param_dtype=stored,
  )
  _refuse_unsupported(hf, model_type, where)
  return GPTConfig(
    vocab_size=hf["vocab_size"],
    max_len=hf.get("max_position_embeddings", 2048),
    num_layers=hf["num_hidden_layers"],
    block=block,
    positions="rope",
    tie_embeddings=hf.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT),
    logits_softcap=hf.get("final_logit_softcapping") or 0.0,
    global_layers=global_layers,
    scale_embeddings=gemma,
  )


def _stored_dtype(hf: dict, where: str) -> str:
  """The dtype the checkpoint's weights are stored in (config.json's dtype, torch_dtype before
  transformers 5): the params' and the computation's, as transformers runs it."""
  stored = hf.get("dtype") or hf.get("torch_dtype") or "float32"
  if stored not in ("float32", "bfloat16", "float16"):
    raise CheckpointError(f"{where}: dtype {stored!r} is not one we load; supported: float32, bfloat16, float16")
  return stored


def _activation(hf: dict, model_type: str, where: str) -> str:
  """Our block.activation for the family's hidden_act (hidden_activation: Gemma's)."""
  act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
  if model_type == "gemma" and hf.get("hidden_activation") is None:
    act = "gelu_pytorch_tanh"  # what transformers runs for Gemma 1 configs that say "gelu"
  if model_type == "gpt_neox":
    table = {"gelu": "gelu_erf", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}
  else:  # a gated MLP: silu(gate) (Llama's SwiGLU) or gelu(gate) (Gemma's GeGLU)
    table = {"silu": "swiglu", "swish": "swiglu", "gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"}
  if act not in table:
    raise CheckpointError(
      f"{where}: hidden_act {act!r} of a {model_type} is not one we run; supported: {', '.join(table)}"
    )
  return table[act]


def _rope_parameters(hf: dict, layer_type: str | None = None) -> dict:
  """The rotary parameters of config.json, in either of its forms: transformers 5's rope_parameters
  (per layer type for Gemma 3), or rope_theta with rope_scaling (the Hub's older files)."""
  params = hf.get("rope_parameters")
  if params and layer_type and layer_type in params:
    return params[layer_type]
  if params and "full_attention" not in params:
    return params
  scaling = dict(hf.get("rope_scaling") or {})
  theta = hf.get("rope_theta", hf.get("rotary_emb_base", 10000.0))
  if layer_type == "sliding_attention":
    return {"rope_theta": hf.get("rope_local_base_freq", 10000.0), "rope_type": "default"}
  return {"rope_theta": theta, **scaling}


def _rotary(hf: dict, model_type: str, where: str) -> layers.RotaryConfig:
  gemma3 = model_type == "gemma3_text"
  p = _rope_parameters(hf, "full_attention" if gemma3 else None)
  kind = p.get("rope_type") or p.get("type") or "default"
  if kind not in _ROPE_TYPES:
    raise CheckpointError(
      f"{where}: rope type {kind!r} is not one we compute; supported: {', '.join(_ROPE_TYPES)} "
      f"(rope_parameters / rope_scaling)"
    )
  fraction = p.get("partial_rotary_factor") or hf.get("partial_rotary_factor") or hf.get("rotary_pct")
  if fraction is None:
    fraction = 0.25 if model_type == "gpt_neox" else 1.0
  original = p.get("original_max_position_embeddings") or 0
  if kind == "yarn" and not original:
    original = hf.get("max_position_embeddings", 0)
  return layers.RotaryConfig(
    theta=float(p.get("rope_theta", 10000.0)),
    fraction=float(fraction),
    scaling=_ROPE_TYPES[kind],
    factor=float(p.get("factor") or 1.0),
    original_max_len=int(original),
    low_freq_factor=float(p.get("low_freq_factor", 1.0)),
    high_freq_factor=float(p.get("high_freq_factor", 4.0)),
    beta_fast=float(p.get("beta_fast") or 32.0),
    beta_slow=float(p.get("beta_slow") or 1.0),
    attention_factor=float(p.get("attention_factor") or 0.0),
    local_theta=float(_rope_parameters(hf, "sliding_attention")["rope_theta"]) if gemma3 else 0.0,
  )


def _windows(hf: dict, model_type: str) -> tuple[int, tuple[int, ...]]:
  """(block.sliding_window, global_layers): layer_types when config.json lists them, else each
  family's rule (Gemma 2: the even layers local; Gemma 3: all but every sixth; Mistral: all; Qwen2:
  from max_window_layers on, when use_sliding_window)."""
  L = hf["num_hidden_layers"]
  types = hf.get("layer_types")
  if types is None:
    if model_type == "gemma2":
      types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)]
    elif model_type == "gemma3_text":
      pattern = hf.get("sliding_window_pattern", 6)
      types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(L)]
    elif model_type in ("qwen2", "qwen3"):
      start = hf.get("max_window_layers", L) if hf.get("use_sliding_window") else L
      types = ["sliding_attention" if i >= start else "full_attention" for i in range(L)]
    else:
      types = ["sliding_attention" if hf.get("sliding_window") else "full_attention"] * L
  if "sliding_attention" not in types or not hf.get("sliding_window"):
    return 0, ()
  full = tuple(i for i, kind in enumerate(types) if kind == "full_attention")
  return int(hf["sliding_window"]), full


def _refuse_unsupported(hf: dict, model_type: str, where: str) -> None:
  """One error for a config.json option these tables do not compute."""
  refused = []
  if model_type != "gpt_neox" and hf.get("attention_bias") and model_type != "qwen2":
    refused.append("attention_bias=true (biases on q, k, v and the output)")
  if hf.get("mlp_bias"):
    refused.append("mlp_bias=true")
  if model_type == "gpt_neox" and not hf.get("attention_bias", True):
    refused.append("attention_bias=false (GPT-NeoX's MLP keeps its biases)")
  if hf.get("use_bidirectional_attention"):
    refused.append("use_bidirectional_attention=true")
  if refused:
    raise CheckpointError(f"{where}: a {model_type} with {', '.join(refused)} is not one we run")


# --- the mapping tables ---


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One of our params (`ours`, its path) and the Hugging Face tensors it is made of (`keys`, of
  `shapes`): `to_ours(arrays) -> array` on import, `to_hf(array) -> arrays` on export."""

  ours: tuple[str, ...]
  keys: tuple[str, ...]
  shapes: tuple[tuple[int, ...], ...]
  to_ours: Callable
  to_hf: Callable


def _as_is(ours, key, shape) -> Tensor:
  return Tensor(ours, (key,), (shape,), lambda ws: ws[0], lambda x: [x])


def _linear(ours, key, out_in, shape) -> Tensor:
  """A torch Linear's weight [out, in] as our kernel of `shape` (in..., out...)."""
  return Tensor(ours, (key,), (out_in,), lambda ws: ws[0].T.reshape(shape), lambda x: [x.reshape(out_in[::-1]).T])


def _vector(ours, key, shape) -> Tensor:
  n = int(np.prod(shape))
  return Tensor(ours, (key,), ((n,),), lambda ws: ws[0].reshape(shape), lambda x: [x.reshape(n)])


def _stacked(ours, keys, out_ins, shape) -> Tensor:
  """Linears stacked on our kernel's axis 1 (q, k, v -> qkv: D x 3 x H x K; k, v -> kv)."""
  D, per = shape[0], shape[2:]
  return Tensor(
    ours,
    keys,
    out_ins,
    lambda ws: np.stack([w.T.reshape(D, *per) for w in ws], axis=1),
    lambda x: [x[:, i].reshape(D, -1).T for i in range(len(keys))],
  )


def _stacked_bias(ours, keys, shape) -> Tensor:
  n = int(np.prod(shape[1:]))
  return Tensor(
    ours,
    keys,
    ((n,),) * len(keys),
    lambda ws: np.stack([w.reshape(shape[1:]) for w in ws]),
    lambda x: [x[i].reshape(n) for i in range(len(keys))],
  )


def _layout(cfg: GPTConfig, fmt: str) -> Iterator[Tensor]:
  """Every param of a GPT of `cfg` as the format `fmt` stores it."""
  if fmt == "gpt_neox":
    yield from _neox_layout(cfg)
    return
  b = cfg.block
  D, V, F, L = b.d_model, cfg.vocab_size, b.mlp_width, cfg.num_layers
  H, G, K = b.num_heads, b.kv_heads, b.head_dim
  yield _as_is(("wte", "embedding"), "model.embed_tokens.weight", (V, D))
  for i in range(L):
    p, h = ("h", f"layer_{i}"), f"model.layers.{i}"
    for ours, theirs in _NORMS[fmt].items():
      yield _vector((*p, ours, "scale"), f"{h}.{theirs}.weight", (D,))
    a = f"{h}.self_attn"
    names = tuple(f"{a}.{x}_proj" for x in "qkv")
    if G == H:
      yield _stacked(
        (*p, "attn", "qkv", "kernel"), tuple(f"{n}.weight" for n in names), ((H * K, D),) * 3, (D, 3, H, K)
      )
      if b.qkv_bias:
        yield _stacked_bias((*p, "attn", "qkv", "bias"), tuple(f"{n}.bias" for n in names), (3, H, K))
    else:
      yield _linear((*p, "attn", "q", "kernel"), f"{names[0]}.weight", (H * K, D), (D, H, K))
      yield _stacked(
        (*p, "attn", "kv", "kernel"), tuple(f"{n}.weight" for n in names[1:]), ((G * K, D),) * 2, (D, 2, G, K)
      )
      if b.qkv_bias:
        yield _vector((*p, "attn", "q", "bias"), f"{names[0]}.bias", (H, K))
        yield _stacked_bias((*p, "attn", "kv", "bias"), tuple(f"{n}.bias" for n in names[1:]), (2, G, K))
    yield _linear((*p, "attn", "out", "kernel"), f"{a}.o_proj.weight", (D, H * K), (H, K, D))
    if b.qk_norm:
      q, k = ((H * K,), (G * K,)) if b.qk_norm_over == "heads" else ((K,), (K,))
      yield _vector((*p, "attn", "q_norm", "scale"), f"{a}.q_norm.weight", q)
      yield _vector((*p, "attn", "k_norm", "scale"), f"{a}.k_norm.weight", k)
    m = f"{h}.mlp"
    yield _linear((*p, "mlp", "fc", "kernel"), f"{m}.up_proj.weight", (F, D), (D, F))
    yield _linear((*p, "mlp", "gate", "kernel"), f"{m}.gate_proj.weight", (F, D), (D, F))
    yield _linear((*p, "mlp", "proj", "kernel"), f"{m}.down_proj.weight", (D, F), (F, D))
  yield _vector(("ln_f", "scale"), "model.norm.weight", (D,))
  if not cfg.tie_embeddings:
    yield _linear(("lm_head", "kernel"), "lm_head.weight", (V, D), (D, V))


def _neox_layout(cfg: GPTConfig) -> Iterator[Tensor]:
  """GPT-NeoX (Pythia): q, k, v fused per head ([H x (q, k, v) x K, D] rows), LayerNorms with biases."""
  b = cfg.block
  D, V, F, H, K = b.d_model, cfg.vocab_size, b.mlp_width, b.num_heads, b.head_dim
  yield _as_is(("wte", "embedding"), "gpt_neox.embed_in.weight", (V, D))
  for i in range(cfg.num_layers):
    p, h = ("h", f"layer_{i}"), f"gpt_neox.layers.{i}"
    for ours, theirs in (("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm")):
      yield _vector((*p, ours, "scale"), f"{h}.{theirs}.weight", (D,))
      yield _vector((*p, ours, "bias"), f"{h}.{theirs}.bias", (D,))
    qkv = f"{h}.attention.query_key_value"
    yield Tensor(
      (*p, "attn", "qkv", "kernel"),
      (f"{qkv}.weight",),
      ((3 * D, D),),
      lambda ws: ws[0].reshape(H, 3, K, D).transpose(3, 1, 0, 2),
      lambda x: [x.transpose(2, 1, 3, 0).reshape(3 * H * K, D)],
    )
    yield Tensor(
      (*p, "attn", "qkv", "bias"),
      (f"{qkv}.bias",),
      ((3 * D,),),
      lambda ws: ws[0].reshape(H, 3, K).transpose(1, 0, 2),
      lambda x: [x.transpose(1, 0, 2).reshape(-1)],
    )
    yield _linear((*p, "attn", "out", "kernel"), f"{h}.attention.dense.weight", (D, H * K), (H, K, D))
    yield _vector((*p, "attn", "out", "bias"), f"{h}.attention.dense.bias", (D,))
    yield _linear((*p, "mlp", "fc", "kernel"), f"{h}.mlp.dense_h_to_4h.weight", (F, D), (D, F))
    yield _vector((*p, "mlp", "fc", "bias"), f"{h}.mlp.dense_h_to_4h.bias", (F,))
    yield _linear((*p, "mlp", "proj", "kernel"), f"{h}.mlp.dense_4h_to_h.weight", (D, F), (F, D))
    yield _vector((*p, "mlp", "proj", "bias"), f"{h}.mlp.dense_4h_to_h.bias", (D,))
  yield _vector(("ln_f", "scale"), "gpt_neox.final_layer_norm.weight", (D,))
  yield _vector(("ln_f", "bias"), "gpt_neox.final_layer_norm.bias", (D,))
  if not cfg.tie_embeddings:
    yield _linear(("lm_head", "kernel"), "embed_out.weight", (V, D), (D, V))


# --- reading and writing ---


def read_model_config(directory: str | Path) -> GPTConfig:
  """The GPTConfig of a Hugging Face language model's directory: a family's from its config.json alone
  (no weights read); GPT-2's from its tensors' shapes (import_lm)."""
  if not is_family(directory):
    return import_lm(directory)[0]
  return config_from_hf(hf_files.read_config(directory), str(Path(directory) / "config.json"))


def import_hf(path: str | Path, shardings=None, **overrides) -> tuple[GPTConfig, dict]:
  """Loads a Hugging Face checkpoint of one of FORMATS' model types (config.json and its safetensors,
  one file or shards, read one at a time). The params keep the checkpoint's stored dtype (config.json's
  dtype: a bfloat16 model is never a float32 copy on the host); `shardings` (a tree like the params'
  of `jax.sharding.Sharding`s), when given, places each param on its shards as soon as it is read.
  `overrides` change fields that do not alter shapes (param_dtype, dtype, attention, scan_layers,
  max_len, ...). Returns (config, params)."""
  directory = Path(path)
  hf = hf_files.read_config(directory)
  scan = overrides.pop("scan_layers", False)
  cfg = config_from_hf(hf, str(directory / "config.json")).replace(**overrides).check()
  entries = list(_layout(cfg, FORMATS[hf["model_type"]]))
  wanted = {key: (entry, shape) for entry in entries for key, shape in zip(entry.keys, entry.shapes)}
  dtypes = jax.tree.map(lambda x: x.dtype, nn.unbox(param_shapes(cfg)))
  place = (
    (lambda ours, x: jax.device_put(x, hf_files.get_path(shardings, ours))) if shardings and not scan else _on_device
  )
  params, pieces = {}, {}
  for file in hf_files.shard_files(directory):
    for key, value in _tensors(file, cfg):
      entry, shape = _checked(key, value, wanted, file, cfg, hf["model_type"])
      pieces[key] = value
      if all(k in pieces for k in entry.keys):  # every piece of this param read: convert and place it
        value = entry.to_ours([pieces.pop(k) for k in entry.keys])
        value = np.ascontiguousarray(
          value, hf_files.get_path(dtypes, entry.ours)
        )  # (a strided one costs a device program)
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


def import_lm(path: str | Path, **overrides) -> tuple[GPTConfig, dict]:
  """A Hugging Face language model's directory, whichever format: an open family's (`import_hf`) or
  GPT-2's (hf_gpt2.import_hf_gpt2)."""
  return import_hf(path, **overrides) if is_family(path) else import_hf_gpt2(path, **overrides)


def _tensors(file: Path, cfg: GPTConfig) -> Iterator[tuple[str, np.ndarray]]:
  """(key, array) of one safetensors file, less the buffers and a tied model's copy of its embedding."""
  tied = cfg.tie_embeddings
  skip = lambda key: _IGNORED.search(key) or (tied and key in ("lm_head.weight", "embed_out.weight"))
  return hf_files.read_tensors(file, skip)


# --- export ---

_ARCHITECTURES = {
  "llama": "LlamaForCausalLM",
  "mistral": "MistralForCausalLM",
  "qwen2": "Qwen2ForCausalLM",
  "qwen3": "Qwen3ForCausalLM",
  "gemma": "GemmaForCausalLM",
  "gemma2": "Gemma2ForCausalLM",
  "gemma3_text": "Gemma3ForCausalLM",
  "olmo2": "Olmo2ForCausalLM",
  "gpt_neox": "GPTNeoXForCausalLM",
}
_ROPE_NAMES = {ours: theirs for theirs, ours in _ROPE_TYPES.items()}


def _rope_export(r: layers.RotaryConfig, local: bool = False) -> dict:
  if local:
    return {"rope_type": "default", "rope_theta": r.local_theta}
  out = {"rope_type": _ROPE_NAMES[r.scaling], "rope_theta": r.theta}
  if r.fraction != 1.0:
    out["partial_rotary_factor"] = r.fraction
  if r.scaling != "none":
    out["factor"] = r.factor
  if r.scaling in ("llama3", "yarn"):
    out["original_max_position_embeddings"] = r.original_max_len
  if r.scaling == "llama3":
    out.update(low_freq_factor=r.low_freq_factor, high_freq_factor=r.high_freq_factor)
  if r.scaling == "yarn":
    out.update(beta_fast=r.beta_fast, beta_slow=r.beta_slow)
    if r.attention_factor:
      out["attention_factor"] = r.attention_factor
  return out


def export_config(cfg: GPTConfig, model_type: str) -> dict:
  """The config.json transformers reads (its 5.x form, rope_parameters) for `cfg` as a `model_type`,
  its weights stored in the params' dtype (block.param_dtype)."""
  if model_type not in FORMATS:
    raise ConfigError(f"no weight format for model_type {model_type!r}; supported: {supported()}")
  b = cfg.block
  hf = {
    "architectures": [_ARCHITECTURES[model_type]],
    "model_type": model_type,
    "vocab_size": cfg.vocab_size,
    "hidden_size": b.d_model,
    "intermediate_size": b.mlp_width,
    "num_hidden_layers": cfg.num_layers,
    "num_attention_heads": b.num_heads,
    "num_key_value_heads": b.kv_heads,
    "head_dim": b.head_dim,
    "max_position_embeddings": cfg.max_len,
    "tie_word_embeddings": cfg.tie_embeddings,
    "attention_dropout": b.attention_dropout_rate,
    "dtype": b.param_dtype,
  }
  if model_type == "gpt_neox":
    hf.update(layer_norm_eps=b.layer_norm_epsilon, use_parallel_residual=b.parallel, attention_bias=True)
    hf["hidden_act"] = {"gelu_erf": "gelu", "gelu_tanh": "gelu_new"}.get(b.activation, b.activation)
  else:
    hf.update(rms_norm_eps=b.layer_norm_epsilon, attention_bias=False)
    hf["hidden_act"] = {"swiglu": "silu", "geglu": "gelu_pytorch_tanh"}.get(b.activation, b.activation)
  if model_type.startswith("gemma"):
    hf["hidden_activation"] = hf["hidden_act"]
  if model_type in ("gemma2", "gemma3_text"):
    scalar = b.attention_scale**-2 if b.attention_scale else b.head_dim
    hf["query_pre_attn_scalar"] = (
      round(scalar) if abs(scalar - round(scalar)) < 1e-6 else scalar
    )  # an int in their config
    hf["attn_logit_softcapping"] = b.attention_softcap or None
    hf["final_logit_softcapping"] = cfg.logits_softcap or None
  if b.sliding_window:
    hf["sliding_window"] = b.sliding_window
    hf["layer_types"] = [
      "full_attention" if i in cfg.global_layers else "sliding_attention" for i in range(cfg.num_layers)
    ]
    hf["use_sliding_window"] = True
    hf["max_window_layers"] = 0
  if model_type == "gemma3_text":
    local = _rope_export(b.rotary, local=True)
    hf["rope_parameters"] = {"full_attention": _rope_export(b.rotary), "sliding_attention": local}
  else:
    hf["rope_parameters"] = _rope_export(b.rotary)
  return hf


def export_hf(config: GPTConfig, params: dict, out_dir: str | Path, model_type: str) -> Path:
  """Writes config.json + model.safetensors that transformers' AutoModelForCausalLM loads as
  `model_type`. A model the format cannot hold is refused, each such field named: what is written must
  read back (as `import_hf` reads it) as this model."""
  hf = export_config(config, model_type)
  theirs = config_from_hf(hf, "the export")
  other = hf_files.differences(config, theirs, model_type, hf_files.FREE)
  if other:
    raise ConfigError(f"the Hugging Face {model_type} format cannot hold this model: {'; '.join(other)}")
  params = nn.unbox(params)
  if config.scan_layers:
    params = {**params, "h": layers.unstack_layers(params["h"], config.num_layers)}
  tensors = {}
  for entry in _layout(config, FORMATS[model_type]):
    value = np.asarray(
      jax.device_get(hf_files.get_path(params, entry.ours))
    )  # in its dtype: a bfloat16 model stays one
    for key, array in zip(entry.keys, entry.to_hf(value)):
      tensors[key] = np.ascontiguousarray(array)
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  hf_files.save_safetensors(tensors, out_dir / "model.safetensors")
  (out_dir / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
  return out_dir


def export_lm(config: GPTConfig, params: dict, out_dir: str | Path, model_type: str, tokenizer=None) -> Path:
  """A language model written as a Hugging Face directory of `model_type` (one of FORMATS', or gpt2),
  with the tokenizer's tokenizer.json and tokenizer_config.json when it has them (an HFTokenizer): what
  `launch.sample --export` writes. Refused, before anything is written, where the format cannot hold it."""
  out_dir = Path(out_dir)
  if model_type == "gpt2":
    export_hf_gpt2(config, params, out_dir)
  else:
    export_hf(config, params, out_dir, model_type)
  if isinstance(tokenizer, tokenizers.HFTokenizer):
    tokenizer.save(out_dir)
  return out_dir
