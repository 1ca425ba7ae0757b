"""Llama and the families stored as it is (Mistral, Qwen2, Qwen3, SmolLM: model_type llama): RMSNorm,
rotary positions, a gated MLP, grouped-query attention; Qwen2's q/k/v biases, Qwen3's per-head q/k norms,
Mistral's and Qwen's sliding windows. `gated_layout` is the tensors of every family stored this way
(Gemma's and OLMo 2's too, with their own norms)."""

from __future__ import annotations

from collections.abc import Iterator

from transformer.models.formats.base import Tensor, as_is, linear, stacked, stacked_bias, vector
from transformer.models.formats.decoder import DecoderFormat, no_attention_bias
from transformer.models.gpt import GPTConfig


def gated_layout(fmt: DecoderFormat, cfg: GPTConfig) -> Iterator[Tensor]:
  """Every param of a GPT of `cfg` as a Llama-style checkpoint stores it (its norms named by `fmt.norms`)."""
  b = cfg.block
  D, V, F, L = b.d_model, cfg.vocab_size, b.mlp_width, cfg.num_layers
  H, G, K = b.num_heads, b.kv_heads, b.head_dim
  yield as_is(("wte", "embedding"), "model.embed_tokens.weight", (V, D))
  for i in range(L):
    p, h = ("h", f"layer_{i}"), f"model.layers.{i}"
    for ours, theirs in fmt.norms:
      yield vector((*p, ours, "scale"), f"{h}.{theirs}.weight", (D,))
    a = f"{h}.self_attn"
    names = tuple(f"{a}.{x}_proj" for x in "qkv")
    if G == H:
      yield stacked((*p, "attn", "qkv", "kernel"), tuple(f"{n}.weight" for n in names), ((H * K, D),) * 3, (D, 3, H, K))
      if b.qkv_bias:
        yield stacked_bias((*p, "attn", "qkv", "bias"), tuple(f"{n}.bias" for n in names), (3, H, K))
    else:
      yield linear((*p, "attn", "q", "kernel"), f"{names[0]}.weight", (H * K, D), (D, H, K))
      yield stacked(
        (*p, "attn", "kv", "kernel"), tuple(f"{n}.weight" for n in names[1:]), ((G * K, D),) * 2, (D, 2, G, K)
      )
      if b.qkv_bias:
        yield vector((*p, "attn", "q", "bias"), f"{names[0]}.bias", (H, K))
        yield stacked_bias((*p, "attn", "kv", "bias"), tuple(f"{n}.bias" for n in names[1:]), (2, G, K))
    yield linear((*p, "attn", "out", "kernel"), f"{a}.o_proj.weight", (D, H * K), (H, K, D))
    if b.qk_norm:
      q, k = ((H * K,), (G * K,)) if b.qk_norm_over == "heads" else ((K,), (K,))
      yield vector((*p, "attn", "q_norm", "scale"), f"{a}.q_norm.weight", q)
      yield vector((*p, "attn", "k_norm", "scale"), f"{a}.k_norm.weight", k)
    m = f"{h}.mlp"
    yield linear((*p, "mlp", "fc", "kernel"), f"{m}.up_proj.weight", (F, D), (D, F))
    yield linear((*p, "mlp", "gate", "kernel"), f"{m}.gate_proj.weight", (F, D), (D, F))
    yield linear((*p, "mlp", "proj", "kernel"), f"{m}.down_proj.weight", (D, F), (F, D))
  yield vector(("ln_f", "scale"), "model.norm.weight", (D,))
  if not cfg.tie_embeddings:
    yield linear(("lm_head", "kernel"), "lm_head.weight", (V, D), (D, V))


def qwen_windows(hf: dict) -> list[str]:
  """Qwen's rule: the layers from max_window_layers on windowed, when use_sliding_window."""
  L = hf["num_hidden_layers"]
  start = hf.get("max_window_layers", L) if hf.get("use_sliding_window") else L
  return ["sliding_attention" if i >= start else "full_attention" for i in range(L)]


_NORMS = (("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm"))

FORMATS = (
  DecoderFormat("llama", "LlamaForCausalLM", gated_layout, _NORMS, refused=no_attention_bias),
  DecoderFormat("mistral", "MistralForCausalLM", gated_layout, _NORMS, refused=no_attention_bias),
  DecoderFormat("qwen2", "Qwen2ForCausalLM", gated_layout, _NORMS, qkv_bias=True, layer_types=qwen_windows),
  DecoderFormat(
    "qwen3",
    "Qwen3ForCausalLM",
    gated_layout,
    _NORMS,
    qk_norm=True,
    tied_by_default=True,
    layer_types=qwen_windows,
    refused=no_attention_bias,
  ),
)
