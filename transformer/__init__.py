"""A JAX/Flax research codebase for GPT-2 language models and encoder-decoder translation."""
