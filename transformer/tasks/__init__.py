"""Tasks: what `train_and_evaluate` trains, chosen by `config.task` through this registry.

  lm              a GPT (or an LSTM) on a text corpus (tasks/lm.py)
  translation     the encoder-decoder Transformer on sentence pairs (tasks/translation.py)
  classification  a label per text: encoder, GPT (fine-tuned or not) or LSTM (tasks/classification.py)
  tagging         a label per word: encoder, BiLSTM, ... (tasks/tagging.py)
  sae             a sparse autoencoder on a model's activations at a named point (tasks/sae.py)
  modular         a GPT on c = a ∘ b mod p, full batch, with grokking's progress measures (tasks/modular.py)

The interface every task implements is `Task` (tasks/base.py). Adding one is a module with a
`Task` subclass plus one line below; `register` adds one from outside the package (e.g. a test).

A run's ConfigDict names its task (config.task, default "lm"), so it is resolved here, where the
tasks are known: `resolve(config)` gives the typed, checked RunConfig (transformer.config), and
`defaults(name)` the ConfigDict an experiment starts from.
"""

from __future__ import annotations

import importlib

import ml_collections

from transformer.config import RunConfig, defaults_for, resolve_for
from transformer.errors import ConfigError
from transformer.tasks.base import Task
from transformer.tasks.classification import Classification
from transformer.tasks.lm import LanguageModel
from transformer.tasks.modular import ModularArithmetic
from transformer.tasks.sae import SparseAutoencoder
from transformer.tasks.tagging import Tagging
from transformer.tasks.translation import Translation

TASKS: dict[str, type[Task]] = {
  LanguageModel.name: LanguageModel,
  Translation.name: Translation,
  Classification.name: Classification,
  Tagging.name: Tagging,
  SparseAutoencoder.name: SparseAutoencoder,
  ModularArithmetic.name: ModularArithmetic,
}


def register(task: type[Task]) -> type[Task]:
  """Adds `task` under `task.name` (usable as a class decorator)."""
  if not (isinstance(task, type) and issubclass(task, Task)):
    raise TypeError(f"{task!r} is not a subclass of transformer.tasks.Task")
  TASKS[task.name] = task
  return task


def get(name: str) -> type[Task]:
  if name not in TASKS:
    raise ConfigError(
      f"--config.task={name!r} is unknown; choose one of {', '.join(TASKS)} (a task registered from Python: "
      f"name the module that registers it in --config.imports)"
    )
  return TASKS[name]


def import_extensions(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """Imports the modules config.imports names (LoopConfig.imports: where a run's own tasks and
  attention mechanisms are registered); returns their names. One that cannot be imported is one
  error naming it."""
  names = tuple(n.strip() for entry in config.get("imports", ()) or () for n in str(entry).split(",") if n.strip())
  for name in names:
    try:
      importlib.import_module(name)
    except ImportError as e:
      raise ConfigError(
        f"--config.imports: module {name!r} cannot be imported ({e}); put it on PYTHONPATH or in the "
        f"directory the program runs in"
      ) from None
  return names


def resolve(config: ml_collections.ConfigDict, *, num_devices: int | None = None) -> RunConfig:
  """The ConfigDict as a checked RunConfig of the task it names (`config.resolve_for`), after
  importing the modules it names (`import_extensions`). With `num_devices` (training), the mesh is
  fitted to that many devices; see resolve_for."""
  import_extensions(config)
  return resolve_for(get(config.get("task", "lm")), config, num_devices=num_devices)


def load_data(run: RunConfig, load):
  """The data of the run's task (`Task.load_data`); `load` (inference.load) goes to a task whose data
  a trained model computes (`Task.data_from_model`)."""
  task_cls = get(run.task)
  return task_cls.load_data(run, load=load) if task_cls.data_from_model else task_cls.load_data(run)


def defaults(task: str) -> ml_collections.ConfigDict:
  """The ConfigDict of every field's default for the task named `task`: what experiments start from."""
  return defaults_for(get(task))


__all__ = [
  "Classification",
  "LanguageModel",
  "ModularArithmetic",
  "SparseAutoencoder",
  "TASKS",
  "Tagging",
  "Task",
  "Translation",
  "defaults",
  "get",
  "import_extensions",
  "load_data",
  "register",
  "resolve",
]
