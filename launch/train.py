r"""Trains a model: parses flags, calls `transformer.train.train_and_evaluate(config, workdir)`.

  python -m launch.train --config=experiments/shakespeare.py:char --workdir=workdirs/char
  python -m launch.train --config=experiments/shakespeare.py:char --workdir=workdirs/char \
      --config.optimizer.lr=3e-4 --config.num_train_steps=3000
Running it again with the same --workdir resumes from the latest checkpoint.
"""

from absl import flags
from ml_collections import config_flags

from transformer import cli, train

_CONFIG = config_flags.DEFINE_config_file(
  "config", "experiments/shakespeare.py:char", "Experiment config file:preset.", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
  "workdir", "workdirs/shakespeare-char", "Where checkpoints, metrics and samples go; an existing one is resumed."
)
_INIT_DISTRIBUTED = cli.define_distributed_flags()


def main(argv):
  del argv
  _INIT_DISTRIBUTED()
  train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  cli.run(main)
