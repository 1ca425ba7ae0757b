"""Text -> tokenized train/validation/test shards on disk (numpy memmaps) with a JSON manifest.

Layout of a prepared directory:
  manifest.json              what was prepared from what: sources + sha256, tokenizer, split, counts
  tokenizer/                 the tokenizer, loadable with `load_tokenizer` (trained ones included)
  text:            {split}.bin        token ids; documents end with <|endoftext|>
                   {split}.idx.npy    int64 rows (document, piece, start, end) into {split}.bin
  pairs:           {split}.src.bin, {split}.tgt.bin, {split}.idx.npy rows (line, src_start,
                   src_end, tgt_start, tgt_end); with a lexicon (training-only pairs, e.g. a
                   dictionary's words and phrases) also a fourth split, lexicon.*, the same way
  classification:  {split}.bin, {split}.idx.npy rows (line, start, end), {split}.labels.npy (the
                   label of each row as written: a class name or a score)
  tagged:          {split}.bin, {split}.idx.npy rows (line, start, end), {split}.labels.npy (int16,
                   one per token: the tag's index in manifest["tags"] at a word's first token, -1 at
                   its other tokens, which no loss or accuracy counts; `tokenizers.word_pieces`)

The split is deterministic for a seed: each record (a piece of a document cut at a line end, a
pair, a row) goes to a split by a hash of (seed, its position), or each file whole when the source
says so (`Source.split_by`), so it does not depend on chunking or on the order of processing. A
lexicon's pairs are for training only: a pair that repeats a sentence pair, or one of whose sides
is a side of a validation or test pair, is left out (and counted). Preparation streams (memory
does not grow with the corpus), tokenizes text on every core, and writes into a temporary directory
that replaces the output only when everything succeeded, so a failure loses nothing already there.
In a multi-process run process 0 prepares and the others wait (`ensure_prepared`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from tqdm import tqdm

from transformer import tokenizers
from transformer.data.records import LEXICON, RECORD_WRITERS, SplitWriter, write_lexicon, write_text_piece
from transformer.data.sources import COMPRESSED, Source, read_text, records, split_of
from transformer.errors import DataError

SPLITS = ("train", "validation", "test")
BATCH_CHARS = 1 << 22  # text tokenized at a time (on threads): ~4 MB
# A Python tokenizer (char, word) tokenizes in worker processes from this much input on: starting the
# processes costs a fixed time, which a smaller input does not repay.
PROCESSES_FROM_BYTES = 1 << 25
MANIFEST = "manifest.json"
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class PrepareOptions:
  # A name (gpt2, cl100k_base, char, bpe, word) or the directory of a saved tokenizer (e.g. a
  # training workdir's tokenizer/, to fine-tune that run's model on this data; or a Marian model's
  # directory: its source.spm, target.spm and vocab.json).
  tokenizer: str = "gpt2"
  vocab_size: int | None = None  # for trained tokenizers ("bpe"; "word": the most frequent words kept)
  lowercase: bool = False  # "word": lower-case the text first
  seed: int = 0
  validation_fraction: float = 0.1
  test_fraction: float = 0.0
  piece_chars: int = 16384  # text documents are cut at the first line end past this many characters
  # Threads that tokenize text (tiktoken encodings and trained BPE), or processes (char and word, from
  # PROCESSES_FROM_BYTES of input on); 0: every core. The output is the same for any count, so it is
  # not part of what a preparation is (its request).
  num_workers: int = 0

  def check(self) -> None:
    for name in ("validation_fraction", "test_fraction"):
      v = getattr(self, name)
      if not 0.0 <= v < 1.0:
        raise DataError(f"{name} must be in [0, 1), got {v}")
    if self.validation_fraction + self.test_fraction >= 1.0:
      raise DataError(
        f"validation_fraction + test_fraction must leave data for training, got "
        f"{self.validation_fraction} + {self.test_fraction}"
      )
    if self.piece_chars < 1:
      raise DataError(f"piece_chars must be positive, got {self.piece_chars}")
    if self.num_workers < 0:
      raise DataError(f"num_workers must be >= 0 (0: every core), got {self.num_workers}")
    if self.tokenizer in ("bpe", "word") and not self.vocab_size:
      raise DataError(f"tokenizer {self.tokenizer!r} needs a vocab_size (for example 8192)")
    if self.saved_tokenizer is None and self.tokenizer not in tokenizers.NAMES:
      raise DataError(
        f"tokenizer {self.tokenizer!r} is neither one of {', '.join(tokenizers.NAMES)} nor a "
        f"directory holding a saved tokenizer ({tokenizers.CONFIG_FILE}), a Marian model's "
        f"({', '.join(tokenizers.MarianTokenizer.FILES)}) or GPT-2's (vocab.json, merges.txt)"
      )

  @property
  def saved_tokenizer(self) -> Path | None:
    """The directory of a saved tokenizer, when `tokenizer` names one."""
    path = Path(self.tokenizer).expanduser()
    return path if tokenizers.is_saved(path) else None


def default_dir(
  source: Source, options: PrepareOptions, root: str | os.PathLike = "data", lexicon: Source | None = None
) -> Path:
  """data/<source>-<tokenizer>[<vocab_size>], e.g. data/shakespeare-gpt2 or data/ding_de_en-bpe8000; a
  saved tokenizer is named by its content (data/vader-saved1a2b3c4d); a lexicon is added to the
  name (data/ding_de_en-bpe2000+ding_de_en-dictionary)."""
  plus = f"+{lexicon.name}" if lexicon is not None else ""
  saved = options.saved_tokenizer
  if saved is not None:
    return Path(root) / f"{source.name}-saved{tokenizers.saved_sha256(saved)[:8]}{plus}"
  vocab = options.vocab_size if options.tokenizer in ("bpe", "word") else ""
  lower = "lower" if options.tokenizer == "word" and options.lowercase else ""
  return Path(root) / f"{source.name}-{options.tokenizer}{vocab}{lower}{plus}"


def _file_sha256(path: Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _too_small(kind: str, options: PrepareOptions) -> str:
  """What to do when a split came out empty: text is split by pieces of piece_chars characters, the
  other kinds (pairs, labelled texts, tagged sentences) line by line."""
  if kind == "text":
    return (
      f"the input is too small for the split (piece_chars={options.piece_chars}); give more text, or lower "
      f"piece_chars (--piece_chars; config.data.piece_chars when training)"
    )
  return (
    f"its lines are too few for the split (a line goes to validation with probability "
    f"validation_fraction={options.validation_fraction}); give more lines, or a larger validation_fraction "
    f"(--validation_fraction; config.data.validation_fraction when training)"
  )


def _text_pieces(source: Source, piece_chars: int) -> Iterator[tuple[int, int, str, bool, int]]:
  """(document, piece, text, is_last_piece, bytes read) for every document of a text source."""
  for doc, path in enumerate(source.files):
    buf, piece = "", 0
    for chunk in read_text(path):
      buf += chunk
      nbytes = len(chunk.encode("utf-8"))
      while len(buf) > piece_chars:
        cut = buf.find("\n", piece_chars) + 1
        if not cut or cut == len(buf):
          break  # keep the tail: it may be the document's last piece
        yield doc, piece, buf[:cut], False, nbytes
        nbytes, buf, piece = 0, buf[cut:], piece + 1
      if nbytes:
        yield doc, -1, "", False, nbytes  # progress only
    yield doc, piece, buf, True, 0


def _tokenized_batches(
  source: Source, options: PrepareOptions, tokenizer, bar
) -> Iterator[tuple[list, list[np.ndarray]]]:
  """(pieces, their token ids as arrays) of a text source, in order, a batch of ~BATCH_CHARS at a
  time. A batch is tokenized on `num_workers` threads (`Tokenizer.encode_arrays`: tiktoken releases
  the GIL and writes ids straight into arrays) while the caller writes the one before it, so the
  cores tokenize without pause; memory holds two batches, whatever the corpus (`launch.bench
  --what=prepare` compares it with tiktoken's bare `encode_ordinary_batch`)."""
  threads = options.num_workers or os.cpu_count() or 1

  def batches():
    batch, chars = [], 0
    for doc, piece, text, last, nbytes in _text_pieces(source, options.piece_chars):
      bar.update(nbytes)
      if piece >= 0 and (text or last):
        batch.append((doc, piece, text, last))
        chars += len(text)
      if chars >= BATCH_CHARS:
        yield batch
        batch, chars = [], 0
    yield batch

  # tiktoken's encodings (ours included) tokenize on threads; the Python ones (char, word), given a
  # large input, in worker processes, each a share of the batch (started by spawn: forking a process
  # that holds JAX's threads is unsafe).
  pool = None
  big = sum(p.stat().st_size for p in source.files) >= PROCESSES_FROM_BYTES
  if threads > 1 and big and not isinstance(tokenizer, tokenizers.TiktokenTokenizer):
    spawn = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(threads, spawn, initializer=_set_worker, initargs=(tokenizer,))

  def encode(batch):
    texts = [text for _, _, text, _ in batch]
    if pool is None:
      return tokenizer.encode_arrays(texts, num_threads=threads)
    shares = [texts[i::threads] for i in range(threads)]  # worker i: texts i, i + threads, ...
    encoded = list(pool.map(_worker_encode, shares))
    return [encoded[i % threads][i // threads] for i in range(len(texts))]

  with contextlib.ExitStack() as stack, concurrent.futures.ThreadPoolExecutor(1) as tokenizing:
    if pool is not None:
      stack.enter_context(pool)
    pending = None
    for batch in batches():
      future = tokenizing.submit(lambda batch=batch: (batch, encode(batch)))
      if pending is not None:
        yield pending.result()
      pending = future
    yield pending.result()


_worker_tokenizer = None  # a worker process's tokenizer (_tokenized_batches)


def _set_worker(tokenizer) -> None:
  global _worker_tokenizer
  _worker_tokenizer = tokenizer


def _worker_encode(texts: list[str]) -> list[np.ndarray]:
  return _worker_tokenizer.encode_arrays(texts)


def _texts(source: Source, rec: tuple) -> list[str]:
  """The text of a record: both sides of a pair, a row's text (not its label), a sentence's words."""
  if source.kind == "classification":
    return [rec[1]]
  if source.kind == "tagged":
    return [" ".join(word for word, _ in rec)]
  return list(rec)


def _corpus(source: Source, options: PrepareOptions) -> Iterator[str]:
  """The text a tokenizer is built from: all of the source for characters and BPE (so that no
  character is missing), the training split only for words (so that dev and test measure unseen
  words as <|unk|>, as they would be met). Never a lexicon: it adds training pairs, and leaves the
  sentences' tokens (and which of them fit max_len) as they are without it."""
  train_only = options.tokenizer == "word"
  if source.kind == "text":
    for doc, piece, text, _, _ in _text_pieces(source, options.piece_chars):
      if text and (not train_only or split_of(options.seed, doc, piece, fractions=_fractions(options)) == 0):
        yield text
  else:
    for split, _, rec in _assigned_records(source, options, counts=None):
      if not train_only or split == 0:
        yield from _texts(source, rec)


def _build_tokenizer(source: Source, options: PrepareOptions) -> tokenizers.Tokenizer:
  if options.saved_tokenizer is not None:
    return tokenizers.load_tokenizer(options.saved_tokenizer)
  if options.tokenizer in ("char", "bpe", "word"):
    logging.info("building the %s tokenizer from %s", options.tokenizer, source.name)
    kw = {"vocab_size": options.vocab_size} if options.tokenizer in ("bpe", "word") else {}
    if options.tokenizer == "word":
      kw["lowercase"] = options.lowercase
    return tokenizers.get_tokenizer(options.tokenizer, corpus=_corpus(source, options), **kw)
  return tokenizers.get_tokenizer(options.tokenizer)


def _fractions(options: PrepareOptions) -> tuple[float, float]:
  return options.validation_fraction, options.test_fraction


def _assigned_records(source: Source, options: PrepareOptions, counts: dict | None) -> Iterator[tuple[int, int, tuple]]:
  """(split, line number, record) of a record source, without exact duplicates (the Ding dictionary
  repeats entries, which would leak between splits); `counts["dropped"]` counts them."""
  seen: set[bytes] = set()
  last_line = {}
  for path, lineno, rec in records(source):
    key = hashlib.blake2b(repr(rec).encode(), digest_size=12).digest()
    if key in seen:
      if counts is not None:
        counts["dropped"] += 1
      continue
    seen.add(key)
    fileno = source.files.index(path)
    if source.split_by == "file":
      yield split_of(options.seed, fileno, fractions=_fractions(options)), lineno, rec
      continue
    ordinal = last_line.get((fileno, lineno), 0)
    last_line[(fileno, lineno)] = ordinal + 1
    yield split_of(options.seed, fileno, lineno, ordinal, fractions=_fractions(options)), lineno, rec


def _files(source: Source) -> list[dict]:
  return [{"path": str(p.resolve()), "sha256": _file_sha256(p), "bytes": p.stat().st_size} for p in source.files]


def _request(source: Source, options: PrepareOptions, lexicon: Source | None) -> dict:
  request = {
    "source": source.name,
    "kind": source.kind,
    "columns": list(source.columns),
    "files": _files(source),
    "options": {k: v for k, v in dataclasses.asdict(options).items() if k != "num_workers"},  # same output
  }
  if lexicon is not None:
    request["lexicon"] = {"source": lexicon.name, "files": _files(lexicon)}
  return request


@contextlib.contextmanager
def removed_if_left_empty(path: Path):
  """For a block that may create `path` (and parents of it): the directories it made are removed
  again if it fails and leaves them empty, so a refused launch leaves no trace (a workdir, a data
  root). Directories with anything in them stay."""
  made = []
  path = Path(path)
  while not path.exists() and path != path.parent:
    made.append(path)  # deepest first
    path = path.parent
  try:
    yield
  except BaseException:
    for directory in made:
      with contextlib.suppress(OSError):  # not empty, or never made
        directory.rmdir()
    raise


def prepare(
  source: Source,
  out_dir: str | os.PathLike,
  options: PrepareOptions = PrepareOptions(),
  *,
  lexicon: Source | None = None,
  overwrite: bool = False,
  progress: bool = True,
) -> Path:
  """Tokenizes `source` (and a lexicon of training-only pairs beside it: `sources.lexicon_source`)
  into `out_dir`; returns the manifest's path. Reuses an identical preparation."""
  options.check()
  if lexicon is not None and source.kind != "pairs":
    raise DataError(f"a lexicon adds training pairs for translation; {source.name} holds {source.kind} records")
  out_dir = Path(out_dir)
  request = _request(source, options, lexicon)
  if options.saved_tokenizer is not None:  # a saved tokenizer is part of what was prepared
    request["tokenizer_sha256"] = tokenizers.saved_sha256(options.saved_tokenizer)
  if _already_there(out_dir, request, overwrite):
    logging.info("%s already holds this preparation; reusing it", out_dir)
    return out_dir / MANIFEST

  # A refused preparation (bad bytes in a file, say) leaves no new directory behind.
  with removed_if_left_empty(out_dir.parent):
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
      start = time.time()
      tokenizer = _build_tokenizer(source, options)
      tokenizer.save(staging / "tokenizer")
      dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
      counts, dropped, tags = _write_splits(source, options, tokenizer, dtype, staging, progress, lexicon)
      _check_counts(source, options, counts, lexicon)
      manifest = {
        "format": FORMAT_VERSION,
        "kind": source.kind,
        "source": source.name,
        "columns": list(source.columns),
        "dtype": np.dtype(dtype).name,
        "tokenizer": {
          "name": tokenizer.name,
          "vocab_size": tokenizer.vocab_size,
          "eot_id": tokenizer.eot_id,
          "dir": "tokenizer",
        },
        "splits": counts,
        "dropped_duplicates": dropped,
        "seconds": round(time.time() - start, 2),
        "request": request,
      }
      if source.kind == "tagged":
        manifest["tags"] = tags  # in order of first appearance: a tag's index is its id in labels.npy
      (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
      _put_in_place(staging, out_dir)
    finally:
      shutil.rmtree(staging, ignore_errors=True)
  return out_dir / MANIFEST


def _already_there(out_dir: Path, request: dict, overwrite: bool) -> bool:
  """Whether `out_dir` holds this very preparation (`request`); one that holds another, or other
  files, is refused unless `overwrite`."""
  manifest_path = out_dir / MANIFEST
  if manifest_path.exists():
    old = json.loads(manifest_path.read_text())
    if old.get("request") == request:
      return True
    if not overwrite:
      raise DataError(
        f"{out_dir} already holds a different preparation ({old.get('request', {}).get('source')}"
        f", tokenizer {old.get('tokenizer', {}).get('name')}); choose another output "
        f"directory or pass overwrite=True (--overwrite)"
      )
  elif out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
    raise DataError(
      f"{out_dir} exists, is not empty and holds no {MANIFEST}; choose another output "
      f"directory or pass overwrite=True (--overwrite)"
    )
  return False


def _check_counts(source: Source, options: PrepareOptions, counts: dict, lexicon: Source | None) -> None:
  """A split that came out empty (the training split, or validation when asked for), or a lexicon of
  no pairs, is one error saying what to do."""
  for split in SPLITS:
    if split != "test" and counts[split]["records"] == 0 and (split == "train" or options.validation_fraction > 0):
      raise DataError(f"the {split} split of {source.name} came out empty: {_too_small(source.kind, options)}")
  if lexicon is not None and counts[LEXICON]["records"] == 0:
    c = counts[LEXICON]
    raise DataError(
      f"the lexicon {lexicon.name} has no pairs left ({c['duplicates']} repeat a sentence pair or "
      f"each other, {c['held_out']} share a side with a validation or test pair); give another "
      f"lexicon or none"
    )


def _put_in_place(staging: Path, out_dir: Path) -> None:
  """The finished `staging` directory becomes `out_dir`, replacing an old one by renames (a kill
  leaves the old or the new, never half of one)."""
  if out_dir.exists():
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    os.rename(out_dir, old)
    os.rename(staging, out_dir)
    shutil.rmtree(old)
  else:
    os.rename(staging, out_dir)


def ensure_prepared(
  source: Source, out_dir: str | os.PathLike, options: PrepareOptions, lexicon: Source | None = None
) -> Prepared:
  """`source` prepared into `out_dir`, now if it is not already (`prepare` reuses an identical
  preparation and redoes a different one), then loaded. In a multi-process run process 0 writes and
  the others wait for it."""
  out_dir = Path(out_dir)
  if jax.process_index() == 0:
    prepare(source, out_dir, options, lexicon=lexicon, overwrite=(out_dir / MANIFEST).exists())
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"prepared {out_dir}")
  return load_prepared(out_dir)


def _write_splits(
  source: Source,
  options: PrepareOptions,
  tokenizer,
  dtype,
  directory: Path,
  progress: bool,
  lexicon: Source | None = None,
) -> tuple[dict, int, list[str]]:
  fractions = _fractions(options)
  writers = [SplitWriter(directory, s, source.kind, dtype) for s in SPLITS]
  compressed = any(p.suffix in COMPRESSED for p in source.files)  # their text's size is known once read
  total = None if compressed else sum(p.stat().st_size for p in source.files)
  bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"tokenizing {source.name}", disable=not progress)
  counts = {s: {"records": 0, "documents": 0, "tokens": 0, "chars": 0} for s in SPLITS}
  dropped = {"dropped": 0}
  kind = None if source.kind == "text" else RECORD_WRITERS[source.kind](tokenizer, lexicon is not None)
  try:
    if kind is None:
      for batch, ids_of in _tokenized_batches(source, options, tokenizer, bar):
        for (doc, piece, text, last), ids in zip(batch, ids_of):
          s = split_of(options.seed, doc, piece, fractions=fractions)
          write_text_piece(writers[s], doc, piece, ids, last, tokenizer.eot_id)
          counts[SPLITS[s]]["chars"] += len(text)
    else:
      for s, lineno, rec in _assigned_records(source, options, dropped):
        kind.write(writers[s], s, lineno, rec)
        counts[SPLITS[s]]["chars"] += sum(map(len, _texts(source, rec)))
      bar.update((total or bar.n) - bar.n)
  finally:
    bar.close()
    for split, w in zip(SPLITS, writers):
      w.close(directory, split)
  for split, w in zip(SPLITS, writers):
    counts[split].update(
      records=len(w.rows),
      documents=len(w.documents) if source.kind == "text" else len(w.rows),
      tokens=int(sum(w.lengths)),
    )
  if lexicon is not None:
    counts[LEXICON] = write_lexicon(lexicon, tokenizer, dtype, directory, kind.held_out, kind.sentence_pairs)
  return counts, dropped["dropped"], kind.label_names(source.name) if kind is not None else []


# ---------------------------------------------------------------------------------------------
# Reading a prepared directory back.


@dataclasses.dataclass
class Prepared:
  directory: Path
  manifest: dict
  tokenizer: tokenizers.Tokenizer

  @property
  def kind(self) -> str:
    return self.manifest["kind"]

  def tokens(self, split: str, column: str = "") -> np.ndarray:
    """The token ids of a split as a read-only memmap (column "src"/"tgt" for pairs)."""
    self._check_split(split)
    path = self.directory / (f"{split}.{column}.bin" if column else f"{split}.bin")
    if path.stat().st_size == 0:
      return np.zeros(0, dtype=self.manifest["dtype"])
    return np.memmap(path, dtype=self.manifest["dtype"], mode="r")

  @property
  def fingerprint(self) -> dict:
    """What the source files held, by name, size and sha256. A training run records it: resuming on
    other content is refused (the files may move; their bytes may not change)."""
    request = self.manifest["request"]
    files = lambda r: [{"name": Path(f["path"]).name, "bytes": f["bytes"], "sha256": f["sha256"]} for f in r["files"]]
    fingerprint = {"source": request["source"], "files": files(request)}
    if "lexicon" in request:
      fingerprint["lexicon"] = {"source": request["lexicon"]["source"], "files": files(request["lexicon"])}
    return fingerprint

  def index(self, split: str) -> np.ndarray:
    self._check_split(split)
    return np.load(self.directory / f"{split}.idx.npy")

  def labels(self, split: str) -> np.ndarray:
    """classification: each row's label as written (str); tagged: a tag index per token (-1: none)."""
    self._check_split(split)
    return np.load(self.directory / f"{split}.labels.npy")

  def _check_split(self, split: str) -> None:
    if split == LEXICON and LEXICON not in self.manifest["splits"]:
      raise DataError(f"{self.directory} was prepared without a lexicon (--config.data.lexicon)")
    if split not in SPLITS and split != LEXICON:
      raise DataError(f"unknown split {split!r}; splits are {', '.join(SPLITS)}")


def load_prepared(directory: str | os.PathLike) -> Prepared:
  directory = Path(directory)
  path = directory / MANIFEST
  if not path.exists():
    raise DataError(
      f"no prepared data set at {directory} (no {MANIFEST}); prepare it with "
      f"`python -m launch.prepare --dataset=... --output_dir={directory}`"
    )
  manifest = json.loads(path.read_text())
  if manifest.get("format") != FORMAT_VERSION:
    raise DataError(
      f"{path} has format {manifest.get('format')}, this code reads format {FORMAT_VERSION}; prepare the data again"
    )
  return Prepared(directory, manifest, tokenizers.load_tokenizer(directory / manifest["tokenizer"]["dir"]))
