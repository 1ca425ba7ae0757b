"""A JAX/Flax research codebase for GPT-2 language models and encoder-decoder translation."""

# First, before any of XLA's threads allocates: keeps the temporary block of every XLA:CPU call
# mapped for the next one (hostmem.py says why and how to turn it off).
from transformer import hostmem as _hostmem

_hostmem.keep_freed_blocks()
