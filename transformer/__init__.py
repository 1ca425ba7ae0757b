"""A JAX/Flax research codebase for GPT-2 language models and encoder-decoder translation.

Importing it changes nothing process-wide. The launch programs (`transformer.cli.run`) set glibc's
allocator to keep XLA:CPU's freed blocks mapped (`transformer.hostmem`); a notebook or another
program that trains on a CPU can do the same by calling `transformer.hostmem.keep_freed_blocks()`
before its first computation.
"""
