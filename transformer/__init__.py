"""A JAX/Flax research codebase for GPT-2 language models and encoder-decoder translation.

Importing it turns on JAX's persistent compilation cache in a per-user directory (`transformer.compile_cache`:
a second run on the same shapes compiles nothing again; TRANSFORMER_COMPILATION_CACHE=off keeps it off, and a
cache the process set itself is kept) and changes nothing else process-wide. The launch programs
(`transformer.cli.run`) also set glibc's allocator to keep XLA:CPU's freed blocks mapped (`transformer.hostmem`);
a notebook or another program that trains on a CPU can do the same by calling
`transformer.hostmem.keep_freed_blocks()` before its first computation.
"""

from transformer import compile_cache as _compile_cache

_compile_cache.enable()
