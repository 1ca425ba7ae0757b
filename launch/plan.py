r"""Plans a run before it is launched: compiles the real train step (and a GPT's sampler) ahead of
time against abstract arrays, and prints per-device memory and FLOPs per step (transformer.plan).

  python -m launch.plan --config=experiments/gpt2.py:gpt2-xl --devices=8 --config.mesh.fsdp=8
  python -m launch.plan --config=experiments/gpt2.py:gpt2 --devices=8 --config.mesh.fsdp=8 \
      --config.model.remat_policy=dots --device_memory_gib=80      # the largest batch that fits

--devices=N plans on N fake CPU devices (no accelerator needed: nothing is allocated); without it,
on this machine's devices. --platform=gpu|tpu plans the program that platform runs (its forms of the
ops, transformer.kernels), also on fake CPU devices; the default is this machine's platform.
Every --config.* override of launch.train works here; the data is
prepared as for training (the tokenizer, and a classifier's classes, come from it). Multi-host: run
it in every process with launch.train's --coordinator_address/--num_processes/--process_id.
"""

import dataclasses
import json
from pathlib import Path

import jax
from absl import flags
from ml_collections import config_flags

from transformer import cli, inference, kernels, metrics, plan, tasks, train
from transformer.errors import ConfigError

_CONFIG = config_flags.DEFINE_config_file(
  "config", "experiments/shakespeare.py:char", "Experiment config file:preset.", lock_config=True
)
_DEVICES = flags.DEFINE_integer("devices", 0, "Plan on this many fake CPU devices; 0: this machine's devices.")
_MEMORY = flags.DEFINE_float(
  "device_memory_gib",
  0.0,
  "Per-device memory (GiB): search for the largest "
  "config.batch_size whose train step fits; 0: plan the config's batch only.",
)
_DECODE_BATCH = flags.DEFINE_integer(
  "decode_batch_size", 0, "Prompts in the GPT decode plan; 0: one per data-parallel device. -1: no decode plan."
)
_JSON = flags.DEFINE_string("json", None, "Also write the plans here as JSON (bytes per device, FLOPs per step).")
_PLATFORM = flags.DEFINE_enum(
  "platform",
  None,
  list(kernels.PLATFORMS),
  "The platform whose program is planned "
  "(default: this machine's): a GPU or TPU run compiles the accelerators' forms of the "
  "ops.",
)
_INIT_DISTRIBUTED = cli.define_distributed_flags()


def main(argv):
  del argv
  if _DEVICES.value:  # before anything asks jax for its devices
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", _DEVICES.value)
  _INIT_DISTRIBUTED()
  run_config = tasks.resolve(_CONFIG.value, num_devices=jax.device_count())
  lead = jax.process_index() == 0
  say = print if lead else (lambda *_, **__: None)
  run_config, notes = plan.for_platform(run_config, _PLATFORM.value or jax.default_backend())
  for note in notes:
    say(note)
  task_data = tasks.load_data(run_config, inference.load)
  run = train.build(run_config, task_data)
  say(f"devices: {metrics.device_summary()}\nmodel: {run.task.model_config}")
  budget = int(_MEMORY.value * plan.GIB) if _MEMORY.value else None
  plans = []
  if budget is None:
    plans.append(plan.plan_train(run))
    say(plan.describe(plans[-1]))
  else:
    multiple = plan.check_batch_rows(run_config)

    def build_run(batch_size: int) -> train.Run:
      changed = dataclasses.replace(
        run_config, task_config=dataclasses.replace(run_config.task_config, batch_size=batch_size)
      )
      changed.task_config.check(changed, changed.mesh.data_parallel)
      return train.build(changed, task_data)

    say(f"searching for the largest batch that fits in {_MEMORY.value:g} GiB per device (one compile each):")
    best, found = plan.largest_batch(
      build_run, multiple, budget, report=lambda p: say(plan.candidate(p, budget), flush=True)
    )
    plans.append(found)
    say(plan.describe(found, budget))
    if best is None:
      write_json(plans)
      raise ConfigError(plan.does_not_fit(found, budget))
    say(
      f"the largest batch that fits in {_MEMORY.value:g} GiB per device: --config.batch_size={best} "
      f"({best // multiple} sequences per device per microbatch)"
    )
  if _DECODE_BATCH.value >= 0 and plan.has_sampler(run):
    decode_batch = _DECODE_BATCH.value or run_config.mesh.data_parallel
    plans.append(plan.plan_decode(run, decode_batch))
    say(plan.describe(plans[-1], budget))
  write_json(plans)


def write_json(plans: list[plan.Plan]) -> None:
  if _JSON.value and jax.process_index() == 0:
    Path(_JSON.value).write_text(json.dumps([{**dataclasses.asdict(p), "total": p.total} for p in plans], indent=1))


if __name__ == "__main__":
  cli.run(main)
