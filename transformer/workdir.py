"""A training workdir, and the guards that keep it usable by the next command whatever happens.

  config.json              the resolved config of the run (transformer.config.to_config_dict)
  data.json                what the training data's files held (sha256): resuming on other data is refused
  tokenizer/               the tokenizer, so that the workdir alone can be sampled from
  labels.json              the names of the classes or tags the model predicts (classification, tagging)
  checkpoints/<step>/      Orbax checkpoints (transformer.checkpoints)
  unreadable_checkpoints/  damaged step directories, moved aside (never deleted) for a person to inspect
  metrics.jsonl, tensorboard/, loss.png, and the task's output (samples.txt, test_translations.tsv)
  train.lock               while a launch.train runs on it: that process's pid and host

A launch on an existing workdir writes nothing until it is known to fit what is there: it takes the
lock, compares its config with config.json (`check_config`: only what `may_change` may differ) and
its data with data.json (`check_data`); the checkpoints' shapes are compared with the model when the
latest is restored. Files are replaced atomically (write, then rename), so a kill leaves the old one
or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import time
from pathlib import Path

import ml_collections
from absl import logging

from transformer.config import RunConfig, resume_changes, to_config_dict
from transformer.errors import ConfigError, DataError, WorkdirError
from transformer.layers import BlockConfig

CONFIG = "config.json"
DATA = "data.json"
TOKENIZER = "tokenizer"
LABELS = "labels.json"
CHECKPOINTS = "checkpoints"
LOCK = "train.lock"


@contextlib.contextmanager
def writable(workdir: Path, action: str = "write to"):
  """`OSError`s while writing into the workdir -> one WorkdirError naming the path and the cause."""
  try:
    yield
  except OSError as e:
    raise WorkdirError(
      f"cannot {action} {e.filename or workdir}: {e.strerror or e}; free space or fix the "
      f"permissions of --workdir={workdir}, or choose another"
    ) from None


class Lock:
  """One launch.train per workdir: `train.lock` holds the holder's pid, host and start time. A lock
  whose process is gone (same host, no such pid: it was killed) is stale and taken over."""

  def __init__(self, workdir: Path):
    self.path = workdir / LOCK
    self.mine = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}

  def acquire(self) -> None:
    for _ in range(2):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        holder = self._holder()
        if holder is None or (holder.get("host") == self.mine["host"] and not _alive(holder.get("pid"))):
          logging.warning(
            "%s was left by process %s, which is gone; taking it over", self.path, (holder or {}).get("pid", "?")
          )
          self.path.unlink(missing_ok=True)
          continue
        raise WorkdirError(
          f"{self.path.parent} is in use: process {holder.get('pid')} on {holder.get('host')} has "
          f"trained in it since {holder.get('since')} ({self.path}); wait for it to finish, "
          f"use another --workdir, or delete {self.path} if that process is gone"
        ) from None
      with os.fdopen(fd, "w") as f:
        json.dump(self.mine, f)
      return
    raise WorkdirError(f"could not take {self.path}: another process keeps taking it")

  def release(self) -> None:
    if self._holder() == self.mine:
      self.path.unlink(missing_ok=True)

  def _holder(self) -> dict | None:
    try:
      return json.loads(self.path.read_text())
    except (OSError, ValueError):  # gone, or torn by a kill while it was written
      return None


def _alive(pid) -> bool:
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, TypeError, ValueError):
    return True  # someone else's process, or a pid we cannot read: assume it holds the lock
  return True


def saved_config_dict(workdir: Path) -> ml_collections.ConfigDict | None:
  """The ConfigDict a workdir's run was started with, unresolved (None for a new workdir): what
  `tasks.resolve` makes the run's RunConfig of (`inference.saved_run`)."""
  path = workdir / CONFIG
  if not path.exists():
    return None
  try:
    saved = json.loads(path.read_text())
  except ValueError as e:  # a torn file (JSONDecodeError)
    raise WorkdirError(f"{path} is unreadable ({e}); restore it, or use another --workdir") from None
  return ml_collections.ConfigDict(upgraded_config(saved))


# The block's config keys, which config format 1 held flat in config.model.
_BLOCK_KEYS = tuple(f.name for f in dataclasses.fields(BlockConfig))


def upgraded_config(saved: dict) -> dict:
  """A config.json in the format this version writes (2), from one in format 1, whose model config
  held its block's fields itself (format 2: config.model.block.*) and whose GPT or LSTM named its
  longest sequence `context_length` (format 2: `max_len`, as every model); and an SAE's without the two
  keys its config no longer has (`vocab_size`, unused; `layers`, a cross-layer transcoder's, taken from
  the model it reads). (The formats differ in those keys alone, so the file's keys say which it is.)"""
  model = dict(saved.get("model") or {})
  if model.get("family") == "sae":
    model = {k: v for k, v in model.items() if k not in ("vocab_size", "layers")}
  if "context_length" in model:
    model["max_len"] = model.pop("context_length")
  # An LSTM has no block (its d_model is its own), nor has an SAE (which format 1 did not know).
  if model.get("family") not in ("lstm", "sae") and "block" not in model:
    block = {k: model.pop(k) for k in _BLOCK_KEYS if k in model}
    if block:
      model["block"] = block
  return {**saved, "model": model} if "model" in saved else saved


def check_config(workdir: Path, run: RunConfig, saved: RunConfig | None) -> list[str]:
  """Refuses a launch whose config differs from the workdir's run (`saved`, None for a new workdir) in
  what may not change on resume, listing every such value; returns the changes that may happen (e.g.
  more steps, another mesh)."""
  if saved is None:
    return []
  fixed, allowed = resume_changes(saved, run)
  if fixed:
    raise ConfigError(
      f"--workdir={workdir} holds a run with another config, and these values cannot change when "
      f"it resumes: {'; '.join(fixed)}. Use a new --workdir, or launch with the run's values "
      f"({workdir / CONFIG})"
    )
  return allowed


RESUMING = "resuming would mix two data sets. Restore the files, or train on them in a new --workdir"


def check_data(workdir: Path, fingerprint: dict | None, refusal: str = RESUMING) -> None:
  """Refuses a run's data whose files changed since it started (sha256): resuming on it, by default,
  or what `refusal` says. `fingerprint` is the prepared data's (None for a task that makes its own data)."""
  path = workdir / DATA
  if fingerprint is None or not path.exists():
    return
  saved = json.loads(path.read_text())
  if saved == fingerprint:
    return
  was = {f["name"]: f["sha256"] for f in saved.get("files", [])}
  now = {f["name"]: f["sha256"] for f in fingerprint["files"]}
  changed = sorted(n for n in was.keys() | now.keys() if was.get(n) != now.get(n))
  detail = ", ".join(f"{n} (sha256 {was.get(n, 'absent')[:12]} then, {now.get(n, 'absent')[:12]} now)" for n in changed)
  if not detail and saved.get("lexicon") != fingerprint.get("lexicon"):
    lexicon = lambda f: (f or {}).get("source", "none")
    detail = f"the lexicon ({lexicon(saved.get('lexicon'))} then, {lexicon(fingerprint.get('lexicon'))} now)"
  raise DataError(
    f"the training data changed since the run in {workdir} started: {detail or saved.get('source')}; " + refusal
  )


def write_text(path: Path, text: str) -> None:
  """Replaces `path` atomically: a kill leaves the old file or the new one."""
  tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
  tmp.write_text(text)
  os.replace(tmp, path)


def saved_labels(workdir: Path) -> tuple[str, ...] | None:
  """The label names a workdir's model predicts (None for tasks without labels)."""
  path = workdir / LABELS
  return tuple(json.loads(path.read_text())) if path.exists() else None


def record_run(
  workdir: Path, run: RunConfig, tokenizer, fingerprint: dict, labels: tuple[str, ...] | None = None
) -> None:
  """Writes what the workdir keeps of its run (after every check has passed): the config (with
  the changes that were allowed), the data's fingerprint, the tokenizer (once) and the label names."""
  with writable(workdir):
    write_text(workdir / CONFIG, to_config_dict(run).to_json_best_effort(indent=2) + "\n")
    if fingerprint is not None:
      write_text(workdir / DATA, json.dumps(fingerprint, indent=2) + "\n")
    if labels is not None:
      write_text(workdir / LABELS, json.dumps(list(labels)) + "\n")
    if not (workdir / TOKENIZER).exists():
      staging = workdir / f".{TOKENIZER}.tmp-{os.getpid()}"
      shutil.rmtree(staging, ignore_errors=True)
      tokenizer.save(staging)
      os.rename(staging, workdir / TOKENIZER)
