r"""Benchmarks that print tables (medians of several runs). Speed is measured here, never in tests.

  python -m launch.bench --what=forward --preset=gpt2 --batch_sizes=1,8 --seq_len=1024
"""

import jax
import jax.numpy as jnp
from absl import flags

from transformer import benchmark, cli
from transformer.models import gpt

_WHAT = flags.DEFINE_enum("what", "forward", ["forward"], "Which benchmark.")
_PRESET = flags.DEFINE_string("preset", "gpt2", "GPT preset.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "8"], "Batch sizes.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 1024, "Sequence length.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats (the median is reported).")
_ATTENTION = flags.DEFINE_string("attention", "xla", "Attention implementation.")


def forward_table() -> str:
  cfg = gpt.preset(_PRESET.value, attention=_ATTENTION.value)
  model = gpt.GPT(cfg)
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
  apply = jax.jit(model.apply)
  rows = []
  for b in map(int, _BATCH_SIZES.value):
    tokens = jax.random.randint(jax.random.key(b), (b, _SEQ_LEN.value), 0, cfg.vocab_size)
    seconds = benchmark.median_seconds(lambda: apply(params, tokens), repeats=_REPEATS.value)
    rows.append([b, _SEQ_LEN.value, seconds * 1000, b * _SEQ_LEN.value / seconds])
  header = (f"{_PRESET.value} forward pass ({gpt.count_params(cfg):,} params, attention={_ATTENTION.value}, "
            f"{jax.devices()[0].device_kind}, median of {_REPEATS.value})")
  return header + "\n" + benchmark.table(["batch", "seq", "ms/forward", "tokens/s"], rows)


def main(argv):
  del argv
  print({"forward": forward_table}[_WHAT.value]())


if __name__ == "__main__":
  cli.run(main)
