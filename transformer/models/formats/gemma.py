"""Gemma 1, 2 and 3 (text): RMSNorm of (1 + w), embeddings scaled by √d_model, a GeGLU MLP, tied heads;
Gemma 2 and 3 add norms after each branch, the attention's scale from query_pre_attn_scalar, logit soft-caps
and sliding windows on alternate layers (Gemma 3: five of every six, with their own rotary base) and
Gemma 3 per-head q/k norms. Stored as Llama is (`llama.gated_layout`), with their norms' names."""

from __future__ import annotations

from transformer.models.formats.decoder import DecoderFormat, no_attention_bias
from transformer.models.formats.llama import gated_layout

_NORMS_1 = (("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm"))
_NORMS_2 = (
  ("ln_1", "input_layernorm"),
  ("ln_attn_out", "post_attention_layernorm"),
  ("ln_2", "pre_feedforward_layernorm"),
  ("ln_mlp_out", "post_feedforward_layernorm"),
)
_KEYS_2 = frozenset({"query_pre_attn_scalar"})
_KEYS_3 = _KEYS_2 | {"sliding_window_pattern", "_sliding_window_pattern", "rope_local_base_freq"}


def _even_local(hf: dict) -> list[str]:
  """Gemma 2: the even layers windowed, the odd ones full."""
  return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(hf["num_hidden_layers"])]


def _every_sixth_full(hf: dict) -> list[str]:
  """Gemma 3: every `sliding_window_pattern`-th layer full (6), the others windowed."""
  pattern = hf.get("sliding_window_pattern", 6)
  return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(hf["num_hidden_layers"])]


_GEMMA = dict(
  norm_offset=1.0, scale_embeddings=True, tied_by_default=True, writes_hidden_activation=True, refused=no_attention_bias
)
FORMATS = (
  DecoderFormat("gemma", "GemmaForCausalLM", gated_layout, _NORMS_1, default_activation="gelu_pytorch_tanh", **_GEMMA),
  DecoderFormat(
    "gemma2",
    "Gemma2ForCausalLM",
    gated_layout,
    _NORMS_2,
    _KEYS_2,
    branch_norms="pre_post",
    query_pre_attn_scalar=True,
    layer_types=_even_local,
    **_GEMMA,
  ),
  DecoderFormat(
    "gemma3_text",
    "Gemma3ForCausalLM",
    gated_layout,
    _NORMS_2,
    _KEYS_3,
    branch_norms="pre_post",
    query_pre_attn_scalar=True,
    qk_norm=True,
    local_rope=True,
    layer_types=_every_sixth_full,
    **_GEMMA,
  ),
)
