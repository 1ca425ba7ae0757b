r"""Looks inside a trained model: attention maps, the residual stream, the logit lens, contextual
embeddings, and (translation) the cross-attention alignment, as PNG pictures plus JSON numbers.

  python -m launch.probe --workdir=workdirs/shakespeare-char --text="ROMEO: But soft, what light" --out=probes/romeo
  python -m launch.probe --hf=path/to/gpt2 --text="The Eiffel Tower is in" --out=probes/eiffel
  python -m launch.probe --workdir=workdirs/de-en --text="Ich habe keine Zeit." --out=probes/de-en
  python -m launch.probe --hf=path/to/opus-mt-de-en --text="Ich habe keine Zeit." --out=probes/opus
  python -m launch.probe --workdir=workdirs/shakespeare-char --compare --word=Harry \
      --text="Harry stood at the edge of the Forbidden Forest, his wand gripped tightly in his hand." \
      --text="Prince Harry delivered a heartfelt speech at a star-studded charity gala last night."

Writes into --out: attention.png (layers x heads, rows are queries), residual_norms.png,
logit_lens.png (the top next token read from every layer), inside.json; for a translation also
alignment.png (target x source) and encoder_attention.png. The translation is the model's greedy
one unless --target gives it. --compare prints how alike --word is across the texts at each layer
(cosine similarity of its last token's residual stream; 1 = the same vector) and writes
similarity.json. --heads (a GPT) prints every head's previous-token, duplicate-token and induction
scores on random tokens repeated twice and writes heads.json; with --ablate, the loss on those tokens
without the heads named. --attribute splits the --target token's logit (minus --versus's) after each
--text into the direct contributions of the embeddings, every head and every MLP (attribution.png).
--patch runs the --corrupt text with each layer x position of the residual stream, and each layer x
head, taken from the --clean one, and draws what each does to the --target's log-probability (or
logit difference) beside attribution patching's estimate (patching.png). --path is path patching: the
--sender head's output from --corrupt, seen only by the --receivers (heads' queries, keys or values in
later layers), beside patching the sender outright (path.json). --probe fits linear probes for the token
--probe_offset away at the embeddings and after every layer (probe.json); --circuit traces a 2-layer
attention-only model's induction circuit (circuit.json). --sae=SAE_WORKDIR (a config.task=sae run; or SAELens's
files, or a Gemma Scope params.npz with --point, on the --hf / --workdir model over --input_file's text)
writes its features' pages (features.html: each --latents', or by default readable ones', top contexts
on held-out text, activation histogram, density and the logits it promotes; with --text, the latents
firing on each token); --sae=W1,W2,... draws their explained variance against L0 (frontier.png). --graph
draws the attribution graph of a --text through --transcoders (a transcoder a layer: graph.json in
circuit-tracer's viewer's form, graph.html to open in a browser, graph.npz; transformer.interp.graph; or
circuit-tracer's own set with --hf / --workdir). --export writes the --sae workdir as SAELens's files, or the
--transcoders as circuit-tracer's set (--export_as). Every other verb ends with --out's index.html: one page of all
it holds (transformer.interp.probe_page). The same in Python: transformer.interp.studies and .features.

  python -m launch.probe --workdir=workdirs/shakespeare-char --heads --ablate=L1.H0 --ablation=mean
  python -m launch.probe --workdir=workdirs/shakespeare-char --attribute --text="ROMEO: O Juli" --target=e
  python -m launch.probe --workdir=workdirs/shakespeare-char --patch --target=e --versus=a \
      --clean="ROMEO: O Juliet! JULIET: O Romeo! ROMEO: O Juli" \
      --corrupt="ROMEO: O Julian! JULIAN: O Romeo! ROMEO: O Juli"
  python -m launch.probe --workdir=workdirs/shakespeare-char --path --sender=L0.H1 --receivers=L1.k --target=e \
      --clean="ROMEO: O Juliet! JULIET: O Romeo! ROMEO: O Juli" \
      --corrupt="ROMEO: O Julian! JULIAN: O Romeo! ROMEO: O Juli"
  python -m launch.probe --workdir=workdirs/shakespeare-char --probe --probe_offset=-1
  python -m launch.probe --workdir=workdirs/induction-2 --circuit
  python -m launch.probe --sae=workdirs/char-sae --latents=3,17 --text="ROMEO: O Juliet" --out=features/char
  python -m launch.probe --graph --transcoders=workdirs/char-tc-0,workdirs/char-tc-1,workdirs/char-tc-2,... \
      --text="ROMEO:\nO Juliet!\n\nJULI" --out=graphs/juliet
  python -m launch.probe --sae=path/to/saelens-sae --hf=path/to/gpt2 --input_file=my.txt --out=features/theirs
  python -m launch.probe --graph --transcoders=path/to/circuit-tracer-set --hf=path/to/model --text="..." --out=graphs/t
  python -m launch.probe --transcoders=workdirs/char-tc-0,...,workdirs/char-tc-3 --export=exported/char-tc
"""

import json
import shlex
import sys
from pathlib import Path

import numpy as np
from absl import flags

import launch
from transformer import cli, dictionaries, inference, opening
from transformer import workdir as workdir_files
from transformer.errors import UserError
from transformer.interp import features, graph_targets, graph_view, interventions, probe_page, probes, studies
from transformer.layers.points import Point
from transformer.models.gpt import GPT
from transformer.models.sae import SAE

_MODEL = launch.ModelFlags(
  "A training workdir (launch.train's --workdir).",
  hf_help=launch.HF_HELP + launch.HF_MARIAN,
)
_TEXT = flags.DEFINE_multi_string("text", [], "A text (a source sentence for a translation model); repeatable.")
_TARGET = flags.DEFINE_string(
  "target",
  None,
  "Translation: the target sentence to probe (default: the model's greedy translation). With --attribute, "
  "--patch or --graph: the next token whose logit is explained (one token, e.g. ' Juliet').",
)
_VERSUS = flags.DEFINE_string(
  "versus",
  None,
  "With --attribute, --patch or --graph: a second token; the logit difference target - versus is explained.",
)
_OUT = flags.DEFINE_string(
  "out",
  "probes",
  "Where the pictures and numbers go (one subdirectory per text when there are several); by default "
  "probes/ in the directory the program runs in.",
)
_COMPARE = flags.DEFINE_bool("compare", False, "Print the per-layer similarity of --word across the texts.")
_WORD = flags.DEFINE_string("word", None, "With --compare: the word to follow through the layers.")
_HEADS = flags.DEFINE_bool(
  "heads", False, "Score every head of a GPT as a previous-token, duplicate-token and induction head (no --text)."
)
_ABLATION = flags.DEFINE_enum(
  "ablation",
  "zero",
  ["zero", "mean", "resample"],
  "With --ablate: zero the heads' outputs, set them to their mean over other random tokens, or to their "
  "outputs on other random tokens (resample).",
)
_ATTRIBUTE = flags.DEFINE_bool(
  "attribute", False, "A GPT: the --target logit at the --text's last position, split into each component's share."
)
_PATCH = flags.DEFINE_bool(
  "patch", False, "A GPT: activation patching from --clean into --corrupt, by layer x position and layer x head."
)
_PATH = flags.DEFINE_bool(
  "path",
  False,
  "A GPT: path patching from --clean into --corrupt: the --sender head's corrupt output seen only by the "
  "--receivers (queries, keys or values of heads in later layers).",
)
_SENDER = flags.DEFINE_string("sender", None, "With --path: the sending head, e.g. L0.H1.")
_RECEIVERS = flags.DEFINE_list(
  "receivers", [], "With --path: receiving inputs, L<layer>.H<head>.<q|k|v> or L<layer>.<q|k|v> (every head), e.g. L1.k"
)
_CIRCUIT = flags.DEFINE_bool(
  "circuit",
  False,
  "A 2-layer attention-only GPT (experiments/induction.py): trace its induction circuit (path patching, edge "
  "attribution patching, probes, alignment search); circuit.json in --out.",
)
_PROBE = flags.DEFINE_bool(
  "probe",
  False,
  "A GPT: linear probes for the token --probe_offset positions away, read off --probe_point at the embeddings and "
  "after each layer, on the run's validation tokens (with --hf: random tokens repeated twice); probe.json in --out.",
)
_PROBE_POINT = flags.DEFINE_string("probe_point", "resid_post", "With --probe: the named point the probes read.")
_PROBE_OFFSET = flags.DEFINE_integer(
  "probe_offset", -1, "With --probe: which token (-1: the previous, 0: the current)."
)
_SAE = flags.DEFINE_list(
  "sae",
  [],
  "A sparse autoencoder's workdir (config.task=sae), SAELens's files or a Gemma Scope params.npz (with --hf or "
  "--workdir): its features' pages; several workdirs: their L0 vs explained variance.",
)
_POINT = flags.DEFINE_string(
  "point",
  None,
  "With --sae of files that name no point (a Gemma Scope params.npz): the point it reads, in our words or "
  "TransformerLens's (blocks.12.hook_resid_post, L12.resid_post).",
)
_INPUT_FILE = flags.DEFINE_string(
  "input_file",
  None,
  "With --sae of a dictionary's files: the text its pages show contexts in, read by the model's tokenizer (with "
  "--workdir, the run's own text by default).",
)
_EXPORT = flags.DEFINE_string(
  "export",
  None,
  "Write the --sae workdir (an SAE or a transcoder) or the --transcoders' as a peer reads them, into this directory.",
)
_EXPORT_AS = flags.DEFINE_enum(
  "export_as",
  None,
  list(dictionaries.EXPORTS),
  "With --export: saelens (an SAE or a transcoder: cfg.json + sae_weights.safetensors) or circuit-tracer "
  "(transcoders: config.yaml + a file a layer); default: saelens for --sae, circuit-tracer for --transcoders.",
)
_LATENTS = flags.DEFINE_list(
  "latents", [], "With --sae: the latents to show (default: 8 a reader learns from, features.readable_latents)."
)
_GRAPH = flags.DEFINE_bool(
  "graph",
  False,
  "The attribution graph of --text through --transcoders (graph.json for circuit-tracer's viewer, graph.html).",
)
_TRANSCODERS = flags.DEFINE_list(
  "transcoders",
  [],
  "With --graph: one transcoder workdir a layer (config.task=sae with --config.target_point; their model is the "
  "one they learned from), or a directory of circuit-tracer's transcoder set (config.yaml; with --workdir or --hf).",
)
_MAX_FEATURE_NODES = flags.DEFINE_integer(
  "max_feature_nodes",
  None,
  "With --graph: at most this many features as nodes, those of the most influence on the logits "
  "(circuit-tracer's max_feature_nodes; default: every active feature).",
)
_CLEAN = flags.DEFINE_string("clean", None, "With --patch or --path: the clean text.")
_CORRUPT = flags.DEFINE_string(
  "corrupt", None, "With --patch or --path: the corrupted text, as many tokens as --clean."
)
_ABLATE = flags.DEFINE_list(
  "ablate", [], "With --heads: heads to zero (e.g. L1.H0,L1.H3), for the loss on the repeated tokens without them."
)


def load():
  """(model, params, tokenizer, description, the run's validation tokens or None) from --workdir or --hf."""
  trained = _MODEL.load()
  validation = None
  if _MODEL.workdir.value and trained.run.task == "lm":
    validation = inference.split_task(trained, _MODEL.workdir.value).data.tokens("validation")
  return trained.model, trained.params, trained.tokenizer, trained.source, validation


def compare(model, params, tokenizer, texts: list[str]) -> None:
  if _WORD.value is None or len(texts) < 2:
    raise UserError("--compare needs --word and at least two --text")
  similarity_LxNxN = studies.compare(model, params, tokenizer, texts, _WORD.value, out=Path(_OUT.value))
  print(f"cosine similarity of {_WORD.value!r} (its last token) to text 1's, by layer")
  print("layer     " + "".join(f"  text {j + 1:<3}" for j in range(1, len(texts))))
  for l, sims in enumerate(similarity_LxNxN):
    name = "embed" if l == 0 else f"block {l - 1}"
    print(f"{name:<10}" + "".join(f"  {sims[0, j]:8.4f}" for j in range(1, len(texts))))
  print(Path(_OUT.value) / "similarity.json")


def heads(model, params, validation=None) -> None:
  """studies.head_scores_and_ablations as a table; heads.json in --out."""
  ablate = [_head(name) for name in _ABLATE.value]
  report = studies.head_scores_and_ablations(
    model, params, ablate=ablate, ablation=_ABLATION.value, validation=validation, out=Path(_OUT.value)
  )
  print(f"attention on {report.length} random tokens repeated twice (1: all of a head's attention there)")
  print(f"{'head':<8}" + "".join(f"{kind:>17}" for kind in report.scores))
  for l, h in np.ndindex(report.scores["induction"].shape):
    print(f"{f'L{l}.H{h}':<8}" + "".join(f"{s[l, h]:17.3f}" for s in report.scores.values()))
  for what, (first, second, held_out) in report.losses.items():
    line = f"loss ({what}): first copy {first:.3f} nats a token, second copy {second:.3f}"
    print(line + ("" if held_out is None else f", validation {held_out:.3f}"))
  print(Path(_OUT.value) / "heads.json")


def _answer(tokenizer) -> tuple[str, str | None]:
  """--target and --versus, each checked to be one token before anything runs."""
  if _TARGET.value is None:
    raise UserError("--attribute and --patch explain the logit of a --target token (and optionally --versus)")
  for flag, value in (("--target", _TARGET.value), ("--versus", _VERSUS.value)):
    if value is not None:
      studies.one_token(tokenizer, value, flag)
  return _TARGET.value, _VERSUS.value


def attribute(model, params, tokenizer, text: str, out: Path) -> None:
  """studies.attribute as a table of the largest shares; attribution.png and .json in `out`."""
  _gpt(model, "attribute")
  result = studies.attribute(model, params, tokenizer, text, *_answer(tokenizer), out=out)
  capped = " (the model's, soft-capped; the sum is before the cap)" if model.config.logits_softcap else ""
  total = sum(result.contributions.values())
  print(f"{result.metric} after {text!r}: {result.logit:.3f}{capped}; the components' sum {total:.3f}")
  for name, value in sorted(result.contributions.items(), key=lambda kv: -abs(kv[1]))[:12]:
    print(f"  {name:<18}{value:9.3f}")
  print(out / "attribution.png")


def patch(model, params, tokenizer) -> None:
  """studies.patch, the largest effect of each map; patching.png and .json in --out."""
  _gpt(model, "patch")
  if not (_CLEAN.value and _CORRUPT.value):
    raise UserError("--patch needs a --clean and a --corrupt text (and a --target token)")
  out = Path(_OUT.value)
  result = studies.patch(model, params, tokenizer, _CLEAN.value, _CORRUPT.value, *_answer(tokenizer), out=out)
  print(f"{result.metric}: clean {result.runs['clean']:.3f}, corrupt {result.runs['corrupt']:.3f}")
  for name, map_LxC in result.maps.items():
    l, c = np.unravel_index(np.abs(map_LxC).argmax(), map_LxC.shape)
    print(f"  {name}: largest effect {map_LxC[l, c]:+.3f} at layer {l}, {result.columns[name][c]!r}")
  print(out / "patching.png")


def path_patch(model, params, tokenizer) -> None:
  """studies.path: the effect of the sender along the receivers' paths, beside patching it outright."""
  _gpt(model, "path")
  cfg = model.config
  sender = _head(_SENDER.value, cfg.num_layers, cfg.block.num_heads, "sender")
  receivers = _receivers(_RECEIVERS.value, cfg.num_layers, cfg.block.num_heads, cfg.block.kv_heads)
  if _CLEAN.value is None or _CORRUPT.value is None or _TARGET.value is None:
    raise UserError("--path needs --clean, --corrupt and --target (optionally --versus)")
  found = studies.path(
    model,
    params,
    tokenizer,
    _CLEAN.value,
    _CORRUPT.value,
    _TARGET.value,
    _VERSUS.value,
    sender,
    receivers,
    out=Path(_OUT.value),
  )
  print(f"{found.metric}: clean {found.runs['clean']:.4f}, corrupt {found.runs['corrupt']:.4f}")
  print(f"L{sender[0]}.H{sender[1]} patched outright:      {found.runs['sender']:.4f}")
  print(f"only along {', '.join(_RECEIVERS.value)}: {found.runs['path']:.4f}")
  print(Path(_OUT.value) / "path.json")


def circuit(model, params, validation) -> None:
  """studies.induction_circuit, printed; circuit.json in --out."""
  _gpt(model, "circuit")
  found = studies.induction_circuit(model, params, validation=validation, out=Path(_OUT.value))
  (pl, ph), (il, ih) = found.previous_token_head, found.induction_head
  print(f"previous-token head L{pl}.H{ph}, induction head L{il}.H{ih}")
  print("second-copy loss rise (nats), the previous-token head mean-ablated:")
  for where, rise in found.loss_rise.items():
    print(f"  {where:<14} {rise:8.4f}")
  print("strongest edges (edge attribution patching): " + ", ".join(f"{e} ({v:+.3f})" for e, v in found.top_edges[:3]))
  for where, accuracy in found.probes.items():
    print(
      f"previous token from the {where}: {accuracy['test_accuracy']:.3f} held out "
      f"(control {accuracy['control_accuracy']:.3f})"
    )
  a = found.alignment
  print(
    f"copied token in layer 1's values, a subspace of rank {a['rank']}: {a['accuracy']:.3f} interchange accuracy "
    f"(random subspace {a['random_accuracy']:.3f}, the whole point {a['full_accuracy']:.3f})"
  )
  print(Path(_OUT.value) / "circuit.json")


def probe(model, params, validation) -> None:
  """studies.probe_layers on 64 rows of the run's validation tokens (or of random tokens repeated)."""
  _gpt(model, "probe")
  cfg = model.config
  T = min(128, cfg.max_len)
  if validation is not None and len(validation) >= 64 * T:
    tokens = np.asarray(validation[: 64 * T]).reshape(64, T)
  else:
    tokens = interventions.repeated_random_tokens(cfg.vocab_size, T // 2, batch=64)
  found = studies.probe_layers(
    model, params, tokens, point=_PROBE_POINT.value, offset=_PROBE_OFFSET.value, out=Path(_OUT.value)
  )
  print(f"the token {_PROBE_OFFSET.value:+d} from each position, read off {_PROBE_POINT.value} by a linear probe")
  print(f"{'where':<12} {'held out':>9} {'control':>8}")
  for where, accuracy in found.items():
    print(f"{where:<12} {accuracy['test_accuracy']:9.3f} {accuracy['control_accuracy']:8.3f}")
  print(Path(_OUT.value) / "probe.json")


def sae_features(texts: list[str]) -> None:
  """features.feature_pages of the --sae workdir's SAE, written into --out; of several SAEs, their
  frontier (dictionaries.frontier: frontier.png and frontier.json)."""
  if len(_SAE.value) > 1:
    out = Path(_OUT.value)
    rows = dictionaries.frontier(_SAE.value, out / "frontier.png")
    (out / "frontier.json").write_text(json.dumps(rows, indent=1))
    print(f"{'activation':<10} {'L0':>6} {'expl. var.':>10} {'ce_loss_score':>13}  workdir")
    for r in rows:
      score = f"{r['ce_loss_score']:13.3f}" if "ce_loss_score" in r else f"{'':13}"
      print(f"{r['activation']:<10} {r['l0']:6.1f} {r['explained_variance']:10.3f} {score}  {r['workdir']}")
    print(out / "frontier.png")
    return
  try:
    latents = [int(i) for i in _LATENTS.value] or None
  except ValueError:
    raise UserError(f"--latents={','.join(_LATENTS.value)}: give latent numbers, e.g. 3,17") from None
  sae, params, source, tokenizer, where = _dictionary(_SAE.value[0])
  print(f"# {where}: {sae.config.latents} latents on {source.point}", file=sys.stderr)
  text = " ".join(texts) or None
  report = features.feature_pages(sae, params, source, tokenizer, latents=latents, text=text, out=Path(_OUT.value))
  for latent in report.latents:
    top = features.marked(latent.top_contexts[0], latent.centres[0]) if latent.top_contexts else ""
    print(f"latent {latent.index}: density {100 * latent.density:.2f}%, top context {top!r}")
  print(report.path)


def _dictionary(path: str):
  """(the SAE, its params, its activations, the tokenizer, where it came from) of --sae: a training workdir (with
  the model it learned from), or a dictionary's files (SAELens's, Gemma Scope's) on the --workdir / --hf model, at
  the point the files name (or --point)."""
  if (Path(path) / workdir_files.CONFIG).is_file():
    if _MODEL.workdir.value or _MODEL.hf.value:
      raise UserError(f"{path} is an SAE workdir, which names its model: leave out --workdir and --hf")
    trained, source = dictionaries.load_sae(path)
    return trained.model, trained.params, source, trained.tokenizer, trained.source or path
  opened = opening.open_path(path)
  if not isinstance(opened, opening.Dictionary) or not isinstance(opened.module, SAE):
    raise UserError(f"--sae={path} is not an SAE (a training workdir, SAELens's files or a Gemma Scope params.npz)")
  point = _POINT.value or (str(Point(opened.point, opened.layer)) if opened.point else None)
  if point is None:
    raise UserError(f"{opened.source} names no point it reads: give --point (e.g. blocks.12.hook_resid_post)")
  if not (_MODEL.workdir.value or _MODEL.hf.value):
    raise UserError(f"{opened.source} names no model of ours: give --workdir or --hf, the model it reads")
  trained = _MODEL.load()
  text = dictionaries.text_for(trained, _MODEL.workdir.value, _INPUT_FILE.value)
  source = dictionaries.on_model(opened.module, opened.params, point, None, trained, text)
  return opened.module, opened.params, source, trained.tokenizer, f"{opened.source} on {trained.source}"


def export_dictionaries(texts: list[str]) -> None:
  """dictionaries.export of --sae or --transcoders into --export."""
  paths = _SAE.value or _TRANSCODERS.value
  kind = _EXPORT_AS.value or ("saelens" if _SAE.value else "circuit-tracer")
  print(dictionaries.export(paths, Path(_EXPORT.value), kind))


def attribution_graph(texts: list[str]) -> None:
  """graph_view.study of the --text through the --transcoders, written into --out."""
  if len(texts) != 1:
    raise UserError(f"--graph draws the graph of one --text; got {len(texts)}")
  trained, transcoders = dictionaries.load_transcoders(_TRANSCODERS.value)
  if trained is None:  # circuit-tracer's set: the model is the flags'
    if not (_MODEL.workdir.value or _MODEL.hf.value):
      raise UserError("circuit-tracer's transcoders name no model of ours: give --workdir or --hf with them")
    trained = _MODEL.load()
  elif _MODEL.workdir.value or _MODEL.hf.value:
    raise UserError("the transcoders' workdirs name their model: leave out --workdir and --hf")
  _gpt(trained.model, "graph")
  print(f"# {trained.source}", file=sys.stderr)
  names = dictionaries.names(_TRANSCODERS.value)
  targets = None  # the top logits; --target: that token's; with --versus: the logit difference
  if _TARGET.value is not None:
    ids = [
      studies.one_token(trained.tokenizer, v, f)
      for f, v in (("--target", _TARGET.value), ("--versus", _VERSUS.value))
      if v
    ]
    targets = ids if len(ids) == 1 else [graph_targets.logit_difference(trained.model.config, trained.params, *ids)]
  record = graph_view.study(
    *(trained.model, trained.params, trained.tokenizer, texts[0], transcoders, Path(_OUT.value)),
    *(_held_out(trained), names),
    max_feature_nodes=_MAX_FEATURE_NODES.value,
    targets=targets,
  )
  capped = f" ({record['feature_nodes']} of them nodes)" if record["feature_nodes"] < record["active_features"] else ""
  kept = f"kept {record['kept_nodes']} nodes, {record['kept_edges']} edges"
  print(f"{record['active_features']} active features{capped}; {kept}")
  print(f"replacement score {record['replacement']:.3f}, completeness {record['completeness']:.3f}")
  if "replacement_losses" in record:
    r = record["replacement_losses"]
    print(
      f"held-out loss: {r['clean']:.4f} clean, {r['replaced']:.4f} with every MLP replaced, {r['zero_mlp']:.4f} with "
      f"every MLP zeroed (score {r['score']:.3f})"
    )
  print("top logits: " + ", ".join(f"{t!r} ({p:.2f})" for t, p in record["logits"]))
  print(Path(_OUT.value) / "graph.html")


def _held_out(trained, windows: int = 64):
  """Windows of the model's validation text when the transcoders' model is a run of ours (their features'
  top contexts on the graph's page); None otherwise."""
  saved = workdir_files.saved_config_dict(Path(_TRANSCODERS.value[0])) or {}
  run_dir = _MODEL.workdir.value or saved.get("run")
  if not run_dir or trained.run.task != "lm":
    return None
  tokens = np.asarray(inference.split_task(trained, run_dir).data.tokens("validation"))
  width = min(64, trained.model.config.max_len)
  return tokens[: windows * width].reshape(-1, width)


def _gpt(model, verb: str) -> None:
  if not isinstance(model, GPT):
    raise UserError(f"--{verb} works on a GPT's heads and residual stream; this is a {type(model).__name__}")


# The verbs: what a run of the program does (without one, it looks inside each --text).
_VERBS = {
  "compare": _COMPARE,
  "heads": _HEADS,
  "attribute": _ATTRIBUTE,
  "patch": _PATCH,
  "path": _PATH,
  "circuit": _CIRCUIT,
  "probe": _PROBE,
  "sae": _SAE,
  "graph": _GRAPH,
}


def _head(
  name: str, num_layers: int | None = None, num_heads: int | None = None, flag: str = "ablate"
) -> tuple[int, int]:
  """ "L1.H0" -> (1, 0), refused naming the model's range (when given) when it is not a head of this model."""
  try:
    layer, head = (int(part[1:]) for part in name.upper().split("."))
    if num_layers is not None and not (0 <= layer < num_layers and 0 <= head < num_heads):
      raise ValueError
  except ValueError:
    limits = "" if num_layers is None else f" with layer < {num_layers} and head < {num_heads}"
    raise UserError(
      f"--{flag}={name!r} is not a head of this model: write L<layer>.H<head>{limits}, e.g. L0.H1"
    ) from None
  return layer, head


def _receivers(names: list[str], num_layers: int, num_heads: int, kv_heads: int) -> list[tuple[int, int, str]]:
  """ "L1.H0.k" -> [(1, 0, "k")], "L1.q" -> every head of layer 1's queries; refused when malformed.
  Keys and values count the kv heads (`kv_heads`: fewer with grouped-query attention)."""
  receivers = []
  for name in names:
    *where, role = name.split(".")
    if role not in ("q", "k", "v") or len(where) not in (1, 2):
      raise UserError(f"--receivers={name!r}: write L<layer>.H<head>.<q|k|v> or L<layer>.<q|k|v>, e.g. L1.H0.k")
    heads = num_heads if role == "q" else kv_heads
    if len(where) == 2:
      receivers.append((*_head(".".join(where), num_layers, heads, "receivers"), role))
      continue
    layer, _ = _head(where[0] + ".H0", num_layers, heads, "receivers")
    receivers.extend((layer, h, role) for h in range(heads))
  return receivers


def _check_verbs() -> str:
  """The one verb of this run ("look": none given), after refusing, before a model loads, two verbs at once
  and a verb's own flags without it."""
  verbs = [name for name, flag in _VERBS.items() if flag.value]
  if _EXPORT.value:  # --sae or --transcoders are what it writes
    verbs = [v for v in verbs if v != "sae"] + ["export"]
    if bool(_SAE.value) == bool(_TRANSCODERS.value):
      raise UserError("--export writes --sae (one dictionary's workdir) or --transcoders: give one of them")
  if len(verbs) > 1:
    raise UserError(f"give one of {', '.join('--' + v for v in _VERBS)} at a time, not {' and '.join(verbs)}")
  if _ABLATE.value and not _HEADS.value:
    raise UserError("--ablate names heads to remove while --heads scores them: give --heads with it")
  if _GRAPH.value != bool(_TRANSCODERS.value) and not _EXPORT.value:
    raise UserError("--graph draws a graph through --transcoders: give both (a transcoder workdir a layer)")
  if _PATH.value and (_SENDER.value is None or not _RECEIVERS.value):
    raise UserError("--path needs --sender (a head, e.g. L0.H1) and --receivers (e.g. L1.k)")
  for name in _ABLATE.value:
    _head(name)  # the form now; the model's range once it is loaded
  return verbs[0] if verbs else "look"


def _opened():
  """The model of --workdir / --hf (named on stderr): (model, params, tokenizer, the run's validation tokens)."""
  model, params, tokenizer, source, validation = load()
  print(f"# {source}", file=sys.stderr)
  return model, params, tokenizer, validation


def _with_validation():
  model, params, _, validation = _opened()
  return model, params, validation


def _run_heads(texts):
  model, params, _, validation = _opened()
  _gpt(model, "heads")
  for name in _ABLATE.value:  # before any table prints: a head this model does not have
    _head(name, model.config.num_layers, model.config.block.num_heads)
  heads(model, params, validation)


def _run_attribute(texts):
  model, params, tokenizer, _ = _opened()
  for i, text in enumerate(texts):
    attribute(model, params, tokenizer, text, _out(i, len(texts)))


def _run_look(texts):
  """The default verb: each --text's pictures (attention, residual norms, logit lens) and the lens' last row."""
  model, params, tokenizer, _ = _opened()
  for i, text in enumerate(texts):
    inside = probes.look_inside(model, params, tokenizer, text, target=_TARGET.value)
    if inside.translation is not None:
      print(f"translation (greedy): {inside.translation}")
    for path in probes.write_pictures(inside, tokenizer, _out(i, len(texts))):
      print(path)
    last = [row[-1][0] for row in inside.lens_top(1, tokenizer)]
    print("logit lens at the last position, by layer: " + ", ".join(f"{t!r} ({p:.2f})" for t, p in last))


def _out(i: int, count: int) -> Path:
  return Path(_OUT.value) / str(i + 1) if count > 1 else Path(_OUT.value)


# One program, a verb a flag (not subcommands): the verbs share what they read (--workdir or --hf, --text,
# --out, --target), absl's flags are one namespace, and `_check_verbs` refuses a verb's own flags without it.
# Each verb's run takes the texts and opens what it needs; "look" runs where no verb is given.
RUNS = {
  "compare": lambda texts: compare(*_opened()[:3], texts),
  "heads": _run_heads,
  "attribute": _run_attribute,
  "patch": lambda texts: patch(*_opened()[:3]),
  "path": lambda texts: path_patch(*_opened()[:3]),
  "circuit": lambda texts: circuit(*_with_validation()),
  "probe": lambda texts: probe(*_with_validation()),
  "sae": sae_features,
  "graph": attribution_graph,
  "export": export_dictionaries,
  "look": _run_look,
}
_NEED_TEXT = ("compare", "attribute", "look")


def main(argv):
  del argv
  texts = list(_TEXT.value)
  verb = _check_verbs()
  if verb in _NEED_TEXT and not texts:
    raise UserError(
      "give a --text to look inside (or --heads, --circuit, --probe, or --patch or --path with --clean and --corrupt)"
    )
  RUNS[verb](texts)
  if verb != "export" and Path(_OUT.value).is_dir():  # what the run wrote, on one page
    print(probe_page.write(Path(_OUT.value), shlex.join(["python", "-m", "launch.probe", *sys.argv[1:]])))


if __name__ == "__main__":
  cli.run(main)
