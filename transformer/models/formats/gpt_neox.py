"""GPT-NeoX (Pythia): LayerNorms with biases, a parallel block (attention and MLP read the same stream),
rotary positions on a quarter of each head, q/k/v fused per head, a GELU MLP with biases."""

from __future__ import annotations

from collections.abc import Iterator

from transformer.models.formats.base import Tensor, as_is, linear, vector
from transformer.models.formats.decoder import DecoderFormat
from transformer.models.gpt import GPTConfig


def neox_layout(fmt: DecoderFormat, cfg: GPTConfig) -> Iterator[Tensor]:
  """q, k, v fused per head ([H x (q, k, v) x K, D] rows), LayerNorms with biases."""
  b = cfg.block
  D, V, F, H, K = b.d_model, cfg.vocab_size, b.mlp_width, b.num_heads, b.head_dim
  yield as_is(("wte", "embedding"), "gpt_neox.embed_in.weight", (V, D))
  for i in range(cfg.num_layers):
    p, h = ("h", f"layer_{i}"), f"gpt_neox.layers.{i}"
    for ours, theirs in (("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm")):
      yield vector((*p, ours, "scale"), f"{h}.{theirs}.weight", (D,))
      yield vector((*p, ours, "bias"), f"{h}.{theirs}.bias", (D,))
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
    yield linear((*p, "attn", "out", "kernel"), f"{h}.attention.dense.weight", (D, H * K), (H, K, D))
    yield vector((*p, "attn", "out", "bias"), f"{h}.attention.dense.bias", (D,))
    yield linear((*p, "mlp", "fc", "kernel"), f"{h}.mlp.dense_h_to_4h.weight", (F, D), (D, F))
    yield vector((*p, "mlp", "fc", "bias"), f"{h}.mlp.dense_h_to_4h.bias", (F,))
    yield linear((*p, "mlp", "proj", "kernel"), f"{h}.mlp.dense_4h_to_h.weight", (D, F), (F, D))
    yield vector((*p, "mlp", "proj", "bias"), f"{h}.mlp.dense_4h_to_h.bias", (D,))
  yield vector(("ln_f", "scale"), "gpt_neox.final_layer_norm.weight", (D,))
  yield vector(("ln_f", "bias"), "gpt_neox.final_layer_norm.bias", (D,))
  if not cfg.tie_embeddings:
    yield linear(("lm_head", "kernel"), "embed_out.weight", (V, D), (D, V))


# hidden_act -> ours: GELU by its erf, or by tanh (what gelu_new and gelu_fast compute too).
_ACTIVATIONS = {"gelu": "gelu_erf", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}


def _attention_biases(hf: dict) -> list[str]:
  return [] if hf.get("attention_bias", True) else ["attention_bias=false (GPT-NeoX's MLP keeps its biases)"]


FORMATS = (
  DecoderFormat(
    "gpt_neox",
    "GPTNeoXForCausalLM",
    neox_layout,
    extra_keys=frozenset({"rotary_pct", "rotary_emb_base", "use_parallel_residual"}),
    activations=(
      ("gelu", "gelu_erf"),
      ("gelu_new", "gelu_tanh"),
      ("gelu_pytorch_tanh", "gelu_tanh"),
      ("gelu_fast", "gelu_tanh"),
    ),
    norm="layer_norm",
    use_bias=True,
    parallel_key=True,
    rotary_fraction=0.25,
    refused=_attention_biases,
  ),
)
