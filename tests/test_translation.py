"""Translation end to end: the loss, learning (a tiny model overfits a handful of pairs to BLEU
100), training through `train_and_evaluate` with dev/test BLEU, resume, and `launch.translate`."""

import dataclasses
import functools
import json
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import launch
from experiments import translation as translation_experiment
from transformer import assets, checkpoints, inference, metrics, optim, tokenizers, train
from transformer.data import pipeline
from transformer.errors import UserError
from transformer.generation import beam_search
from transformer.models import seq2seq
from transformer.tasks import resolve
from transformer.tasks.translation import translation_loss

from conftest import compiled_apply, compiled_init, nontrivial_png, run_cases, run_module

# Seed 004's example, and a few like it.
PAIRS = [
  ("I love purple cats", "J'adore les chats violets"),
  ("The dog sleeps", "Le chien dort"),
  ("We eat bread", "Nous mangeons du pain"),
  ("She reads a book", "Elle lit un livre"),
  ("The sun is hot", "Le soleil est chaud"),
  ("They sing loudly", "Ils chantent fort"),
]


# The loss as training compiles it (eagerly, each op of each batch's shapes would compile on its own).
_loss = jax.jit(translation_loss, static_argnums=(0, 4), static_argnames="label_smoothing")


@pytest.mark.slow
def test_loss_counts_real_target_tokens_only_and_smoothing_raises_it():
  tok = tokenizers.CharTokenizer.from_corpus([s + t for s, t in PAIRS])
  pairs = [(np.array(tok.encode(s)), np.array(tok.encode(t))) for s, t in PAIRS]
  model = seq2seq.Transformer(seq2seq.preset("cpu-tiny", vocab_size=tok.vocab_size))
  params = compiled_init(model, jnp.zeros((1, 8), jnp.int32), jnp.zeros((1, 8), jnp.int32))
  batches = pipeline.translation_batches(pairs, max_tokens=10_000, max_len=32, eot_id=tok.eot_id, seed=0)
  total_tokens = 0
  for batch in batches:  # one per length bucket
    loss_sum, tokens = _loss(model, params, batch, jax.random.key(1), False)
    total_tokens += tokens
    # The plain negative log-likelihood of the real target tokens, computed directly.
    logp = jax.nn.log_softmax(
      compiled_apply(
        model, {"params": params}, batch["source"], batch["target_in"], source_valid_BxS=batch["source_valid"]
      )
    )
    nll = -np.take_along_axis(np.asarray(logp), batch["target_out"][..., None], -1)[..., 0]
    np.testing.assert_allclose(loss_sum, nll[batch["target_valid"]].sum(), rtol=1e-5)
    # Garbage in the padding changes nothing.
    noisy = dict(
      batch,
      target_out=np.where(batch["target_valid"], batch["target_out"], 3),
      target_in=np.where(batch["target_valid"], batch["target_in"], 5),
    )
    np.testing.assert_allclose(_loss(model, params, noisy, jax.random.key(1), False)[0], loss_sum, rtol=1e-6)
    # Smoothing 0.1: the target puts 0.9 + 0.1/V on the right token and 0.1/V on every other.
    smoothed, _ = _loss(model, params, batch, jax.random.key(1), True, label_smoothing=0.1)
    uniform = -np.asarray(logp).mean(-1)
    np.testing.assert_allclose(smoothed, (0.9 * nll + 0.1 * uniform)[batch["target_valid"]].sum(), rtol=1e-5)
  assert total_tokens == sum(len(t) + 1 for _, t in pairs)  # each target and its <|endoftext|>, once


@pytest.mark.slow
def test_a_tiny_model_overfits_a_handful_of_pairs_to_bleu_100():
  tok = tokenizers.CharTokenizer.from_corpus([s + t for s, t in PAIRS])
  pairs = [(np.array(tok.encode(s)), np.array(tok.encode(t))) for s, t in PAIRS]
  batches = pipeline.translation_batches(pairs, max_tokens=10_000, max_len=32, eot_id=tok.eot_id, seed=0)
  batch = batches[0]
  cfg = seq2seq.preset("cpu-tiny", vocab_size=tok.vocab_size, d_model=64, d_mlp=256)
  model = seq2seq.Transformer(cfg)
  opt = dataclasses.replace(resolve(translation_experiment.get_config("tiny")).optimizer, lr=3e-3, warmup_steps=20)
  tx, schedule = optim.make_optimizer(opt, 300), optim.learning_rate(opt, 300)
  params = compiled_init(model, batch["source"][:1], batch["target_in"][:1])
  state = train.TrainState(
    step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=jax.random.key_data(jax.random.key(1))
  )
  loss_fn = functools.partial(translation_loss, model, label_smoothing=0.0)
  step = jax.jit(functools.partial(train.train_step, loss_fn=loss_fn, tx=tx, schedule=schedule, accumulation_steps=1))
  for i in range(150):
    state, step_metrics = step(state, batches[i % len(batches)])
  assert step_metrics["loss"] < 0.05, step_metrics
  references = [t for _, t in PAIRS]
  for beam_size in (1, 3):
    hypotheses = beam_search.translate_texts(model, state.params, tok, [s for s, _ in PAIRS], beam_size=beam_size)
    scores = metrics.corpus_scores(hypotheses, references)
    assert scores["bleu"] > 99.9 and scores["chrf"] > 99.9, (beam_size, hypotheses)


@pytest.mark.slow
def test_packed_rows_give_every_pair_the_loss_it_has_alone():
  """Packing (several pairs a row, segment ids) changes no pair's loss: each reads its own source and
  its own earlier target tokens only, from position 0."""
  tok = tokenizers.CharTokenizer.from_corpus([s + t for s, t in PAIRS])
  pairs = [(np.array(tok.encode(s)), np.array(tok.encode(t))) for s, t in PAIRS]
  model = seq2seq.Transformer(seq2seq.preset("cpu-tiny", vocab_size=tok.vocab_size, max_len=96))
  params = compiled_init(model, jnp.zeros((1, 8), jnp.int32), jnp.zeros((1, 8), jnp.int32))
  alone = [
    _loss(model, params, b, jax.random.key(1), False)
    for b in pipeline.translation_batches(pairs, max_tokens=10_000, max_len=32, eot_id=tok.eot_id, seed=0)
  ]
  packed = pipeline.packed_batches(pairs, max_tokens=128, max_len=64, eot_id=tok.eot_id, seed=0)
  assert len(packed) == 1 and packed[0]["source"].shape == (2, 64)
  assert packed[0]["source_segments"].max() >= 3  # several pairs share a row
  together = [_loss(model, params, b, jax.random.key(1), False) for b in packed]
  np.testing.assert_allclose(sum(float(s) for s, _ in together), sum(float(s) for s, _ in alone), rtol=1e-5)
  assert sum(float(n) for _, n in together) == sum(float(n) for _, n in alone) == sum(len(t) + 1 for _, t in pairs)
  # Source rows longer than target rows (sources that carry a fuzzy match): the same losses.
  longer = pipeline.packed_batches(pairs, max_tokens=128, max_len=64, eot_id=tok.eot_id, seed=0, source_len=96)
  assert longer[0]["source"].shape == longer[0]["source_valid"].shape == (2, 96)
  assert longer[0]["target_in"].shape == longer[0]["target_segments"].shape == (2, 64)
  np.testing.assert_allclose(
    sum(float(_loss(model, params, b, jax.random.key(1), False)[0]) for b in longer),
    sum(float(s) for s, _ in alone),
    rtol=1e-5,
  )


@pytest.mark.slow
def test_an_epoch_of_packed_batches_compiles_the_step_once():
  rng = np.random.default_rng(0)
  pairs = [(rng.integers(1, 50, rng.integers(2, 30)), rng.integers(1, 50, rng.integers(2, 30))) for _ in range(120)]
  make = lambda batching: pipeline.TranslationBatches(
    pairs, max_tokens=256, max_len=32, eot_id=0, seed=0, batching=batching
  )
  # Bucketed: a batch shape (a compile) per length bucket and fill size.
  bucketed, shapes = make("bucketed"), set()
  while bucketed.epoch == 0:
    shapes.add(next(bucketed)["source"].shape)
  assert len(shapes) > 3
  batches = make("packed")
  model = seq2seq.Transformer(seq2seq.preset("cpu-tiny", vocab_size=50))
  opt = resolve(translation_experiment.get_config("tiny")).optimizer
  tx, schedule = optim.make_optimizer(opt, 100), optim.learning_rate(opt, 100)
  params = compiled_init(model, jnp.zeros((1, 8), jnp.int32), jnp.zeros((1, 8), jnp.int32))
  state = train.TrainState(
    step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=jax.random.key_data(jax.random.key(1))
  )

  @jax.jit
  @chex.assert_max_traces(n=1)  # a second trace (a new batch shape) fails here
  def step(state, batch):
    return train.train_step(
      state, batch, loss_fn=functools.partial(translation_loss, model), tx=tx, schedule=schedule, accumulation_steps=1
    )

  steps = 0
  while batches.epoch == 0:
    state, _ = step(state, next(batches))
    steps += 1
  assert steps > 3 and step._cache_size() == 1


@pytest.mark.parametrize("batching", ["packed", "bucketed"])
def test_batches_resume_exactly(batching):
  pairs = [(np.arange(1, 2 + i % 7), np.arange(1, 3 + i % 5)) for i in range(50)]
  make = lambda: pipeline.TranslationBatches(pairs, max_tokens=64, max_len=16, eot_id=0, seed=3, batching=batching)
  straight = make()
  seen = [next(straight) for _ in range(25)]  # past the end of the first epoch
  assert straight.get_state()["epoch"] >= 1
  resumed = make()
  [next(resumed) for _ in range(11)]
  state = json.loads(json.dumps(resumed.get_state()))  # as a checkpoint stores it
  again = make()
  again.set_state(state)
  for expected in seen[11:]:
    got = next(again)
    for key in expected:
      np.testing.assert_array_equal(got[key], expected[key])


# ---------------------------------------------------------------------------------------------
# Through train_and_evaluate and the launch programs.


def _pairs_tsv(path):
  words = ["eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn"]
  english = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
  lines = [
    f"Ich habe {words[i % 10]} {['Katzen', 'Hunde'][i // 10 % 2]} gesehen.\t"
    f"I saw {english[i % 10]} {['cats', 'dogs'][i // 10 % 2]}. ({i})"
    for i in range(240)
  ]
  path.write_text("\n".join(lines) + "\n")
  # A lexicon of the words, for training only (data.lexicon).
  lexicon = [*zip(words, english), ("Katzen", "cats"), ("Hunde", "dogs"), ("gesehen", "seen")]
  (path.parent / "lexicon.tsv").write_text("".join(f"{de}\t{en}\n" for de, en in lexicon))
  return path


# The tiny preset on a TSV, character-level. Every length bucket's batch size (batch_tokens /
# bucket length) is a multiple of 4, so 1 and 4 data-parallel devices see the same batches.
OVERRIDES = {
  "data.tokenizer": "char",
  "data.direction": "",
  "data.validation_fraction": 0.1,
  "data.test_fraction": 0.1,
  "data.max_len": 48,
  "model.max_len": 48,
  "batch_tokens": 1920,
  "lexicon_share": 0.2,
  "eval.average_last": 2,
  "eval.test_sentences": 10,
}


def _config(tsv, data_root, **changes):
  c = translation_experiment.get_config("tiny")
  c.data.input_files = (str(tsv),)
  c.data.lexicon = str(tsv.parent / "lexicon.tsv")
  c.data.root = str(data_root)
  for key, value in {**OVERRIDES, **changes}.items():
    section, _, field = key.rpartition(".")
    (c[section] if section else c)[field] = value
  return c


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  root = tmp_path_factory.mktemp("mt")
  tsv = _pairs_tsv(root / "pairs.tsv")
  result = train.train_and_evaluate(_config(tsv, root / "data"), root / "w")
  return root, tsv, result


@pytest.mark.slow
def test_training_writes_dev_and_test_scores(trained):
  root, _, result = trained
  records = metrics.read_jsonl(root / "w" / "metrics.jsonl")
  dev = [r for r in records if "dev_bleu" in r]
  assert [r["step"] for r in dev] == [10, 20]
  assert all(0 <= r["dev_bleu"] <= 100 and 0 <= r["dev_chrf"] <= 100 and np.isfinite(r["val_loss"]) for r in dev)
  final = [r for r in records if "test_bleu_greedy" in r]
  assert len(final) == 1 and {"test_chrf_greedy", "test_bleu_beam2", "test_chrf_beam2"} <= set(final[0])
  assert "test_bleu_greedy_last" in final[0]  # the final params, beside the average of steps 10 and 20
  assert all(r["train_time_s"] > 0 for r in dev) and dev[0]["train_time_s"] < dev[1]["train_time_s"]
  assert (root / "w" / "loss.png").stat().st_size > 10_000  # losses, and dev BLEU and chrF by minutes
  # The best checkpoint is the one of the highest dev BLEU.
  ckpt = checkpoints.Checkpointer(root / "w" / "checkpoints", read_only=True, best=("dev_bleu", "max"))
  assert ckpt.best_step() == max(dev, key=lambda r: r["dev_bleu"])["step"]
  assert result["test_bleu_beam2"] == final[0]["test_bleu_beam2"]
  rows = (root / "w" / "test_translations.tsv").read_text().splitlines()
  assert rows[0] == "source\treference\tgreedy\tbeam" and len(rows) == 1 + 10  # eval.test_sentences of 24
  assert all(len(r.split("\t")) == 4 for r in rows)
  assert rows[1].split("\t")[0].startswith("Ich habe") and rows[1].split("\t")[1].startswith("I saw")
  losses = metrics.last_per_step(records, "loss")
  assert losses[20] < losses[5]


@pytest.mark.slow
def test_a_tagged_lexicon_starts_its_sources_with_endoftext_and_only_it_does(trained):
  root, tsv, _ = trained
  plain = train.build(resolve(_config(tsv, root / "data"), num_devices=1)).task
  tagged = train.build(resolve(_config(tsv, root / "data", lexicon_tag=True), num_devices=1)).task
  eot = tagged.tokenizer.eot_id
  assert plain._lexicon and [(list(s), list(t)) for s, t in tagged._lexicon] == [
    ([eot, *s], list(t)) for s, t in plain._lexicon
  ]
  assert all(source[0] != eot for source, _ in tagged._pairs["train"])
  # In the packed training batches, a pair whose source starts with the tag is a lexicon pair.
  as_keys = lambda pairs: {(tuple(source), tuple(target)) for source, target in pairs}
  tagged_lexicon, plain_lexicon = as_keys(tagged._lexicon), as_keys(plain._lexicon)
  batches = tagged.train_batches()
  tagged_pairs = 0
  for _ in range(4):
    batch = next(batches)
    for row in range(batch["source"].shape[0]):
      for segment in set(batch["source_segments"][row]) - {0}:
        source = batch["source"][row][batch["source_segments"][row] == segment]
        target = batch["target_out"][row][batch["target_segments"][row] == segment][:-1]  # without <eot>
        key = (tuple(source), tuple(target))
        assert (key in tagged_lexicon) == (source[0] == eot) and key not in plain_lexicon
        tagged_pairs += int(source[0] == eot)
  assert tagged_pairs > 0


@pytest.mark.slow
def test_launch_probe_on_a_translation_draws_the_alignment(trained, tmp_path):
  root, _, _ = trained
  proc = run_module(
    "launch.probe",
    f"--workdir={root / 'w'}",
    "--text=Ich habe drei Katzen gesehen.",
    "--target=I saw three cats.",
    f"--out={tmp_path}",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  nontrivial_png(tmp_path / "alignment.png", min_colors=5)
  nontrivial_png(tmp_path / "encoder_attention.png")
  numbers = json.loads((tmp_path / "inside.json").read_text())
  assert numbers["source_tokens"][:3] == ["I", "c", "h"] and len(numbers["cross_attention"]) == 2


@pytest.mark.slow
def test_resume_continues_the_same_run(trained, tmp_path):
  root, tsv, _ = trained
  config = _config(tsv, root / "data", num_train_steps=10)
  train.train_and_evaluate(config, tmp_path)
  config.num_train_steps = 20
  train.train_and_evaluate(config, tmp_path)
  straight = metrics.last_per_step(metrics.read_jsonl(root / "w" / "metrics.jsonl"), "loss")
  resumed = metrics.last_per_step(metrics.read_jsonl(tmp_path / "metrics.jsonl"), "loss")
  np.testing.assert_allclose([resumed[15], resumed[20]], [straight[15], straight[20]], rtol=1e-5)


@pytest.mark.slow
def test_launch_translate_from_flags_stdin_and_file(trained, tmp_path):
  """Each way of giving sentences, each with one of the decoding flags, against the library."""
  root, _, _ = trained
  workdir = root / "w"
  sentences = ["Ich habe drei Katzen gesehen.", "Ich habe zehn Hunde gesehen."]
  (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n")
  common = [f"--workdir={workdir}", "--beam_size=2"]
  restored = inference.restore(workdir, task="translation")
  translate = lambda restored, **kwargs: beam_search.translate_texts(
    restored.model,
    restored.params,
    restored.tokenizer,
    sentences,
    beam_size=2,
    mesh=restored.mesh,
    rules=restored.rules,
    **kwargs,
  )
  by_flag = run_module("launch.translate", *common, *[f"--sentence={s}" for s in sentences])
  assert by_flag.returncode == 0, by_flag.stderr
  assert by_flag.stdout.splitlines() == translate(restored)
  # From stdin; --no_repeat_ngram decodes as translate_texts(no_repeat_ngram=...) does.
  by_stdin = run_module(
    "launch.translate", *common, "--input_file=-", "--no_repeat_ngram=1", stdin="\n".join(sentences)
  )
  assert by_stdin.returncode == 0, by_stdin.stderr
  assert by_stdin.stdout.splitlines() == translate(restored, no_repeat_ngram=1)
  # From a file, with the mean of the last two checkpoints' params.
  averaged = run_module("launch.translate", *common, "--average=2", f"--input_file={tmp_path / 'in.txt'}")
  assert averaged.returncode == 0 and "steps [10, 20] averaged" in averaged.stderr, averaged.stderr
  mean = inference.restore(workdir, task="translation", average=2)
  ends = [inference.restore(workdir, step, task="translation").params for step in (10, 20)]
  jax.tree.map(lambda m, a, b: np.testing.assert_allclose(m, (a + b) / 2, rtol=1e-6), mean.params, *ends)
  assert averaged.stdout.splitlines() == translate(mean)
  # --split=test: the run's test split, as the run translated it at its end (the mean of the last two
  # checkpoints, greedy; the run scored its first 10 pairs), with sacreBLEU's scores.
  split = run_module("launch.translate", f"--workdir={workdir}", "--average=2", "--beam_size=1", "--split=test")
  assert split.returncode == 0 and "# test split, 16 pairs: BLEU " in split.stderr, split.stderr
  rows = [r.split("\t") for r in (workdir / "test_translations.tsv").read_text().splitlines()[1:]]
  one_line = lambda text: " ".join(text.split())  # as the TSV writes a translation
  assert [one_line(t) for t in split.stdout.splitlines()[:10]] == [r[2] for r in rows]
  assert len(split.stdout.splitlines()) == 16


@pytest.mark.slow
def test_launch_translate_ensembles_runs_of_one_tokenizer(trained, tmp_path):
  """--ensemble: another seed's run decodes with the first (as restore_ensemble gives it in process),
  a run with itself decodes as it alone, and a run of another tokenizer is refused by name."""
  root, tsv, _ = trained
  other = tmp_path / "seed1"
  train.train_and_evaluate(_config(tsv, root / "data", seed=1, **{"eval.average_last": 1}), other)
  sentences = ["Ich habe drei Katzen gesehen.", "Ich habe zehn Hunde gesehen."]
  common = [f"--workdir={root / 'w'}", "--beam_size=2", *[f"--sentence={s}" for s in sentences]]
  both = run_module("launch.translate", *common, f"--ensemble={other}")
  assert both.returncode == 0 and "+ 1 more workdir(s), an ensemble" in both.stderr, both.stderr
  ensemble = inference.restore_ensemble([root / "w", other])
  assert [m.run.loop.seed for m in ensemble.members] == [0, 1] and set(ensemble.params) == {"member_0", "member_1"}
  expected = beam_search.translate_texts(
    ensemble.model,
    ensemble.params,
    ensemble.tokenizer,
    sentences,
    beam_size=2,
    mesh=ensemble.mesh,
    rules=ensemble.rules,
  )
  assert both.stdout.splitlines() == expected
  itself = run_module("launch.translate", *common, f"--ensemble={root / 'w'}")
  alone = inference.restore(root / "w", task="translation")
  expected = beam_search.translate_texts(
    alone.model, alone.params, alone.tokenizer, sentences, beam_size=2, mesh=alone.mesh, rules=alone.rules
  )
  assert itself.returncode == 0 and itself.stdout.splitlines() == expected
  # The same vocabulary size but other characters: the ids would mean other things.
  config_file = other / "tokenizer" / "tokenizer.json"
  tokenizer = json.loads(config_file.read_text())
  tokenizer["chars"] = tokenizer["chars"][::-1]
  config_file.write_text(json.dumps(tokenizer))
  refused = run_module("launch.translate", *common, f"--ensemble={other}")
  assert refused.returncode == 1 and f"error: {other}'s tokenizer differs from {root / 'w'}'s" in refused.stderr, (
    refused.stderr
  )


@pytest.mark.slow
def test_fuzzy_matches_are_read_in_training_evaluation_and_launch_translate(tmp_path):
  """data.fuzzy_match_tokens: every source is followed by <eot> and its fuzzy match; the memory goes
  into the workdir, and a restored model (launch.translate) reads new sentences the same way."""
  words = ["eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn"]
  english = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
  tsv = tmp_path / "pairs.tsv"
  # Each number is in four sentences (with other counts): those are a sentence's fuzzy matches.
  tsv.write_text(
    "".join(
      f"Ich habe {words[i % 7]} Katzen gesehen , Nummer {i % 60} .\tI saw {english[i % 7]} cats , number {i % 60} .\n"
      for i in range(240)
    )
  )
  config = _config(
    tsv,
    tmp_path / "data",
    **{
      "data.tokenizer": "word",
      "data.vocab_size": 200,
      "data.lexicon": "",
      "data.max_len": 24,
      "data.fuzzy_match_tokens": 12,
      "model.max_len": 36,
      "eval.average_last": 1,
    },
  )
  train.train_and_evaluate(config, tmp_path / "w")
  task = train.build(resolve(config, num_devices=1)).task
  eot = task.tokenizer.eot_id
  # Every source: the sentence, <eot>, then at most 12 tokens of another training pair's target.
  for _split, pairs in task._pairs.items():
    for source, _ in pairs:
      ends = np.flatnonzero(source == eot)
      assert len(ends) == 1 and len(source) - ends[0] - 1 <= 12 and len(source) <= 36
  matched = [s for s, _ in task._pairs["test"] if s[-1] != eot]
  assert len(matched) > len(task._pairs["test"]) // 2  # the numbers recur, so most test sentences have a match
  rows = [r.split("\t") for r in (tmp_path / "w" / "test_translations.tsv").read_text().splitlines()]
  assert rows[0] == ["source", "fuzzy_match", "reference", "greedy", "beam"]
  assert all(r[0].startswith("Ich habe") and "<|endoftext|>" not in r[0] for r in rows[1:])
  assert any(r[1].startswith("I saw") for r in rows[1:])
  # Restored: the memory comes from the workdir, and new sentences get the matches training gave.
  restored = inference.restore(tmp_path / "w", task="translation")
  assert restored.task.memory is not None and len(restored.task.memory.sources) == len(task._pairs["train"])
  sentences = [row[0] for row in rows[1:4]]
  for got, (want, _) in zip(inference.translation_sources(restored, sentences), task._pairs["test"]):
    np.testing.assert_array_equal(got, want)
  result = run_module(
    "launch.translate", f"--workdir={tmp_path / 'w'}", "--beam_size=2", *[f"--sentence={s}" for s in sentences]
  )
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == [row[4] for row in rows[1:4]]  # the run's own beam translations
  (tmp_path / "w" / "translation_memory.npz").unlink()
  with pytest.raises(UserError, match="trained with fuzzy matches .* but holds no translation_memory.npz"):
    inference.restore(tmp_path / "w", task="translation")


@pytest.mark.slow
def test_launch_translate_refuses_a_split_of_data_that_changed(trained, tmp_path):
  root, _, _ = trained
  # A copy of the run that reads a copy of its data: the module's run keeps its files.
  workdir = tmp_path / "w"
  shutil.copytree(root / "w", workdir)
  for name in ("pairs.tsv", "lexicon.tsv"):
    shutil.copy(root / name, tmp_path / name)
  config = json.loads((workdir / "config.json").read_text())
  config["data"].update(
    input_files=[str(tmp_path / "pairs.tsv")], lexicon=str(tmp_path / "lexicon.tsv"), root=str(tmp_path / "data")
  )
  (workdir / "config.json").write_text(json.dumps(config))
  args = [f"--workdir={workdir}", "--beam_size=1", "--split=test"]
  same = run_module("launch.translate", *args)
  assert same.returncode == 0 and "# test split, 16 pairs: BLEU " in same.stderr, same.stderr[-3000:]
  with (tmp_path / "pairs.tsv").open("a") as f:
    f.write("Ich habe elf Katzen gesehen.\tI saw eleven cats.\n")
  changed = run_module("launch.translate", *args)
  assert changed.returncode == 1 and not changed.stdout, changed.stderr[-3000:]
  assert (
    f"error: the training data changed since the run in {workdir} started: pairs.tsv (sha256" in changed.stderr
    and "its splits are no longer the ones the run was scored on" in changed.stderr
  ), changed.stderr[-3000:]


@pytest.mark.slow
def test_a_restored_run_names_its_direction_from_its_config(trained, tmp_path, monkeypatch):
  root, _, _ = trained
  assert inference.restore(root / "w", task="translation").task.direction == "source-target"  # a TSV's
  # The same run as if trained on ding_de_en: its columns' names, without fetching the data set.
  shutil.copytree(root / "w", tmp_path / "w")
  config = json.loads((tmp_path / "w" / "config.json").read_text())
  config["data"].update(dataset="ding_de_en", input_files=[])
  (tmp_path / "w" / "config.json").write_text(json.dumps(config))
  monkeypatch.setattr(assets, "fetch", lambda *args, **kwargs: pytest.fail("restoring a model fetched its data"))
  assert inference.restore(tmp_path / "w", task="translation").task.direction == "de-en"


@pytest.mark.parametrize(
  "args,message",
  [
    (["--sentence=" + "Ich habe " * 20], "sentence 0 is 179 tokens, longer than the model's max_len=48"),
    ([], "nothing to translate: give --sentence or --input_file"),
    (["--sentence=Hallo", "--input_file=/no/such.txt"], "--input_file=/no/such.txt: no such file"),
    (["--sentence=Hallo", "--split=test"], "--split translates the run's data: give it without --sentence"),
  ],
)
@pytest.mark.slow
def test_launch_translate_errors(trained, args, message):
  root, _, _ = trained
  result = run_module("launch.translate", f"--workdir={root / 'w'}", *args)
  assert result.returncode == 1 and f"error: {message}" in result.stderr, result.stderr


@pytest.mark.slow
def test_workdirs_of_the_other_task_are_refused_by_name(trained):
  root, _, _ = trained
  with pytest.raises(inference.WrongTaskError, match=r"holds a 'translation' model \(config.task\), not a 'lm' one"):
    inference.restore(root / "w", task="lm")
  # The launch programs name the one that can (the library names none).
  with pytest.raises(UserError, match=r"not a 'lm' one; use python -m launch.translate"):
    launch.load("lm", workdir=str(root / "w"), step="latest")


@pytest.mark.parametrize(
  "changes,message",
  [
    ({"data.max_len": 64}, "--config.data.max_len=64 is longer than --config.model.max_len=48"),
    ({"data.test_fraction": 0.0}, "set --config.data.test_fraction > 0"),
    (
      {"data.direction": "de-fr"},
      "unknown direction 'de-fr' for this data set; choose 'source-target' or 'target-source'",
    ),
    ({"label_smoothing": 1.0}, r"--config.label_smoothing must be in \[0, 1\)"),
    ({"batch_tokens": 16}, "--config.batch_tokens=16 cannot hold one pair of --config.data.max_len=48"),
    (
      {"eval.average_last": 4},
      "--config.eval.average_last=4 averages more checkpoints than --config.keep_checkpoints=3 keeps",
    ),
    ({"lexicon_share": 1.0}, r"--config.lexicon_share must be in \[0, 1\)"),
    ({"data.fuzzy_match_tokens": -1}, r"--config.data.fuzzy_match_tokens must be >= 0 \(0: off\)"),
    (
      {"data.fuzzy_match_tokens": 8, "data.batching": "bucketed"},
      "--config.data.fuzzy_match_tokens needs --config.data.batching=packed",
    ),
    (
      {"data.fuzzy_match_tokens": 8},
      r"--config.data.max_len=48 \+ --config.data.fuzzy_match_tokens=8 is longer than "
      "--config.model.max_len=48",
    ),
    ({"eval.test_sentences": -1}, r"--config.eval.test_sentences must be >= 0 \(0: the whole test split\)"),
    ({"eval.no_repeat_ngram": -1}, r"--config.eval.no_repeat_ngram must be >= 0 \(0: off\), got -1"),
    ({"data.lexicon": "dictionary"}, "has no dictionary entries of its own"),
    (
      {"data.lexicon": "", "lexicon_tag": True},
      "--config.lexicon_tag tags the lexicon's pairs, but there is no lexicon; set --config.data.lexicon",
    ),
    ({"task": "parsing"}, "--config.task='parsing' is unknown; choose one of lm, translation, classification, tagging"),
  ],
)
def test_bad_translation_configs_are_named(tmp_path, changes, message):
  tsv = _pairs_tsv(tmp_path / "pairs.tsv")
  with pytest.raises(UserError, match=message):
    train.train_and_evaluate(_config(tsv, tmp_path / "data", **changes), tmp_path)
  assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_eight_devices_give_the_same_losses(trained, tmp_path):
  """Data, fsdp and tensor parallel (2 x 2 x 2 fake CPU devices) train like one device."""
  root, tsv, _ = trained
  flags = [f"--config.{k}={v}" for k, v in OVERRIDES.items()]
  proc = run_module(
    "launch.train",
    "--config=experiments/translation.py:tiny",
    f"--workdir={tmp_path}",
    f"--config.data.input_files={tsv}",
    f"--config.data.root={root / 'data'}",
    *flags,
    f"--config.data.lexicon={tsv.parent / 'lexicon.tsv'}",
    "--config.mesh.data=2",
    "--config.mesh.fsdp=2",
    "--config.mesh.tensor=2",
    env={"JAX_NUM_CPU_DEVICES": "8"},
  )
  assert proc.returncode == 0, proc.stderr
  assert "8 x cpu" in proc.stdout
  assert "(source-target)" in proc.stdout  # own pairs without --config.data.direction: their column order
  # The test table: the final params (greedy) beside the mean of the last two checkpoints.
  assert "greedy, final params" in proc.stdout and "beam 2, alpha 0.6, mean of 2" in proc.stdout
  one = metrics.read_jsonl(root / "w" / "metrics.jsonl")
  eight = metrics.read_jsonl(tmp_path / "metrics.jsonl")
  for key in ("loss", "val_loss"):
    a, b = metrics.last_per_step(one, key), metrics.last_per_step(eight, key)
    assert sorted(a) == sorted(b) and len(a) >= 2
    # Float rounding of reductions split 8 ways, grown over 20 steps of Adam: up to 4e-4 of the loss
    # when compiled at -O0 as the suite does (within 1e-4 at XLA's default). A sharding mistake (a shard's
    # tokens dropped or counted twice, a wrong normaliser) moves the losses by percents.
    np.testing.assert_allclose([b[s] for s in sorted(b)], [a[s] for s in sorted(a)], rtol=1e-3)


@pytest.mark.slow
def test_launch_evaluate_scores_a_pairs_file_and_a_split(trained, tmp_path):
  """launch.evaluate on a user's source<TAB>reference file: sacreBLEU's scores of the translations
  inference.translate makes; on the test split, the run's 16 test pairs."""
  root, tsv, _ = trained
  pairs = [line.split("\t") for line in tsv.read_text().splitlines()[:6]]
  (tmp_path / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
  workdir = root / "w"
  runs = [
    [f"--workdir={workdir}", f"--input_file={tmp_path / 'pairs.tsv'}", "--beam_size=1"],
    [f"--workdir={workdir}", "--split=test", "--beam_size=2"],
  ]
  by_file, by_split = run_cases("launch.evaluate", [{"args": a} for a in runs], tmp_path)
  assert by_file["status"] == 0 and by_split["status"] == 0, by_file["stderr"][-2000:] + by_split["stderr"][-2000:]
  restored = inference.restore(workdir)
  texts = inference.translate(restored, inference.translation_sources(restored, [s for s, _ in pairs]), beam_size=1)
  want = metrics.corpus_scores(texts, [t for _, t in pairs])
  lines = by_file["stdout"].splitlines()
  assert f"BLEU      {want['bleu']:.2f}" in lines and f"chrF      {want['chrf']:.2f}" in lines
  assert "pairs     16" in by_split["stdout"].splitlines()
