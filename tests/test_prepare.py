import gzip
import importlib
import json

import numpy as np
import pytest
import zstandard

from transformer import data
from transformer.data import PrepareOptions, show, sources
from transformer.errors import DataError

from conftest import run_module


def _reassemble(prepared):
  """The source text back from all splits: pieces decoded and put in (document, piece) order."""
  pieces = []
  for split in ("train", "validation", "test"):
    tokens = prepared.tokens(split)
    for doc, piece, start, end in prepared.index(split):
      pieces.append(((doc, piece), prepared.tokenizer.decode(tokens[start:end])))
  return "".join(text for _, text in sorted(pieces))


def test_shakespeare_shards_decode_back_to_source(tmp_path, shakespeare_dir, shakespeare_text):
  out = tmp_path / "sh"
  data.prepare(
    data.named_source("shakespeare"), out, PrepareOptions(tokenizer="gpt2", test_fraction=0.05), progress=False
  )
  ds = data.load_prepared(out)
  assert _reassemble(ds) == shakespeare_text
  m = ds.manifest
  assert m["tokenizer"] == {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256, "dir": "tokenizer"}
  assert m["dtype"] == "uint16"
  assert sum(m["splits"][s]["tokens"] for s in ("train", "validation", "test")) == sum(
    len(ds.tokens(s)) for s in ("train", "validation", "test")
  )
  # Each play ends with one <|endoftext|> in exactly one split.
  assert sum(int((ds.tokens(s) == 50256).sum()) for s in ("train", "validation", "test")) == 42
  assert m["request"]["files"][0]["sha256"] and len(m["request"]["files"]) == 42
  for s, frac in (("validation", 0.1), ("test", 0.05)):
    share = m["splits"][s]["chars"] / len(shakespeare_text)
    assert frac / 2 < share < frac * 2


def _write_corpus(tmp_path, n_docs=3, lines=400):
  files = []
  rng = np.random.default_rng(0)
  words = ["alpha", "beta", "gamma", "délta", "ε", "日本", "zeta", "eta!"]
  for d in range(n_docs):
    p = tmp_path / f"doc{d}.txt"
    p.write_text("".join(" ".join(rng.choice(words, size=rng.integers(1, 12))) + "\n" for _ in range(lines)))
    files.append(p)
  return files


@pytest.mark.parametrize("tokenizer,vocab", [("char", None), ("bpe", 280), ("cl100k_base", None)])
def test_user_files_stream_and_decode_back(tmp_path, monkeypatch, tokenizer, vocab):
  monkeypatch.setattr(sources, "CHUNK_BYTES", 333)  # many chunk boundaries, mid-character too
  files = _write_corpus(tmp_path)
  out = tmp_path / "out"
  data.prepare(
    data.file_source(files), out, PrepareOptions(tokenizer=tokenizer, vocab_size=vocab, piece_chars=500), progress=False
  )
  ds = data.load_prepared(out)
  assert _reassemble(ds) == "".join(f.read_text() for f in files)
  assert ds.tokenizer.vocab_size == (vocab or ds.tokenizer.vocab_size)
  # What launch.prepare prints: the counts per split, and the first tokens of a split, each as its text.
  table = show.summary(ds).splitlines()
  assert table[2].split()[:4] == ["split", "records", "documents", "tokens"]
  assert [row.split()[0] for row in table[3:6]] == ["train", "validation", "test"]
  bars, ids = show.tokenization(ds, n_tokens=8).splitlines()
  assert json.loads(ids) == ds.tokens("train")[:8].tolist() and bars.count("|") == 9
  assert ds.manifest["dtype"] == ("uint32" if tokenizer == "cl100k_base" else "uint16")


def test_split_is_deterministic_by_seed(tmp_path):
  files = _write_corpus(tmp_path)

  def split_rows(seed, name):
    data.prepare(
      data.file_source(files),
      tmp_path / name,
      PrepareOptions(tokenizer="char", seed=seed, piece_chars=300),
      progress=False,
    )
    return data.load_prepared(tmp_path / name).index("validation")[:, :2].tolist()

  assert split_rows(0, "a") == split_rows(0, "b")
  assert split_rows(0, "a") != split_rows(1, "c")


def test_pairs_and_classification(tmp_path):
  tsv = tmp_path / "pairs.tsv"
  tsv.write_text("".join(f"Satz Nummer {i}.\tSentence number {i}.\n" for i in range(200)) + "\n")
  out = tmp_path / "p"
  data.prepare(data.file_source([tsv], "pairs"), out, PrepareOptions(tokenizer="gpt2"), progress=False)
  ds = data.load_prepared(out)
  seen = {}
  for split in ("train", "validation"):
    src, tgt = ds.tokens(split, "src"), ds.tokens(split, "tgt")
    for line, s0, s1, t0, t1 in ds.index(split):
      seen[line] = (ds.tokenizer.decode(src[s0:s1]), ds.tokenizer.decode(tgt[t0:t1]))
  assert seen == {i + 1: (f"Satz Nummer {i}.", f"Sentence number {i}.") for i in range(200)}

  vader = tmp_path / "v"
  data.prepare(data.named_source("vader"), vader, PrepareOptions(tokenizer="gpt2"), progress=False)
  ds = data.load_prepared(vader)
  labels, idx = ds.labels("train"), ds.index("train")
  scores = labels.astype(float)  # the scores as written in the file
  assert len(labels) == len(idx) > 9000 and -4 <= scores.min() < 0 < scores.max() <= 4
  assert ds.manifest["splits"]["train"]["records"] + ds.manifest["splits"]["validation"]["records"] > 10500


@pytest.mark.slow
def test_ding_pairs_are_sentences(tmp_path):
  out = tmp_path / "d"
  data.prepare(
    data.named_source("ding_de_en"), out, PrepareOptions(tokenizer="gpt2", test_fraction=0.05), progress=False
  )
  m = json.loads((out / "manifest.json").read_text())
  total = sum(m["splits"][s]["records"] for s in ("train", "validation", "test"))
  assert 19000 < total < 20000 and m["columns"] == ["de", "en"]
  ds = data.load_prepared(out)
  line, s0, s1, t0, t1 = ds.index("test")[0]
  de, en = ds.tokenizer.decode(ds.tokens("test", "src")[s0:s1]), ds.tokenizer.decode(ds.tokens("test", "tgt")[t0:t1])
  assert de[0].isupper() and en[0].isupper() and de[-1] in ".!?" and en[-1] in ".!?"


def test_repeated_spans_are_random_symbols_written_twice():
  """The induction study's text: lines of a span of 5 to 50 of 256 symbols, then the span again; the
  same text on every machine (seeded)."""
  [path] = data.named_source("repeated_spans").files
  lines = path.read_text(encoding="utf-8").splitlines()
  assert len(lines) == 60_000 and lines[0].startswith("\u4ed7\u4e14\u4e84")
  lengths = set()
  for line in lines[:2000]:
    first, second = line[: len(line) // 2], line[len(line) // 2 :]
    assert first == second and set(first) <= set(data.sources.SPAN_ALPHABET)
    lengths.add(len(first))
  assert lengths == set(range(5, 51))


DING_LINES = [  # lines of the Ding dictionary as the file has them
  "Herzgeschwulst {f} [med.] | Herzgeschwulste {pl} :: cardiac tumour | cardiac tumours",
  "Herzindex {m} /HI/ [med.] :: cardiac index /CI/",
  "je; jemals {adv} | mehr als je zuvor; mehr als jemals davor [geh.] | Siehst du ihn jemals? | Man sieht sie "
  "kaum je ohne. :: ever | more than ever; more than ever before | Do you ever see him? | You hardly ever see "
  "her without it.",
  "je {conj} … desto; je … umso | je eher, desto besser :: the … the | the sooner the better",
  "# comment :: line",
]


def test_the_ding_lexicon_is_its_words_and_phrases_not_its_sentences():
  lexicon = [sources.parse_ding_lexicon_line(line, None, i) for i, line in enumerate(DING_LINES)]
  assert lexicon == [
    [("Herzgeschwulst", "cardiac tumour"), ("Herzgeschwulste", "cardiac tumours")],
    [("Herzindex", "cardiac index")],
    # synonyms: position by position when both sides have as many; the sentences are left out
    [
      ("je", "ever"),
      ("jemals", "ever"),
      ("mehr als je zuvor", "more than ever"),
      ("mehr als jemals davor", "more than ever before"),
    ],
    [("je eher, desto besser", "the sooner the better")],  # "je … desto" is a pattern, not a phrase
    None,
  ]
  sentences = [sources.parse_ding_line(line, None, i) for i, line in enumerate(DING_LINES)]
  assert sentences[2] == [
    ("Siehst du ihn jemals?", "Do you ever see him?"),
    ("Man sieht sie kaum je ohne.", "You hardly ever see her without it."),
  ]


def test_a_lexicon_is_for_training_only_once_each_and_never_repeats_a_held_out_sentence(tmp_path):
  pairs = [(f"Satz Nummer {i}.", f"Sentence number {i}.") for i in range(300)]
  tsv = tmp_path / "pairs.tsv"
  tsv.write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
  options = PrepareOptions(tokenizer="bpe", vocab_size=300, validation_fraction=0.1, test_fraction=0.1)
  source = data.file_source([tsv], "pairs")
  plain = data.load_prepared(data.prepare(source, tmp_path / "plain", options, progress=False).parent)
  held_out = {plain.tokenizer.decode(ids) for split in ("validation", "test") for ids in _pair_texts(plain, split)}
  # The lexicon repeats a hundred sentence pairs (one in other case and spacing), holds a pair twice,
  # and has a pair whose one side is a held-out sentence.
  words = [("Satz", "sentence"), ("Nummer", "number"), ("Satz", "sentence"), ("ein Wort", sorted(held_out)[0])]
  lexicon_tsv = tmp_path / "lexicon.tsv"
  lexicon_tsv.write_text(
    "".join(f"{a}\t{b}\n" for a, b in pairs[:100] + words) + "satz  NUMMER 1.\tsentence number 1.\n"
  )
  lexicon = data.lexicon_source(str(lexicon_tsv), source)
  out = data.default_dir(source, options, tmp_path, lexicon)
  assert out.name == "pairs-bpe300+lexicon-lexicon"
  data.prepare(source, out, options, lexicon=lexicon, progress=False)
  ds = data.load_prepared(out)
  counts = ds.manifest["splits"]
  for split in ("train", "validation", "test"):  # the sentence pairs' split and tokens are as without it
    np.testing.assert_array_equal(ds.index(split), plain.index(split))
    np.testing.assert_array_equal(ds.tokens(split, "src"), plain.tokens(split, "src"))
  assert counts["lexicon"]["records"] == 2 and counts["lexicon"]["duplicates"] == 102
  assert counts["lexicon"]["held_out"] == 1
  assert {ds.tokenizer.decode(ids) for ids in _pair_texts(ds, "lexicon")} == {"Satz", "sentence", "Nummer", "number"}
  with pytest.raises(DataError, match="has no dictionary entries of its own; give --config.data.lexicon a TSV"):
    data.lexicon_source("dictionary", source)
  assert data.lexicon_source("dictionary", data.named_source("ding_de_en")).name == "ding_de_en-dictionary"
  assert data.lexicon_source("", source) is None
  with pytest.raises(DataError, match="a lexicon adds training pairs for translation; shakespeare holds text"):
    data.lexicon_source(str(lexicon_tsv), data.named_source("shakespeare"))
  with pytest.raises(DataError, match="was prepared without a lexicon"):
    plain.tokens("lexicon", "src")


def _pair_texts(prepared, split):
  """Both sides' token ids of every pair of a split."""
  columns = [prepared.tokens(split, c) for c in ("src", "tgt")]
  for _, s0, s1, t0, t1 in prepared.index(split):
    yield from (columns[0][s0:s1], columns[1][t0:t1])


@pytest.mark.parametrize(
  "content,message",
  [
    (b"", r"bad\.txt: the file is empty"),
    (b"  \n\n \t\n", r"bad\.txt: the file holds only whitespace"),
    (b"hello\x00world\n", r"bad\.txt, line 1, column 6: a NUL byte \(binary data\)"),
    (
      "caf\u00e9 ok\n".encode("latin-1"),
      r"bad\.txt, line 1, column 4: byte 0xe9 is not UTF-8 .*convert the text to UTF-8",
    ),
  ],
)
def test_bad_text_files_are_refused_by_name(tmp_path, content, message):
  bad = tmp_path / "bad.txt"
  bad.write_bytes(content)
  with pytest.raises(DataError, match=message):
    data.prepare(data.file_source([bad]), tmp_path / "out", PrepareOptions(tokenizer="gpt2"), progress=False)
  assert not (tmp_path / "out").exists()


def test_a_bad_byte_is_named_by_its_line_whatever_block_it_is_read_in(tmp_path):
  """read_text streams a file in blocks: the line and column it names are the file's, not the block's."""
  bad = tmp_path / "bad.txt"
  # "ü" (2 bytes of UTF-8) on line 2 is cut by some of the block sizes; the Latin-1 "é" is the bad byte.
  bad.write_bytes("first line\nsecond \u00fc\n".encode() + "the caf\u00e9 line\n".encode("latin-1"))
  for chunk_bytes in (3, 4, 7, 19, 1 << 20):  # 19: the block ends inside "ü"
    with pytest.raises(DataError, match=r"bad\.txt, line 3, column 8: byte 0xe9 is not UTF-8"):
      list(data.sources.read_text(bad, chunk_bytes))
  (tmp_path / "dir").mkdir()
  with pytest.raises(DataError, match=r"dir is a directory; give the text files in it"):
    list(data.sources.read_text(tmp_path / "dir"))
  with pytest.raises(DataError, match=r"dir is a directory with no files in it"):
    data.file_source([tmp_path / "dir"])


def test_directories_globs_and_compressed_files_read_as_their_text(tmp_path):
  """--input_files entries may be directories (every file under them, hidden ones left out) and glob
  patterns; .gz and .zst files stream decompressed. The documents are the files, in sorted order."""
  texts = [p.read_text() for p in _write_corpus(tmp_path, lines=50)]
  corpus = tmp_path / "corpus"
  (corpus / "sub").mkdir(parents=True)
  (corpus / "a.txt").write_text(texts[0])
  (corpus / "b.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(texts[1].encode()))
  (corpus / "sub" / "c.txt.gz").write_bytes(gzip.compress(texts[2].encode()))
  (corpus / ".hidden.txt").write_text("not a document\n")
  for entry in (corpus, f"{corpus}/**/*.txt*"):
    source = data.file_source([entry])
    assert [p.name for p in source.files] == ["a.txt", "b.txt.zst", "c.txt.gz"] and source.name == "a+2"
    out = tmp_path / "out"
    data.prepare(source, out, PrepareOptions(tokenizer="char", piece_chars=200), overwrite=True, progress=False)
    assert _reassemble(data.load_prepared(out)) == "".join(texts)
  with pytest.raises(DataError, match=r"\*\.md matches no file; check the pattern"):
    data.file_source([f"{corpus}/*.md"])
  (tmp_path / "bad.txt.gz").write_bytes(b"not gzip at all\n")
  with pytest.raises(DataError, match=r"bad\.txt\.gz: not a readable \.gz file"):
    list(data.sources.read_text(tmp_path / "bad.txt.gz"))
  (tmp_path / "latin.txt.zst").write_bytes(zstandard.ZstdCompressor().compress("ok\ncaf\u00e9\n".encode("latin-1")))
  with pytest.raises(DataError, match=r"latin\.txt\.zst, line 2, column 4: byte 0xe9 is not UTF-8"):
    list(data.sources.read_text(tmp_path / "latin.txt.zst"))


@pytest.mark.parametrize(
  "content,message",
  [
    ("Hallo.\tHello.\nKein Tab hier\n", r"pairs\.tsv:2: expected 'source<TAB>target' but the line has no tab"),
    ("Hallo.\tHello.\n\tEmpty source.\n", r"pairs\.tsv:2: the source side is empty"),
    ("Hallo.\t   \n", r"pairs\.tsv:1: the target side is empty"),
  ],
)
def test_bad_pairs_name_the_line(tmp_path, content, message):
  bad = tmp_path / "pairs.tsv"
  bad.write_text(content)
  with pytest.raises(DataError, match=message):
    data.prepare(data.file_source([bad], "pairs"), tmp_path / "out", PrepareOptions(tokenizer="gpt2"), progress=False)


@pytest.mark.parametrize("tokenizer", ["gpt2", "char"])
def test_the_worker_count_changes_nothing_written(tmp_path, monkeypatch, tokenizer):
  """Text is tokenized a batch of pieces at a time, on threads (tiktoken) or worker processes (the
  Python tokenizers): 1 worker and 3 write the same bytes, with batches that end mid-document
  (BATCH_CHARS small), and the other count reuses the preparation."""
  monkeypatch.setattr(importlib.import_module("transformer.data.prepare"), "BATCH_CHARS", 2000)
  monkeypatch.setattr(importlib.import_module("transformer.data.prepare"), "PROCESSES_FROM_BYTES", 0)
  files = _write_corpus(tmp_path)
  written = []
  for workers in (1, 3):
    out = tmp_path / f"out{workers}"
    opts = PrepareOptions(tokenizer=tokenizer, piece_chars=300, test_fraction=0.1, num_workers=workers)
    data.prepare(data.file_source(files), out, opts, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.pop("seconds")
    files_written = {
      p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "manifest.json"
    }
    written.append((manifest, files_written))
  assert written[0] == written[1] and len(written[0][1]) > 5
  opts = PrepareOptions(tokenizer=tokenizer, piece_chars=300, test_fraction=0.1, num_workers=2)
  with pytest.raises(DataError, match="num_workers must be >= 0"):
    PrepareOptions(num_workers=-1).check()
  before = (tmp_path / "out1" / "manifest.json").read_bytes()
  data.prepare(data.file_source(files), tmp_path / "out1", opts, progress=False)  # reused, not redone
  assert (tmp_path / "out1" / "manifest.json").read_bytes() == before


def test_failure_loses_nothing_and_rerun_is_reused(tmp_path):
  files = _write_corpus(tmp_path, n_docs=1)
  out = tmp_path / "out"
  opts = PrepareOptions(tokenizer="char", piece_chars=300)
  data.prepare(data.file_source(files), out, opts, progress=False)
  before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
  # Same request: reused, not rewritten.
  data.prepare(data.file_source(files), out, opts, progress=False)
  # A different request without overwrite: refused. With overwrite but bad input: old data kept.
  with pytest.raises(DataError, match="already holds a different preparation"):
    data.prepare(data.file_source(files), out, PrepareOptions(tokenizer="gpt2"), progress=False)
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"\xff\xfe")
  with pytest.raises(DataError, match="is not UTF-8"):
    data.prepare(data.file_source([bad]), out, opts, overwrite=True, progress=False)
  assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
  assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_bad_options():
  with pytest.raises(DataError, match="validation_fraction must be in"):
    PrepareOptions(validation_fraction=1.5).check()
  with pytest.raises(DataError, match="must leave data for training"):
    PrepareOptions(validation_fraction=0.5, test_fraction=0.5).check()
  with pytest.raises(DataError, match="'bpe' needs a vocab_size"):
    PrepareOptions(tokenizer="bpe").check()
  with pytest.raises(DataError, match="unknown data set 'wiki'"):
    data.named_source("wiki")
  with pytest.raises(DataError, match="no prepared data set at /nowhere"):
    data.load_prepared("/nowhere")


def test_too_small_input_names_the_split(tmp_path):
  small = tmp_path / "small.txt"
  small.write_text("just one line\n")
  with pytest.raises(DataError, match="split of small came out empty: .* or lower piece_chars"):
    data.prepare(data.file_source([small]), tmp_path / "o", PrepareOptions(tokenizer="char"), progress=False)
  # Pairs are split line by line: the advice is about lines and the validation fraction, not piece_chars.
  pairs = tmp_path / "pairs.tsv"
  pairs.write_text("".join(f"Ein Satz {i}.\tA sentence {i}.\n" for i in range(3)))
  with pytest.raises(DataError, match=r"its lines are too few .* or a larger validation_fraction") as e:
    data.prepare(data.file_source([pairs], "pairs"), tmp_path / "p", PrepareOptions(tokenizer="char"), progress=False)
  assert "piece_chars" not in str(e.value)


@pytest.mark.slow
def test_cli_prepares_and_reports_errors_in_one_line(tmp_path):
  files = _write_corpus(tmp_path, n_docs=2)
  out = tmp_path / "cli"
  proc = run_module(
    "launch.prepare",
    f"--input_files={files[0]},{files[1]}",
    "--tokenizer=char",
    "--piece_chars=1000",
    f"--output_dir={out}",
  )
  assert proc.returncode == 0, proc.stderr
  assert "first training tokens" in proc.stdout and (out / "manifest.json").exists()
  bad = tmp_path / "bin.txt"
  bad.write_bytes(b"\x00\x01")
  proc = run_module("launch.prepare", f"--input_files={bad}", f"--output_dir={tmp_path / 'x'}")
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {bad}, line 1, column 1: a NUL byte (binary data)")
  assert "Traceback" not in proc.stderr
