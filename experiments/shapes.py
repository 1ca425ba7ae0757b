"""The published shapes of the checkpoints the field studies (their config.json's fields that matter here):
data for planning and training from scratch at their size (experiments/families.py, launch.bench), read
by the one GPT through the formats' config readers (transformer.models.formats)."""

from transformer.errors import ConfigError
from transformer.models import formats
from transformer.models.gpt import GPTConfig

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
  return formats.config_from_hf(SHAPES[name], name).replace(**overrides).check()
