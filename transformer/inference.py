"""Using a trained model: restoring one from a training workdir (the params of one checkpoint or the
mean of several, no optimizer state; the tokenizer; and the task that says what the model is, on
this machine's devices), ensembles, and what the launch programs ask of each kind of model.

    >>> trained = load(workdir="workdirs/shakespeare-char", step="best")  # or load(hf="path/to/gpt2")
    >>> sampling.generate(trained.model, trained.params, ...)
    >>> classify(restore("workdirs/sentiment-encoder"), ["A gorgeous, witty film."])  # (1, classes)

The tasks hold what training needs; what only a trained model's user needs (labelling new texts,
tagging them, reading sentences as a translation model does, scoring a split of the run's data) is
here, one function each.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
import warnings
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from absl import logging

from transformer import checkpoints, sharding, tasks, tokenizers
from transformer import workdir as workdir_files
from transformer.config import MeshConfig, RunConfig, defaults_for, model_dict
from transformer.errors import CheckpointError, ConfigError, DataError, InputWarning, UserError, WorkdirError
from transformer.generation import beam_search
from transformer.models import formats, hf_files, seq2seq
from transformer.models.formats.gpt2 import import_hf_gpt2
from transformer.models.formats.marian import import_hf_marian, is_marian
from transformer.tasks import labelled
from transformer.tasks.lm import LanguageModel
from transformer.tasks.translation import marian_defaults
from transformer.tokenizers import CONFIG_FILE, load_tokenizer


class WrongTaskError(CheckpointError):
  """A workdir holds another task's model than the caller can use (`restore(task=...)`)."""

  def __init__(self, workdir: Path, found: str, wanted: str):
    super().__init__(f"{workdir} holds a {found!r} model (config.task), not a {wanted!r} one")
    self.found, self.wanted = found, wanted


@dataclasses.dataclass
class Trained:
  """What a workdir's checkpoint gives for inference."""

  task: tasks.Task  # task.model, task.model_config
  params: Any
  tokenizer: Any
  mesh: jax.sharding.Mesh
  step: int
  run: RunConfig
  averaged: tuple[int, ...] = ()  # the steps whose params were averaged into `params`, if any
  members: tuple[Trained, ...] = ()  # restore_ensemble's members, each as `restore` gave it
  source: str = ""  # where it came from, as the launch programs print it ("workdirs/x step 820")

  @property
  def model(self):
    return self.task.model

  @property
  def rules(self) -> tuple:
    return self.run.mesh.rules


def _on_this_machine(run: RunConfig, tokenizer, labels=None):
  """(run, task, mesh, abstract params) on this machine's devices: the run's mesh when it fits them and
  splits every parameter evenly, else plain data parallelism over them (the params replicated)."""
  candidates = [run.mesh, MeshConfig(logical_axis_rules=run.mesh.rules)]
  for mesh_config in candidates:
    try:
      fitted = dataclasses.replace(run, mesh=mesh_config.fitted(jax.device_count()))
      mesh = sharding.make_mesh(fitted.mesh.shape)
      task = tasks.get(run.task)(fitted, tokenizer, mesh, labels=labels)
      boxed, param_sh = sharding.param_shardings(task.model, task.init_inputs(), mesh, fitted.mesh.rules)
      sharding.check_divisible(nn.unbox(boxed), param_sh)
    except ConfigError as e:
      if mesh_config is candidates[-1]:
        raise
      logging.info("the run's mesh does not fit this machine (%s); using data parallelism", e)
      continue
    abstract = jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), nn.unbox(boxed), param_sh
    )
    return fitted, task, mesh, abstract


def saved_run(workdir: Path) -> RunConfig | None:
  """The config a workdir's run was started with, resolved (None for a new workdir)."""
  config_dict = workdir_files.saved_config_dict(workdir)
  if config_dict is None:
    return None
  tasks.import_extensions(config_dict)  # the run's own tasks and mechanisms, before its config is read
  try:
    return tasks.resolve(config_dict)
  except UserError as e:  # a field this version does not know
    raise ConfigError(f"{workdir / workdir_files.CONFIG} is not a config this version can resume: {e}") from None
  except ValueError as e:  # a value of the wrong type
    raise WorkdirError(
      f"{workdir / workdir_files.CONFIG} is unreadable ({e}); restore it, or use another --workdir"
    ) from None


def load(
  *,
  workdir: str | Path | None = None,
  hf: str | Path | None = None,
  step: str | int | None = None,
  tokenizer: str = "gpt2",
  task: str | None = None,
  average: int = 1,
) -> Trained:
  """A trained model, whatever made it: a training run's `workdir` (at `step`: None is
  `default_step`'s choice; `average` > 1 averages that many checkpoints) or a Hugging Face directory
  `hf` (Marian's files, an open model's (Llama, Qwen, Gemma, ...: formats.OPEN_MODELS) with its own
  tokenizer.json, or GPT-2's read with the tokenizer named `tokenizer`). `task` (a config.task
  name), when given, is what the caller can use: another one is a `WrongTaskError`. What every
  launch program and the notebook load a model with."""
  if (workdir is None) == (hf is None):
    raise UserError("give exactly one of --workdir (a training run) or --hf (a Hugging Face model's directory)")
  if workdir is not None:
    trained = restore(workdir, default_step(workdir) if step is None else step, task=task, average=average)
    which = f"steps {list(trained.averaged)} averaged" if trained.averaged else f"step {trained.step}"
    return dataclasses.replace(trained, source=f"{workdir} {which}")
  if step is not None or average > 1:
    raise UserError("--step and --average choose a training run's checkpoints: give --workdir, or leave them out")
  # The format: what the caller can use, else what the directory holds (Marian's config, an open
  # model's config.json, or GPT-2's).
  marian = task == "translation" or (task is None and is_marian(hf))
  if marian:
    trained = import_marian(hf)
  elif formats.is_open_model(hf):
    trained = import_open_model(hf)
  else:
    _check_gpt2(hf)
    trained = import_gpt2(hf, tokenizer)
  if task is not None and trained.run.task != task:
    raise WrongTaskError(Path(hf), trained.run.task, task)
  return trained


def restore(workdir: str | Path, step: str | int = "latest", task: str | None = None, average: int = 1) -> Trained:
  """The params of a workdir's checkpoint `step` ("latest": the newest readable one; "best" by the
  task's evaluation metric, e.g. validation loss or dev BLEU; or a number), sharded over this
  machine's devices with the run's logical axis rules (on the run's mesh when it fits them, else
  data-parallel: any run restores on any machine). `average` > 1: the mean of the params of that
  many checkpoints, up to and including `step`. `task` (a config.task name), when given, is what
  the caller can use: another one is a `WrongTaskError`."""
  workdir = Path(workdir)
  files = {
    "config": workdir / workdir_files.CONFIG,
    "tokenizer": workdir / workdir_files.TOKENIZER,
    "checkpoints": workdir / workdir_files.CHECKPOINTS,
  }
  missing = [str(p) for p in files.values() if not p.exists()]
  if missing:
    raise CheckpointError(
      f"{workdir} is not a training workdir: looked for {', '.join(missing)} "
      f"(launch.train writes them); check the --workdir path"
    )
  run = saved_run(workdir)
  if task is not None and run.task != task:
    raise WrongTaskError(workdir, run.task, task)
  run, trained_task, mesh, abstract = _on_this_machine(
    run, load_tokenizer(files["tokenizer"]), workdir_files.saved_labels(workdir)
  )
  trained_task.load_files(workdir)
  ckpt = checkpoints.Checkpointer(files["checkpoints"], read_only=True, best=tasks.get(run.task).best_metric)
  chosen, params = _restore_params(ckpt, step, abstract)
  if average <= 1:
    return Trained(trained_task, params, trained_task.tokenizer, mesh, chosen, run)
  steps = ckpt.steps_to_average(chosen, average)
  return Trained(
    trained_task, ckpt.average_params(steps, abstract), trained_task.tokenizer, mesh, chosen, run, averaged=tuple(steps)
  )


def import_marian(directory: str | Path) -> Trained:
  """A Marian model's directory (MarianMTModel's config.json and model.safetensors, MarianTokenizer's
  source.spm, target.spm and vocab.json: a Helsinki-NLP/opus-mt-* download, or an export) as a
  trained translation model on this machine's devices, its run config `marian_defaults`': what
  launch.translate, launch.evaluate and launch.probe use with --hf."""
  config, params = import_hf_marian(directory)
  tokenizer = marian_tokenizer(directory, config.vocab_size)
  config_dict = marian_defaults(str(directory))
  config_dict.data.dataset = ""  # no data is read: its sides are "source" and "target"
  return _imported(config_dict, params, tokenizer, f"{directory} (Marian)")


def marian_tokenizer(directory: str | Path, vocab_size: int):
  """A Marian directory's tokenizer pair, refused where its vocabulary is not the model's embedding's."""
  tokenizer = tokenizers.MarianTokenizer.from_directory(directory)
  if tokenizer.vocab_size != vocab_size:
    raise CheckpointError(
      f"{Path(directory) / 'vocab.json'} has {tokenizer.vocab_size} pieces but the model's embedding "
      f"{vocab_size} rows: the files are of different models"
    )
  return tokenizer


def open_model_tokenizer(directory: str | Path, vocab_size: int):
  """An open model's directory's tokenizer.json (refused where its ids outrun the model's embedding), or
  none: the model alone opens, on token ids (as transformers' model classes load), and what needs text says so."""
  directory = Path(directory)
  if not tokenizers.is_hf_tokenizer(directory):
    return tokenizers.NoTokenizer(vocab_size, str(directory))
  return _fitting(tokenizers.HFTokenizer.from_directory(directory), directory, vocab_size)


def _fitting(tokenizer, directory: Path, vocab_size: int):
  """The directory's own tokenizer, refused where its ids outrun the model's embedding."""
  if tokenizer.vocab_size > vocab_size:
    files = directory / CONFIG_FILE if (directory / CONFIG_FILE).is_file() else f"{directory}'s vocab.json"
    raise CheckpointError(
      f"{files} has {tokenizer.vocab_size} tokens but the model's embedding {vocab_size} rows: the files are "
      "of different models"
    )
  return tokenizer


def has_own_tokenizer(directory: str | Path) -> bool:
  """Whether a GPT-2 directory holds its tokenizer's files (tokenizer.json, or GPT-2's vocab.json + merges.txt)."""
  return tokenizers.is_hf_tokenizer(directory) or tokenizers.has_vocab_and_merges(directory)


def gpt2_tokenizer(directory: str | Path, name: str, vocab_size: int, required: bool = True):
  """A GPT-2 directory's own tokenizer files where it has them (as an open model's); else the tokenizer
  `name` (OpenAI's gpt2) where its ids fit the model's embedding; else, `required`, one error saying which files
  to put beside the weights, or (not `required`) none: the model opens on token ids."""
  directory = Path(directory)
  directory = directory if directory.is_dir() else directory.parent  # (a model.safetensors named itself)
  if has_own_tokenizer(directory):
    return _fitting(tokenizers.load_tokenizer(directory), directory, vocab_size)
  named = tokenizers.get_tokenizer(name)
  if named.vocab_size <= vocab_size:
    return named
  if not required:
    return tokenizers.NoTokenizer(vocab_size, str(directory))
  raise CheckpointError(
    f"{directory}: a GPT-2 of {vocab_size} tokens with no tokenizer files, and {name}'s {named.vocab_size} ids do "
    f"not fit its embedding: put the model's tokenizer.json (or vocab.json and merges.txt) beside its weights"
  )


def import_gpt2(directory: str | Path, tokenizer: str = "gpt2") -> Trained:
  """Hugging Face GPT-2 weights (config.json + model.safetensors) as a trained language model on this
  machine's devices, read with the directory's own tokenizer files, else the tokenizer named `tokenizer`
  (gpt2 for OpenAI's): what launch.sample, launch.evaluate and launch.probe use with --hf."""
  config, params = import_hf_gpt2(directory)
  chosen = gpt2_tokenizer(directory, tokenizer, config.vocab_size)
  config_dict = defaults_for(LanguageModel)
  config_dict.model = model_dict(config)
  # (a directory's own files are named by the directory, as an open model's are)
  own = not isinstance(chosen, tokenizers.TiktokenTokenizer)
  config_dict.data.tokenizer = str(chosen.name) if own else tokenizer
  config_dict.data.dataset = ""  # no data is read
  config_dict.seq_len = config.max_len  # what a window of launch.evaluate reads by default
  return _imported(config_dict, params, chosen, str(directory))


def _check_gpt2(hf: str | Path) -> None:
  """A directory whose config.json names a model type we do not open is one error naming the ones we
  do (GPT-2's files may come without a config.json: the tensors tell)."""
  path = Path(hf) / "config.json"
  model_type = hf_files.read_config(hf).get("model_type") if path.is_file() else None
  if model_type not in (None, "gpt2"):
    raise CheckpointError(
      f"{path}: model_type {model_type!r} is not one we open; supported: gpt2, marian, {', '.join(formats.OPEN_MODELS)}"
    )


def import_open_model(directory: str | Path) -> Trained:
  """An open model's Hugging Face directory (config.json, safetensors, and tokenizer.json with
  tokenizer_config.json: from the Hub or an export: transformer.models.formats) as a trained language model on
  this machine's devices, each param read in its stored dtype straight onto its shards. Without tokenizer
  files the model alone opens (as transformers' model classes load): what needs text says so."""
  directory = Path(directory)
  config = formats.read_model_config(directory)
  model_type = hf_files.read_config(directory)["model_type"]
  tokenizer = open_model_tokenizer(directory, config.vocab_size)
  has_tokenizer = isinstance(tokenizer, tokenizers.HFTokenizer)
  config_dict = defaults_for(LanguageModel)
  config_dict.model = model_dict(config)
  config_dict.data.dataset = ""  # no data is read
  if has_tokenizer:  # (without one the config's default stays, never read: text is refused)
    config_dict.data.tokenizer = str(directory)
  config_dict.seq_len = min(config.max_len, 2048)  # what a window of launch.evaluate reads by default
  run, task, mesh, abstract = _on_this_machine(tasks.resolve(config_dict), tokenizer)
  _, params = formats.import_hf(directory, shardings=jax.tree.map(lambda a: a.sharding, abstract))
  return Trained(task, params, tokenizer, mesh, 0, run, source=f"{directory} ({model_type})")


def _imported(config_dict, params, tokenizer, source: str) -> Trained:
  """An imported model's params, placed as a run of `config_dict` would shard them on this machine."""
  run, task, mesh, abstract = _on_this_machine(tasks.resolve(config_dict), tokenizer)
  params = jax.tree.map(lambda x, a: jax.device_put(x, a.sharding), params, abstract)
  return Trained(task, params, tokenizer, mesh, 0, run, source=source)


def default_step(workdir: str | Path) -> str:
  """The checkpoint a program uses unless told: "best" for a task that scores its best checkpoint at
  the end (early stopping: classification, tagging), else "latest"."""
  run = saved_run(Path(workdir)) if Path(workdir).is_dir() else None
  return "best" if run is not None and tasks.get(run.task).finish_with_best else "latest"


def mean_of_last(workdir: str | Path, count: int, like) -> tuple[list[int], Any]:
  """(steps, the mean of their params) of the last `count` checkpoints in `workdir` (fewer when fewer
  were saved), each leaf shaped and sharded as in `like` (a params tree of arrays). Averaging the
  last checkpoints is what "Attention Is All You Need" scores (the last 5)."""
  ckpt = checkpoints.Checkpointer(Path(workdir) / workdir_files.CHECKPOINTS, read_only=True)
  steps = ckpt.steps()[-count:]
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
  return steps, ckpt.average_params(steps, abstract)


def _restore_params(ckpt: checkpoints.Checkpointer, step: str | int, abstract) -> tuple[int, Any]:
  """(step, params) of checkpoint `step`: "latest" falls back past unreadable ones, with a warning."""
  if step == "latest":
    for chosen in reversed(ckpt.steps()):
      try:
        return chosen, ckpt.restore_params(chosen, abstract)
      except CheckpointError as e:
        if chosen not in ckpt.unreadable:
          raise
        logging.warning("%s; trying the step before it", e)
    raise CheckpointError(
      f"no readable checkpoint in {ckpt.directory}"
      + (f" (unreadable: {sorted(ckpt.unreadable)})" if ckpt.unreadable else "")
      + "; train longer or pass --step"
    )
  if step == "best":
    chosen = ckpt.best_step()
    if chosen is None:
      raise CheckpointError(f"no checkpoint with a {ckpt.best[0]} in {ckpt.directory}; train longer or pass --step")
  elif str(step).isdigit():
    chosen = int(step)
  else:
    raise CheckpointError(f"step must be 'latest', 'best' or a step number, got {step!r}")
  return chosen, ckpt.restore_params(chosen, abstract)


def restore_ensemble(workdirs, step: str | int = "latest", average: int = 1) -> Trained:
  """Several translation workdirs decoding as one model (`seq2seq.Ensemble`: the mean of their
  log-probabilities). Each member is restored as `restore` does it, with `step` and `average`; the
  result has the first one's tokenizer, task and mesh, params {"member_i": ...}, and `members`.

  The members must share the tokenizer (the same data with the same data.tokenizer and vocab_size
  build the same one, so runs that differ in seed, model or schedule qualify) and read the same
  sources (the same data.fuzzy_match_tokens and translation memory)."""
  workdirs = [Path(w) for w in workdirs]
  if not workdirs:
    raise ConfigError("an ensemble needs at least one workdir")
  members = tuple(restore(w, step, task="translation", average=average) for w in workdirs)
  first, path = members[0], workdirs[0]
  for trained, other in zip(members[1:], workdirs[1:]):
    if (other / workdir_files.TOKENIZER / CONFIG_FILE).read_text() != (
      path / workdir_files.TOKENIZER / CONFIG_FILE
    ).read_text():
      raise ConfigError(
        f"{other}'s tokenizer differs from {path}'s: an ensemble averages the members' "
        f"probabilities over one vocabulary; ensemble runs trained with the same data and "
        f"data.tokenizer/data.vocab_size settings"
      )
    memory = first.task.MEMORY_FILE
    if trained.task.config.fuzzy_match_tokens != first.task.config.fuzzy_match_tokens or (
      first.task.config.fuzzy_match_tokens and (other / memory).read_bytes() != (path / memory).read_bytes()
    ):
      raise ConfigError(
        f"{other} and {path} read different sources (data.fuzzy_match_tokens "
        f"{trained.task.config.fuzzy_match_tokens} and {first.task.config.fuzzy_match_tokens}, "
        f"or different translation memories): ensemble runs trained on the same sources"
      )
  # Every member's params on the first one's mesh, each leaf keeping its own partitioning.
  on_first = lambda x: jax.device_put(
    x, jax.sharding.NamedSharding(first.mesh, getattr(x.sharding, "spec", None) or jax.sharding.PartitionSpec())
  )
  params = {
    f"member_{i}": m.params if m.mesh == first.mesh else jax.tree.map(on_first, m.params) for i, m in enumerate(members)
  }
  task = copy.copy(first.task)  # the first member's task (its tokenizer, sources, scoring), decoding the ensemble
  task.model = seq2seq.Ensemble(tuple(m.task.model_config for m in members))
  return Trained(task, params, first.tokenizer, first.mesh, first.step, first.run, first.averaged, members)


# --- What each kind of trained model does for its launch program. ---


def classify(trained: Trained, texts: list[str]) -> np.ndarray:
  """Class probabilities (N, C) of `texts` by a classifier (cut to max_len tokens, as in training);
  the classes are `trained.task.labels`."""
  task, max_len = trained.task, trained.task.config.max_len
  ids = task.encode_texts(texts)
  if longer := sum(len(i) > max_len for i in ids):
    warnings.warn(
      f"{longer} of {len(texts)} text(s) longer than the classifier's max_len={max_len} tokens: each is "
      f"classified from its first {max_len} tokens, as training cut them",
      InputWarning,
      stacklevel=2,
    )
  examples = [(i[:max_len], 0) for i in ids]
  batches = labelled.fixed_batches(examples, max_len, False, task.config.eval_batch_size)
  return task.probabilities(trained.params, batches)[: len(texts)]


def tag(trained: Trained, texts: list[str]) -> list[list[tuple[str, str]]]:
  """(word, tag) for every word of each text by a tagger (words as tokenizers.split_words cuts them)."""
  sentences = []
  for i, text in enumerate(texts):
    sentences.append(tokenizers.split_words(text))
    if not sentences[-1]:
      raise DataError(f"text {i + 1} is empty; give some words to tag")
  return [list(zip(words, tags)) for words, tags in zip(sentences, tag_words(trained, sentences))]


def tag_words(trained: Trained, sentences: list[list[str]]) -> list[list[str]]:
  """The tag of every word of each sentence (a list of words) by a tagger; a sentence longer than
  max_len tokens is tagged in rows of max_len, as training cut sentences."""
  task, L = trained.task, trained.task.config.max_len
  rows, spans, longer = [], [], 0
  for words in sentences:
    ids, firsts = tokenizers.word_pieces(task.tokenizer, words)
    spans.append((firsts, len(rows)))
    longer += len(ids) > L
    rows += [
      (np.asarray(ids[s : s + L], np.int32), np.zeros(min(L, len(ids) - s), np.int32)) for s in range(0, len(ids), L)
    ]
  if longer:
    warnings.warn(
      f"{longer} of {len(sentences)} text(s) longer than the tagger's max_len={L} tokens: tagged in rows of {L}, "
      "as training cut sentences (a word's context ends at its row)",
      InputWarning,
      stacklevel=2,
    )
  probs = task.probabilities(trained.params, labelled.fixed_batches(rows, L, True, task.config.eval_batch_size))
  return [[task.labels[int(probs[row + f // L][f % L].argmax())] for f in firsts] for firsts, row in spans]


def translate(trained: Trained, sources: list[np.ndarray], **decoding) -> list[str]:
  """The translations of `sources` (token ids, as `translation_sources` or `split_pairs` give them)
  by beam search (`beam_search.translate_ids`'s beam_size, alpha, penalty, max_len, no_repeat_ngram,
  batch_size; all but beam_size and batch_size default to the run's: config.eval's, the data's max_len)."""
  ev = trained.task.config.eval
  decoding = {
    "max_len": trained.task.config.max_len,
    "no_repeat_ngram": ev.no_repeat_ngram,
    "alpha": ev.alpha,
    "penalty": ev.length_penalty,
  } | {k: v for k, v in decoding.items() if v is not None}
  ids = beam_search.translate_ids(
    trained.model,
    trained.params,
    sources,
    **beam_search.special_ids(trained.tokenizer),
    mesh=trained.mesh,
    rules=trained.rules,
    **decoding,
  )
  return [trained.tokenizer.decode(i) for i in ids]


def translation_sources(trained: Trained, texts: list[str]) -> list[np.ndarray]:
  """Sentences -> the token ids a translation model reads: with fuzzy matches
  (data.fuzzy_match_tokens), each followed by its match from the run's translation memory."""
  task = trained.task
  ids = [task.tokenizer.encode(t.strip()) for t in texts]
  if task.memory is None:
    return ids  # beam_search.translate_ids checks them
  ids = beam_search.check_sources(ids, task.config.max_len - 1, task.model_config.vocab_size)
  return task.with_matches([np.asarray(s, np.int32) for s in ids])


def split_task(trained: Trained, workdir: str | Path) -> tasks.Task:
  """The run's task with the run's data, prepared now if it is not on this machine: what scores a
  split. Data whose files changed since the run was trained is refused, as resuming it is (its
  splits are other texts), and so is data prepared with another tokenizer than the run's."""
  task_class = tasks.get(trained.run.task)
  with contextlib.redirect_stdout(sys.stderr):  # what preparing and the task print; stdout is for results
    task_data = tasks.load_data(trained.run, load)
    workdir_files.check_data(
      Path(workdir),
      task_data.fingerprint,
      "its splits are no longer the ones the run was scored on, and may be in another tokenizer's ids. "
      "Restore the files, or score the texts as a file (--input_file)",
    )
    if not tokenizers.identical(task_data.tokenizer, trained.tokenizer):
      raise DataError(
        f"{task_data.directory} holds ids of another tokenizer ({task_data.tokenizer}) than the run in {workdir} "
        f"reads ({trained.tokenizer}); prepare the data again with the run's tokenizer: "
        f"python -m launch.prepare --tokenizer={Path(workdir) / workdir_files.TOKENIZER} ..."
      )
    return task_class(trained.run, trained.tokenizer, trained.mesh, task_data)


def split_pairs(trained: Trained, workdir: str | Path, split: str) -> list:
  """(source ids, target ids) of a split of a translation run's data (`split_task`)."""
  return split_task(trained, workdir).pairs(split)
