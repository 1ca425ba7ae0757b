"""Model families, pure Flax linen modules (`init`/`apply`, no hidden state).

  gpt        decoder-only GPT-2 (language modelling); presets gpt2 ... gpt2-xl, cpu-small, cpu-tiny
  seq2seq    the encoder-decoder Transformer of "Attention Is All You Need" (translation): the class
             `seq2seq.Transformer`, the paper's name for it (the package `transformer` is the library)
  encoder    the encoder-only Transformer (classification, tagging)
  lstm       stacked LSTMs, one-way or bidirectional: the recurrent baselines
  classifier heads on a body (gpt, encoder, lstm): a label per text or per token
  sae        sparse autoencoders on a point's activations (TopK, BatchTopK, JumpReLU, ReLU + L1) and transcoders;
             clt: cross-layer transcoders (CLTConfig)
  formats    Hugging Face checkpoints <-> our params and configs: one Format a model type (GPT-2, Marian, the
             open families: Llama ... OLMo 2), chosen by config.json's model_type
  hf_files   what the two weight formats share (writing model.safetensors)

A run's config.model names its family (`config.model.family`, `families()` below) and holds that
family's config fields; the task says which families it can train.

One call convention for every model, so that a task holds one model for training, evaluation and
decoding:
  - inputs are batch-major token ids, `*_BxT`;
  - padding masks are keyword arguments named `<what>_valid_BxT` (True = a real token);
  - packed training rows (several documents or sentence pairs a row) pass `<what>_segments_BxT`,
    which of them each token is of: attention stays inside one, whose positions start at 0;
  - `deterministic=True` (default) turns dropout off; training passes `deterministic=False` and
    `rngs={"dropout": key}`;
  - `decode=True` continues earlier calls through the KV cache (`mutable=["cache"]`);
  - the result is float32 logits `(B, T, V)` whatever the compute dtype.
"""

from transformer.models.encoder import EncoderConfig
from transformer.models.gpt import GPTConfig
from transformer.models.lstm import LSTMConfig
from transformer.models.sae import SAEConfig
from transformer.models.seq2seq import Seq2SeqConfig


def body_fields(config):
  """Where a model's width (d_model), dropout rate and dtypes are: an LSTM's own config, another
  family's block (config.model.block)."""
  return config if config.family == "lstm" else config.block


def families() -> dict[str, type]:
  """config.model.family -> its model config class."""
  return {c.family: c for c in (GPTConfig, Seq2SeqConfig, EncoderConfig, LSTMConfig, SAEConfig)}
