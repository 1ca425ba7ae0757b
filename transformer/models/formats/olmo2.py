"""OLMo 2: norms after each branch (none before), q/k norms over all heads at once, stored as Llama is."""

from __future__ import annotations

from transformer.models.formats.decoder import DecoderFormat, no_attention_bias
from transformer.models.formats.llama import gated_layout

FORMATS = (
  DecoderFormat(
    "olmo2",
    "Olmo2ForCausalLM",
    gated_layout,
    (("ln_attn_out", "post_attention_layernorm"), ("ln_mlp_out", "post_feedforward_layernorm")),
    qk_norm=True,
    qk_norm_over="heads",
    branch_norms="post",
    refused=no_attention_bias,
  ),
)
