"""Model families, pure Flax linen modules (`init`/`apply`, no hidden state).

  gpt        decoder-only GPT-2 (language modelling); presets gpt2 ... gpt2-xl, cpu-small, cpu-tiny
  seq2seq    the encoder-decoder Transformer of "Attention Is All You Need" (translation)
  hf_gpt2    Hugging Face GPT-2 safetensors <-> GPT params

One call convention for every model, so that a task holds one model for training, evaluation and
decoding:
  - inputs are batch-major token ids, `*_BxT`;
  - padding masks are keyword arguments named `<what>_valid_BxT` (True = a real token);
  - `deterministic=True` (default) turns dropout off; training passes `deterministic=False` and
    `rngs={"dropout": key}`;
  - `decode=True` continues earlier calls through the KV cache (`mutable=["cache"]`);
  - the result is float32 logits `(B, T, V)` whatever the compute dtype.
"""
