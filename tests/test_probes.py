"""Probes of a model's insides (transformer.interp.probes, launch.probe): attention maps, the residual
stream, the logit lens, contextual embeddings, the translation alignment, and the pictures."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.errors import UserError
from transformer.interp import probe_page, probes, studies
from transformer.layers import stack_layers
from transformer.models.gpt import GPT, GPTConfig
from transformer.models.seq2seq import Seq2SeqConfig, Transformer
from transformer.tokenizers import get_tokenizer

from conftest import compiled_init, nontrivial_png, run_cases, run_module

TEXT = "Harry stood at the edge of the Forbidden Forest."
OTHER = "Prince Harry delivered a heartfelt speech at a gala."


@pytest.fixture(scope="module")
def tokenizer():
  return get_tokenizer("char", corpus=[TEXT + OTHER + " Ich habe keine Zeit. I have no time."])


# Synthesizer attention; today's options together (rotary, RMSNorm, SwiGLU, QK-norm, untied, capped).
MODERN = dict(
  positions="rope", norm="rms_norm", activation="swiglu", qk_norm=True, tie_embeddings=False, logits_softcap=5.0
)


@pytest.fixture(scope="module", params=["dot_product", "synthesizer_dense", "modern"])
def gpt(request, tokenizer):
  changes = MODERN if request.param == "modern" else {"attention_mechanism": request.param}
  cfg = GPTConfig().replace(
    vocab_size=tokenizer.vocab_size, max_len=64, num_layers=3, num_heads=2, d_model=32, **changes
  )
  return GPT(cfg), compiled_init(GPT(cfg), np.zeros((1, 8), np.int32))


@pytest.mark.slow
def test_attention_rows_are_causal_probabilities_and_the_lens_ends_at_the_logits(gpt, tokenizer):
  model, params = gpt
  inside = probes.look_inside(model, params, tokenizer, TEXT)
  T = len(tokenizer.encode(TEXT))
  assert inside.attention_LxHxTxT.shape == (3, 2, T, T) and inside.residual_LxTxD.shape == (4, T, 32)
  np.testing.assert_allclose(inside.attention_LxHxTxT.sum(-1), 1.0, atol=1e-5)
  assert np.all(np.triu(inside.attention_LxHxTxT, k=1) == 0.0)  # no query sees a later token
  plain_logits = model.apply({"params": params}, jnp.asarray([tokenizer.encode(TEXT)]))[0]
  np.testing.assert_allclose(inside.logits_TxV, plain_logits, atol=1e-5)  # probing changes nothing
  # The last layer's residual through the final norm and head is the model's output; so the lens's
  # last row predicts what the model predicts.
  last = model.apply({"params": params}, jnp.asarray(inside.residual_LxTxD[-1:]), method="output_logits")[0]
  np.testing.assert_allclose(last, inside.logits_TxV, atol=1e-5)
  np.testing.assert_array_equal(inside.lens_LxTxV[-1].argmax(-1), inside.logits_TxV.argmax(-1))
  top = inside.lens_top(2, tokenizer)
  assert len(top) == 4 and len(top[0]) == T and all(0 <= p <= 1 for _, p in top[-1][-1])


def test_scanned_layers_give_the_same_insides(tokenizer):
  cfg = GPTConfig().replace(vocab_size=tokenizer.vocab_size, max_len=64, num_layers=3, num_heads=2, d_model=32)
  params = compiled_init(GPT(cfg), np.zeros((1, 8), np.int32))
  unrolled = probes.look_inside(GPT(cfg), params, tokenizer, TEXT)
  scanned_params = {**params, "h": stack_layers(params["h"], 3)}
  scanned = probes.look_inside(GPT(cfg.replace(scan_layers=True)), scanned_params, tokenizer, TEXT)
  np.testing.assert_allclose(scanned.attention_LxHxTxT, unrolled.attention_LxHxTxT, atol=1e-6)
  np.testing.assert_allclose(scanned.residual_LxTxD, unrolled.residual_LxTxD, atol=1e-5)


@pytest.mark.slow
def test_contextual_embeddings(gpt, tokenizer):
  model, params = gpt
  same = probes.similarity_by_layer(model, params, tokenizer, [TEXT, TEXT], "Harry")
  np.testing.assert_allclose(same, 1.0, atol=1e-5)  # a token compared with itself in identical texts
  other = probes.similarity_by_layer(model, params, tokenizer, [TEXT, OTHER], "Harry")
  assert other.shape == (4, 2, 2) and np.all(other[1:, 0, 1] < 0.9999)  # another context, another vector
  if model.config.positions == "rope":  # no position added to the embeddings: there, the token alone
    np.testing.assert_allclose(other[0, 0, 1], 1.0, atol=1e-5)
  else:  # and its position
    assert other[0, 0, 1] < 0.9999
  assert probes.word_position(tokenizer, OTHER, "Harry") == OTHER.index("Harry") + 4  # its last character
  with pytest.raises(UserError, match="'Ron' does not occur"):
    probes.word_position(tokenizer, TEXT, "Ron")


@pytest.mark.slow
def test_translation_alignment_rows_are_probabilities_over_the_source(tokenizer):
  cfg = Seq2SeqConfig().replace(
    vocab_size=tokenizer.vocab_size, max_len=32, num_layers=3, num_decoder_layers=2, num_heads=2, d_model=16, d_mlp=32
  )
  model = Transformer(cfg)
  params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4), jnp.int32))["params"])
  inside = probes.look_inside(model, params, tokenizer, "Ich habe keine Zeit.", target="I have no time.")
  S, T = len("Ich habe keine Zeit."), len("I have no time.") + 1  # <eot> starts the target (decoder input)
  assert inside.cross_attention_LxHxTxS.shape == (2, 2, T, S) and len(inside.source_tokens) == S
  assert inside.encoder_attention_LxHxSxS.shape == (3, 2, S, S) and inside.residual_LxTxD.shape[0] == 2 + 1
  np.testing.assert_allclose(inside.cross_attention_LxHxTxS.sum(-1), 1.0, atol=1e-5)
  assert np.all(np.triu(inside.attention_LxHxTxT, k=1) == 0.0)
  last = model.apply({"params": params}, jnp.asarray(inside.residual_LxTxD[-1:]), method="output_logits")[0]
  np.testing.assert_allclose(last, inside.logits_TxV, atol=1e-5)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("lm")
  proc = run_module(
    "launch.train",
    "--config=experiments/shakespeare.py:tiny",
    "--config.sample.max_new_tokens=0",
    "--config.num_train_steps=20",
    f"--config.data.root={workdir / 'data'}",
    f"--workdir={workdir}",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir


@pytest.mark.slow
def test_launch_probe_draws_pictures_and_compares_a_word(trained, tmp_path):
  proc = run_module("launch.probe", f"--workdir={trained}", "--text=ROMEO: But soft", f"--out={tmp_path / 'p'}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in ("attention.png", "residual_norms.png", "logit_lens.png"):
    nontrivial_png(tmp_path / "p" / name)
  numbers = json.loads((tmp_path / "p" / "inside.json").read_text())
  assert numbers["tokens"] == list("ROMEO: But soft") and len(numbers["attention"]) == 2
  assert "logit lens at the last position, by layer" in proc.stdout
  page = (tmp_path / "p" / "index.html").read_text()  # the run's one page, its path printed last
  assert proc.stdout.splitlines()[-1] == str(tmp_path / "p" / "index.html") and 'href="inside.json"' in page
  assert all(f'<img src="{name}"' in page for name in ("attention.png", "residual_norms.png", "logit_lens.png"))
  proc = run_module(
    "launch.probe",
    f"--workdir={trained}",
    "--compare",
    "--word=Harry",
    f"--text={TEXT}",
    f"--text={TEXT}",
    f"--text={OTHER}",
    f"--out={tmp_path / 'c'}",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(("embed", "block"))]
  assert len(rows) == 3 and all(float(r[-2]) == pytest.approx(1.0, abs=1e-4) for r in rows)
  bad = run_module("launch.probe", f"--workdir={trained}", "--compare", f"--text={TEXT}")
  assert bad.returncode == 1 and "error: --compare needs --word and at least two --text" in bad.stderr
  # A run's heads, scored on tokens its text has; the loss without one, on its validation text too.
  proc = run_module("launch.probe", f"--workdir={trained}", "--heads", "--ablate=L0.H1", f"--out={tmp_path / 'h'}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  losses = [line for line in proc.stdout.splitlines() if line.startswith("loss (")]
  assert len(losses) == 2 and all(", validation " in line for line in losses), proc.stdout
  assert losses[0].split()[-1] != losses[1].split()[-1]  # the head's removal changes the validation loss
  # Linear probes for the current character on the run's validation text, at the embeddings and each layer.
  proc = run_module("launch.probe", f"--workdir={trained}", "--probe", "--probe_offset=0", f"--out={tmp_path / 'q'}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  found = json.loads((tmp_path / "q" / "probe.json").read_text())
  assert found["offset"] == 0 and list(found["accuracy"]) == ["embeddings", "layer 0", "layer 1"]
  assert found["accuracy"]["embeddings"]["test_accuracy"] > 0.9  # the current character, from its own embedding


@pytest.mark.slow
def test_launch_probe_reads_hugging_face_gpt2_weights(tmp_path):
  from transformer.models.formats.gpt2 import export_hf_gpt2

  cfg = GPTConfig().replace(max_len=32, num_layers=2, num_heads=2, d_model=16)  # GPT-2's vocabulary
  export_hf_gpt2(cfg, GPT(cfg).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"], tmp_path / "hf")
  proc = run_module("launch.probe", f"--hf={tmp_path / 'hf'}", "--text=Every effort moves you", f"--out={tmp_path}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  numbers = json.loads((tmp_path / "inside.json").read_text())
  assert numbers["tokens"] == ["Every", " effort", " moves", " you"] and len(numbers["attention"]) == 2
  nontrivial_png(tmp_path / "attention.png")
  hf = f"--hf={tmp_path / 'hf'}"
  clean, corrupt = (
    "--clean=When Mary and John went, John gave it to",
    "--corrupt=When Mary and John went, Mary gave it to",
  )
  heads, mean, attribute, patch, path, *bad = run_cases(
    "launch.probe",
    [
      {"args": [hf, "--heads", "--ablate=L1.H0", f"--out={tmp_path / 'heads'}"]},
      {"args": [hf, "--heads", "--ablate=L1.H0,L0.H1", "--ablation=mean", f"--out={tmp_path / 'mean'}"]},
      {
        "args": [
          hf,
          "--attribute",
          "--text=When Mary and John went, John gave it to",
          "--target= Mary",
          "--versus= John",
          f"--out={tmp_path / 'attribute'}",
        ]
      },
      {"args": [hf, "--patch", clean, corrupt, "--target= Mary", "--versus= John", f"--out={tmp_path / 'patch'}"]},
      {
        "args": [
          hf,
          "--path",
          clean,
          corrupt,
          "--target= Mary",
          "--versus= John",
          "--sender=L0.H1",
          "--receivers=L1.k,L1.H0.q",
          f"--out={tmp_path / 'path'}",
        ]
      },
      {"args": [hf, "--patch", clean, "--corrupt=When Mary and John went", "--target= Mary"]},
      {"args": [hf, "--attribute", "--text=When Mary", "--target= Marylebone"]},
      {"args": [hf, "--patch", clean, corrupt]},
    ],
    tmp_path,
  )
  assert heads["status"] == 0, heads["stderr"][-3000:]
  rows = [line.split() for line in heads["stdout"].splitlines() if line.startswith("L")]
  assert [r[0] for r in rows] == ["L0.H0", "L0.H1", "L1.H0", "L1.H1"] and all(len(r) == 4 for r in rows)
  losses = [line for line in heads["stdout"].splitlines() if line.startswith("loss (")]
  assert len(losses) == 2 and losses[1].startswith("loss (without L1.H0 (zero ablation)): first copy"), heads["stdout"]
  assert mean["status"] == 0 and "loss (without L1.H0,L0.H1 (mean ablation))" in mean["stdout"], mean["stderr"][-3000:]
  # The logit difference, split into its parts: they sum to the model's own.
  assert attribute["status"] == 0, attribute["stderr"][-3000:]
  shares = json.loads((tmp_path / "attribute" / "attribution.json").read_text())
  assert {"embed", "pos_embed", "L0.H0", "L1.H1", "L1.mlp", "final_norm_bias"} <= set(shares["contributions"])
  assert sum(shares["contributions"].values()) == pytest.approx(shares["logit"], abs=1e-3)
  nontrivial_png(tmp_path / "attribute" / "attribution.png")
  # Patching John's position of the residual stream at layer 0 makes the corrupt run the clean one there.
  assert patch["status"] == 0, patch["stderr"][-3000:]
  numbers = json.loads((tmp_path / "patch" / "patching.json").read_text())
  positions = np.array(numbers["maps"]["patched resid_pre, layer x position"])
  assert positions.shape == (2, 10) and np.array(numbers["maps"]["patched z, layer x head"]).shape == (2, 2)
  assert positions[0, 6] == pytest.approx(numbers["runs"]["clean"] - numbers["runs"]["corrupt"], abs=1e-4)
  assert numbers["columns"]["patched resid_pre, layer x position"][6] == " John/ Mary"
  nontrivial_png(tmp_path / "patch" / "patching.png")
  assert path["status"] == 0, path["stderr"][-3000:]
  found = json.loads((tmp_path / "path" / "path.json").read_text())
  assert found["receivers"] == [[1, 0, "k"], [1, 1, "k"], [1, 0, "q"]] and set(found["runs"]) == {
    "clean",
    "corrupt",
    "sender",
    "path",
  }
  assert "only along L1.k, L1.H0.q:" in path["stdout"]
  assert [b["status"] for b in bad] == [1, 1, 1]
  assert "error: the clean text is 10 tokens and the corrupt one 5: patching pairs their positions" in bad[0]["stderr"]
  assert "error: --target=' Marylebone' is 3 tokens for this tokenizer" in bad[1]["stderr"]
  assert "error: --attribute and --patch explain the logit of a --target token" in bad[2]["stderr"]
  scores = json.loads((tmp_path / "heads" / "heads.json").read_text())
  assert set(scores) == {"previous_token", "duplicate_token", "induction"} and np.shape(scores["induction"]) == (2, 2)


@pytest.mark.slow
def test_launch_probe_takes_one_verb_and_refuses_flags_without_theirs_before_loading(tmp_path):
  """Two verbs, --ablate without --heads, and a malformed --ablate are each one error line, given
  before any model is read (the workdir here does not exist) and before any table prints."""
  missing = tmp_path / "no-such-run"
  cases = [
    {"args": [f"--workdir={missing}", "--heads", "--patch"]},
    {"args": [f"--workdir={missing}", "--text=hi", "--ablate=L1.H0"]},
    {"args": [f"--workdir={missing}", "--heads", "--ablate=layer1"]},
    {"args": [f"--workdir={missing}", "--path", "--sender=L0.H1"]},
  ]
  stderrs = [r["stderr"] for r in run_cases("launch.probe", cases, tmp_path)]
  assert (
    "error: give one of --compare, --heads, --attribute, --patch, --path, --circuit, --probe, --sae, --graph at a time, "
    "not heads and patch" in stderrs[0]
  )
  assert "error: --ablate names heads to remove while --heads scores them: give --heads with it" in stderrs[1]
  assert "error: --ablate='layer1' is not a head of this model: write L<layer>.H<head>, e.g. L0.H1" in stderrs[2]
  assert "error: --path needs --sender (a head, e.g. L0.H1) and --receivers (e.g. L1.k)" in stderrs[3]
  assert all(str(missing) not in s for s in stderrs)  # refused before the workdir was looked at


def test_the_probe_verbs_are_library_calls_with_arguments(tokenizer, tmp_path):
  """transformer.interp.studies: what launch.probe's verbs compute, called as a notebook would (no flags):
  the head scores with an ablation, a logit's shares (summing to it), patching, a word compared."""
  cfg = GPTConfig().replace(vocab_size=tokenizer.vocab_size, max_len=64, num_layers=2, num_heads=2, d_model=32)
  model = GPT(cfg)
  params = compiled_init(model, np.zeros((1, 8), np.int32))
  report = studies.head_scores_and_ablations(model, params, ablate=[(1, 0)], ablation="mean")
  assert report.scores["induction"].shape == (2, 2)
  assert list(report.losses) == ["all heads", "without L1.H0 (mean ablation)"]
  assert report.losses["all heads"] != report.losses["without L1.H0 (mean ablation)"]
  shares = studies.attribute(model, params, tokenizer, "Harry stood at th", target="e", versus="a", out=tmp_path)
  assert sum(shares.contributions.values()) == pytest.approx(shares.logit, abs=1e-3)
  assert shares.metric == "logit 'e' - logit 'a'" and (tmp_path / "attribution.json").exists()
  patched = studies.patch(model, params, tokenizer, "Harry stood", "Harry stool", target="a")
  assert patched.maps["patched resid_pre, layer x position"].shape == (2, 11)
  rows = jnp.asarray(tokenizer.encode(TEXT * 8)[: 16 * 16]).reshape(16, 16)
  with pytest.raises(UserError, match="--probe_offset=16 reaches outside the 16 tokens"):
    studies.probe_layers(model, params, rows, offset=16)  # (--probe and --path run: the Hugging Face test)
  with pytest.raises(UserError, match=r"the receivers L0.H1.k, L1.H0.q read the stream before the sender L1.H0"):
    studies.path(model, params, tokenizer, "Harry", "Harry", "a", None, (1, 0), [(0, 1, "k"), (1, 0, "q"), (1, "mlp")])
  similarity = studies.compare(model, params, tokenizer, [TEXT, OTHER], "Harry")
  assert similarity.shape == (3, 2, 2) and similarity[0, 0, 0] == pytest.approx(1.0)
  with pytest.raises(UserError, match="the target='ee' is 2 tokens"):
    studies.attribute(model, params, tokenizer, "Harry", target="ee")


@pytest.mark.slow  # path patching, edge attribution, two probes and an alignment search: many programs
def test_the_circuit_study_reports_every_part_and_writes_its_json(tmp_path):
  """studies.induction_circuit on an untrained 2-layer attention-only GPT: the parts are there and
  written (what they find on a trained one: experiments/README.md, the induction circuit)."""
  cfg = GPTConfig().replace(vocab_size=64, max_len=64, num_layers=2, num_heads=2, d_model=32, attention_only=True)
  params = compiled_init(GPT(cfg), np.zeros((1, 8), np.int32))
  circuit = studies.induction_circuit(GPT(cfg), params, rank=4, out=tmp_path)
  assert circuit.previous_token_head[0] == 0 and circuit.induction_head[0] == 1
  assert set(circuit.loss_rise) == {"everywhere", "into keys", "into queries", "into values"}
  assert len(circuit.top_edges) == 6 and set(circuit.probes) == {"embeddings", "layer 0 output"}
  assert json.loads((tmp_path / "circuit.json").read_text())["alignment"]["rank"] == 4
  with pytest.raises(UserError, match="an induction circuit needs two layers"):
    studies.induction_circuit(GPT(cfg.replace(num_layers=1)), params)


def test_a_probe_runs_page_lists_what_its_folder_holds(tmp_path):
  """probe_page.write: every picture shown, a small JSON's numbers on the page, a large or broken one only
  linked, a name that is HTML escaped; an empty folder says it holds nothing (the browser check: test_pages.py)."""
  assert "wrote no pictures or numbers" in probe_page.write(tmp_path).read_text()
  (tmp_path / "a<b>.png").write_bytes(b"\x89PNG")
  (tmp_path / "small.json").write_text(json.dumps({"loss": 1.25}))
  (tmp_path / "large.json").write_text(json.dumps(list(range(probe_page.SHOWN_JSON_BYTES))))
  (tmp_path / "broken.json").write_text("{")
  page = probe_page.write(tmp_path, "launch.probe --text='<x>'").read_text()
  assert '<img src="a&lt;b&gt;.png"' in page and "launch.probe --text=&#x27;&lt;x&gt;&#x27;" in page
  assert "&quot;loss&quot;: 1.25" in page
  for name in ("large.json", "broken.json"):
    assert f'<p>numbers: <a href="{name}">{name}</a></p>' in page
  assert "index.html" not in page.split("<body>")[1]  # the page does not list itself
