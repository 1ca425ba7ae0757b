"""Golden fixtures for Marian (Hugging Face `MarianMTModel`) parity, made with transformers itself.

Not run by the test suite (torch is not a dependency of this project). A Marian model of a small,
unusual shape (heads, widths, depths and vocabulary no real OPUS-MT model has, so that an
importer cannot get a transposition or a count right by accident), with SentencePiece models trained
on a few thousand of the Ding German-English pairs and the model briefly trained on them, saved as `MarianMTModel.save_pretrained` and
`MarianTokenizer.save_pretrained` write them, beside what transformers computes with them: teacher-
forced logits for a padded batch, and greedy and beam-search translations. Regenerate with the
Python 3.11 venv of tests/make_gpt2_fixtures.py, plus sentencepiece:

  /tmp/torchenv/bin/pip install torch==2.13.0 transformers safetensors numpy sentencepiece
  /tmp/torchenv/bin/python tests/make_marian_fixtures.py        # writes tests/fixtures/marian_tiny/
  /tmp/torchenv/bin/python tests/make_marian_fixtures.py --tokenizer   # only tokenizer_reference.json
  .venv/bin/python tests/test_hf_marian.py /tmp/marian-export     # our export of the fixture, perturbed
  /tmp/torchenv/bin/python tests/make_marian_fixtures.py --check /tmp/marian-export \
      > tests/fixtures/marian_tiny/export_check.json
      # loads the export with MarianMTModel/MarianTokenizer.from_pretrained: its logits against ours,
      # its translations, its ids (`check`)
"""

import json
import random
import sys
from pathlib import Path

import numpy as np
import sentencepiece
import torch
import transformers
from transformers import MarianConfig, MarianMTModel, MarianTokenizer

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "marian_tiny"
DING = Path.home() / ".cache" / "transformer" / "ding-de-en.txt"
SHAPE = dict(d_model=48, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4)
SHAPE.update(encoder_ffn_dim=80, decoder_ffn_dim=80, max_position_embeddings=64)
PIECES = 300  # each language's SentencePiece vocabulary
NUM_PAIRS, NUM_TEST, TRAIN_STEPS = 3000, 4, 400


def ding_sentences() -> list[tuple[str, str]]:
  """(German, English) sentence pairs of the Ding dictionary: the `|`-separated parts of a line's two
  sides, paired in order, kept where both are sentences (a capital first, . ! or ? last)."""
  pairs = []
  for line in DING.read_text(encoding="utf-8").splitlines():
    if line.startswith("#") or " :: " not in line:
      continue
    de, en = line.split(" :: ", 1)
    for d, e in zip(de.split(" | "), en.split(" | ")):
      d, e = d.strip(), e.strip()
      if d[:1].isupper() and e[:1].isupper() and d[-1:] in ".!?" and e[-1:] in ".!?" and "{" not in d + e:
        pairs.append((d, e))
  pairs = sorted(set(pairs))
  random.Random(0).shuffle(pairs)
  return pairs[: NUM_PAIRS + NUM_TEST]


def train_spm(sentences: list[str], prefix: Path) -> Path:
  sentencepiece.SentencePieceTrainer.train(
    sentence_iterator=iter(sentences),
    model_prefix=str(prefix),
    vocab_size=PIECES,
    model_type="unigram",
    character_coverage=1.0,
    minloglevel=2,
  )
  return prefix.with_suffix(".model")


def make() -> None:
  FIXTURE.mkdir(parents=True, exist_ok=True)
  pairs = ding_sentences()
  train, test = pairs[:NUM_PAIRS], pairs[NUM_PAIRS:]
  source = train_spm([d for d, _ in train], FIXTURE / "source").rename(FIXTURE / "source.spm")
  target = train_spm([e for _, e in train], FIXTURE / "target").rename(FIXTURE / "target.spm")
  for leftover in FIXTURE.glob("*.vocab"):
    leftover.unlink()
  # One vocabulary for both sides, as OPUS-MT's: </s> 0, <unk> 1, every piece of either model, <pad> last.
  vocab = {"</s>": 0, "<unk>": 1}
  for spm in (source, target):
    processor = sentencepiece.SentencePieceProcessor(model_file=str(spm))
    for i in range(processor.get_piece_size()):
      piece = processor.id_to_piece(i)
      if not processor.is_control(i) and not processor.is_unknown(i):
        vocab.setdefault(piece, len(vocab))
  vocab["<pad>"] = len(vocab)
  (FIXTURE / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")

  torch.manual_seed(0)
  pad = vocab["<pad>"]
  config = MarianConfig(
    vocab_size=len(vocab),
    **SHAPE,
    activation_function="swish",
    scale_embedding=True,
    pad_token_id=pad,
    decoder_start_token_id=pad,
    eos_token_id=0,
    forced_eos_token_id=0,
    bad_words_ids=[[pad]],
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
    num_beams=4,
    max_length=32,
  )
  model = MarianMTModel(config)
  tokenizer = MarianTokenizer(str(FIXTURE / "source.spm"), str(FIXTURE / "target.spm"), str(FIXTURE / "vocab.json"))
  # A few hundred steps on the training pairs: translations that depend on the sentence and end with
  # </s> by themselves (a random model repeats one token to the length limit, which tests little).
  optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
  rng = random.Random(1)
  for _ in range(TRAIN_STEPS):
    chunk = rng.sample(train, 32)
    batch = tokenizer(
      [d for d, _ in chunk],
      text_target=[e for _, e in chunk],
      padding=True,
      truncation=True,
      max_length=48,
      return_tensors="pt",
    )
    labels = batch.pop("labels")
    decoder_input_ids = torch.cat([torch.full((len(chunk), 1), pad), labels[:, :-1]], dim=1)
    loss = model(**batch, decoder_input_ids=decoder_input_ids, labels=labels.masked_fill(labels == pad, -100)).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
  print(f"training loss after {TRAIN_STEPS} steps: {loss.item():.3f}")
  model.eval()
  with torch.no_grad():  # zero biases and unit LayerNorms would hide an importer that drops them
    for p in model.parameters():
      if p.requires_grad:  # not the sinusoid tables: fixed, and not saved
        p.add_(torch.randn_like(p) * 0.01)
    model.final_logits_bias.add_(torch.randn_like(model.final_logits_bias) * 0.1)
  model.save_pretrained(FIXTURE, safe_serialization=True)
  tokenizer.save_pretrained(FIXTURE)

  sources, targets = [d for d, _ in test], [e for _, e in test]
  batch = tokenizer(sources, text_target=targets, padding=True, return_tensors="pt")
  labels = batch.pop("labels")
  decoder_input_ids = torch.cat([torch.full((len(test), 1), pad), labels[:, :-1]], dim=1)
  with torch.no_grad():
    logits = model(**batch, decoder_input_ids=decoder_input_ids).logits
    # Marian never generates <pad>, its decoder's start (OPUS-MT's generation configs say so: bad_words_ids).
    options = dict(do_sample=False, max_new_tokens=24, bad_words_ids=[[pad]])
    greedy = model.generate(**batch, num_beams=1, **options)
    beam = model.generate(**batch, num_beams=4, length_penalty=1.0, **options)
  np.savez(
    FIXTURE / "reference.npz",
    input_ids=batch["input_ids"].numpy().astype(np.int32),
    attention_mask=batch["attention_mask"].numpy().astype(np.int32),
    decoder_input_ids=decoder_input_ids.numpy().astype(np.int32),
    labels=labels.numpy().astype(np.int32),
    logits=logits.numpy().astype(np.float32),
  )
  reference = {
    "transformers": transformers.__version__,
    "torch": torch.__version__,
    "sentencepiece": sentencepiece.__version__,
    "sources": sources,
    "targets": targets,
    "greedy": [[int(t) for t in row] for row in greedy],
    "beam4": [[int(t) for t in row] for row in beam],
  }
  (FIXTURE / "reference.json").write_text(json.dumps(reference, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
  print(f"marian_tiny: {sum(p.numel() for p in model.parameters())} parameters, {len(vocab)} tokens -> {FIXTURE}")


# Texts where tokenizers part ways: a language code, characters neither model has, runs of spaces,
# typographic punctuation, characters NFKC folds (the SentencePiece models' normalisation).
ODD_TEXTS = [
  ">>en<< Guten Morgen.",
  "Ein Emoji 😀 und  zwei   Leerzeichen.",
  "„Anführungszeichen“ – und … Auslassung",
  "ﬁnden Ⅻ ½ ＡＢＣ",
  "x",
]


def record_tokenizer() -> None:
  """tokenizer_reference.json: what MarianTokenizer makes of Ding sentences and of ODD_TEXTS (sources
  encoded as the encoder reads them, targets as labels), and its decoding of those targets and of
  reference.json's translations (skip_special_tokens=True; with the target model, and with
  transformers' default, which for one shared vocab.json is the source model)."""
  tokenizer = MarianTokenizer.from_pretrained(FIXTURE)
  reference = json.loads((FIXTURE / "reference.json").read_text(encoding="utf-8"))
  pairs = ding_sentences()[NUM_PAIRS - 60 : NUM_PAIRS] + [(t, t) for t in ODD_TEXTS]
  decode = lambda ids, **kw: tokenizer.decode(ids, skip_special_tokens=True, **kw)
  targets = [tokenizer(text_target=e)["input_ids"] for _, e in pairs]
  translations = reference["greedy"] + reference["beam4"]
  out = {
    "transformers": transformers.__version__,
    "sentencepiece": sentencepiece.__version__,
    "pairs": pairs,
    "source_ids": [tokenizer(d)["input_ids"] for d, _ in pairs],
    "target_ids": targets,
    "decoded_targets": [decode(ids, use_source_tokenizer=False) for ids in targets],
    "decoded_targets_default": [decode(ids) for ids in targets],
    "translations": translations,
    "decoded_translations": [decode(ids, use_source_tokenizer=False) for ids in translations],
  }
  path = FIXTURE / "tokenizer_reference.json"
  path.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
  print(f"{len(pairs)} texts -> {path}")


def check(exported: str) -> None:
  """Loads an exported directory as transformers does and prints, as JSON (what
  tests/fixtures/marian_tiny/export_check.json holds): the largest difference of its logits on the
  fixture's batch from the exporter's own (`our_logits.npy` beside the export), whether
  MarianTokenizer.from_pretrained encodes the fixture's sources and targets to the fixture's ids,
  its greedy and 4-beam translations, and the sha256 of every tensor and of config.json (so that a
  test can tell the export it checked from today's)."""
  import hashlib

  from safetensors.numpy import load_file

  exported = Path(exported)
  model = MarianMTModel.from_pretrained(exported).eval()
  tokenizer = MarianTokenizer.from_pretrained(exported)
  reference = np.load(FIXTURE / "reference.npz")
  sentences = json.loads((FIXTURE / "reference.json").read_text(encoding="utf-8"))
  batch = tokenizer(sentences["sources"], text_target=sentences["targets"], padding=True, return_tensors="pt")
  pad = model.config.pad_token_id
  with torch.no_grad():
    logits = model(
      input_ids=torch.from_numpy(reference["input_ids"].astype(np.int64)),
      attention_mask=torch.from_numpy(reference["attention_mask"].astype(np.int64)),
      decoder_input_ids=torch.from_numpy(reference["decoder_input_ids"].astype(np.int64)),
    ).logits.numpy()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    greedy = model.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens=32)
    beam = model.generate(**inputs, num_beams=4, length_penalty=1.0, do_sample=False, max_new_tokens=32)
  ours = np.load(exported / "our_logits.npy")
  sha = lambda b: hashlib.sha256(b).hexdigest()
  result = {
    "transformers": transformers.__version__,
    "torch": torch.__version__,
    "max_abs_diff": float(np.abs(logits - ours).max()),
    "tokenizer_sources_equal": batch["input_ids"].numpy().tolist() == reference["input_ids"].tolist(),
    "tokenizer_targets_equal": batch["labels"].numpy().tolist() == reference["labels"].tolist(),
    "greedy": [[int(t) for t in row if t != pad] for row in greedy],
    "beam4": [[int(t) for t in row if t != pad] for row in beam],
    "config_sha256": sha((exported / "config.json").read_bytes()),
    "tensors_sha256": {k: sha(v.tobytes()) for k, v in sorted(load_file(exported / "model.safetensors").items())},
  }
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  if sys.argv[1:2] == ["--check"]:
    check(sys.argv[2])
  elif sys.argv[1:2] == ["--tokenizer"]:
    record_tokenizer()
  else:
    make()
    record_tokenizer()
