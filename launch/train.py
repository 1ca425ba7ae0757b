r"""Trains a model: parses flags, calls `transformer.train.train_and_evaluate(config, workdir)`.

  python -m launch.train --config=experiments/shakespeare.py:char --workdir=workdirs/char
  python -m launch.train --config=experiments/shakespeare.py:char --workdir=workdirs/char \
      --config.optimizer.lr=3e-4 --config.num_train_steps=3000
Running it again with the same --workdir resumes from the latest checkpoint.
"""

import jax
from absl import flags
from ml_collections import config_flags

from transformer import cli, train

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/shakespeare.py:char",
                                          "Experiment config file:preset.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/shakespeare-char", "Where checkpoints, metrics and "
                               "samples go; an existing one is resumed.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "Multi-process: host:port of process 0. "
                                   "On TPU pods and SLURM/Kubernetes GPU clusters pass --distributed instead.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-process: how many processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-process: this process's index.")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() with the "
                                 "cluster's auto-detected settings.")


def main(argv):
  del argv
  if _COORDINATOR.value:
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  elif _DISTRIBUTED.value:
    jax.distributed.initialize()
  train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  cli.run(main)
