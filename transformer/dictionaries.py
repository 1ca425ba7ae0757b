"""Opening sparse dictionaries (SAEs, per-layer and cross-layer transcoders) from where they are: an SAE
task's training workdir (restored with the model it learned from, whose text is read again) or a
published format's files (circuit-tracer's transcoder sets: transformer.models.tracer_formats).

The instrument (transformer.interp) takes what these return as plain values; opening a workdir
restores a run, which is why this stands beside transformer.inference and not inside the instrument.

    >>> trained, source = load_sae("workdirs/sae-char")                 # an SAE and its activations
    >>> model, transcoders = load_transcoders(["workdirs/clt-char"])    # a replacement model's pieces
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from transformer import data, inference, metrics, tasks, tokenizers
from transformer.errors import UserError
from transformer.interp import probes
from transformer.interp.activations import ModelActivations, middle_layer
from transformer.interp.replacement import CrossLayerTranscoders, PerLayerTranscoders, StreamedTranscoders, Transcoders
from transformer.layers.points import Point
from transformer.models import sae_formats, tracer_formats
from transformer.models.clt import CrossLayerTranscoder
from transformer.models.sae import SAE
from transformer.tasks.sae import source_model


def load_sae(workdir: str | Path) -> tuple[inference.Trained, ModelActivations]:
  """A trained SAE (config.task=sae: its latest checkpoint) and the activations it learned, whose
  model is restored and whose text is read again (its validation windows: held-out text)."""
  trained = inference.restore(workdir, task="sae")
  source = tasks.load_data(trained.run, inference.load).source
  if not isinstance(source, ModelActivations):
    raise UserError(f"{workdir} learned rows without text (an array or synthetic ones): pages show a model's text")
  return trained, source


def names(paths: list[str]) -> tuple[str, tuple[str, ...]]:
  """(the transcoders' name, their layers' sources) of `load_transcoders`' paths: what circuit-tracer's viewer
  reads as a graph's `scan` and `transcoder_list`. A circuit-tracer set's are its config.yaml's scan and its
  files; a cross-layer transcoder's workdir is its own name; a workdir a layer, named as circuit-tracer names a
  list of them (custom-<digest>)."""
  if len(paths) == 1 and tracer_formats.kind(paths[0]):
    return tracer_formats.names(paths[0])
  if len(paths) == 1:
    return Path(paths[0]).name, (str(paths[0]),)
  digest = hashlib.sha1("-".join(map(str, paths)).encode()).hexdigest()[:12]
  return f"custom-{digest}", tuple(map(str, paths))


def load_transcoders(paths: list[str]) -> tuple[Any, Transcoders]:
  """(the model they read, as `inference.load` gives it, or None; the transcoders) of `paths`: one SAE task
  workdir a layer (config.task=sae with --config.target_point: their model is the one they learned from), one
  cross-layer transcoder's workdir (--config.cross_layer), or one directory of circuit-tracer's transcoder
  set (config.yaml; then the model is the caller's, None)."""
  kind = tracer_formats.kind(paths[0]) if len(paths) == 1 else ""
  if kind == "cross_layer_transcoder":
    config, params, point_in, point_out = tracer_formats.import_circuit_tracer_clt(paths[0])
    return None, CrossLayerTranscoders(CrossLayerTranscoder(config), jax.device_put(params), point_in, point_out)
  if kind:  # read a piece at a time: a published set is larger than most machines' memory
    return None, StreamedTranscoders.of(*tracer_formats.open_circuit_tracer(paths[0]))
  trained = [inference.restore(path, task="sae") for path in paths]
  if len(trained) == 1 and isinstance(trained[0].model, CrossLayerTranscoder):
    c = trained[0].run.task_config
    model = _learned_from(trained[0])
    return model, CrossLayerTranscoders(trained[0].model, nn.unbox(trained[0].params), c.point, c.target_point)
  configs = [t.run.task_config for t in trained]
  sources = {(c.run, c.hf) for c in configs}
  if len(sources) != 1:
    raise UserError(
      f"these transcoders read different models ({', '.join(map(str, sorted(sources)))}): give one model's"
    )
  points = {(c.point, c.target_point) for c in configs}
  if len(points) != 1 or not configs[0].target_point:
    raise UserError(
      f"{', '.join(paths)}: a transcoder a layer, all from one point to another (--config.target_point); "
      f"got {sorted(points)}"
    )
  c = configs[0]
  model = _learned_from(trained[0])
  layers = [middle_layer(model.model, t.run.task_config.layer) for t in trained]
  if sorted(layers) != list(range(model.model.config.num_layers)):
    raise UserError(
      f"a replacement model needs one transcoder at each of the {model.model.config.num_layers} layers; these are at "
      f"layers {sorted(layers)}"
    )
  order = np.argsort(layers)
  saes = tuple(trained[i].model for i in order)
  return model, PerLayerTranscoders(saes, tuple(nn.unbox(trained[i].params) for i in order), c.point, c.target_point)


def on_model(sae: SAE, sae_params, point: str, layer: int | None, trained: inference.Trained, text) -> ModelActivations:
  """A dictionary opened from files (SAELens's, Gemma Scope's: opening.open_path) on a model of ours: its point's
  activations on `text` (prepared, `text_for`), what its feature pages read; one error where the widths differ."""
  point = Point.parse(point)
  layer = point.layer if point.layer is not None else layer
  if layer is None and point.name not in ("embed", "pos_embed"):
    raise UserError(f"the dictionary reads {point.name!r} of no block: name its block ({Point(point.name, 0)}, ...)")
  source = ModelActivations(
    trained.model,
    trained.params,
    text,
    point=point.name,
    layer=layer or 0,
    seq_len=min(128, trained.model.config.max_len),
    buffer_sequences=32,
    batch_sequences=8,
    eval_sequences=32,
    seed=0,
  )
  if source.d_in != sae.config.d_in:
    raise UserError(
      f"the dictionary reads {sae.config.d_in}-wide rows; {Point(point.name, layer)} of {trained.source} is "
      f"{source.d_in} wide: it is a dictionary of another model (or another point)"
    )
  return source


def text_for(trained: inference.Trained, workdir: str | None, input_file: str | None):
  """The text a dictionary's pages show their contexts in: `input_file` read by the model's tokenizer, else the
  run's own text (a workdir's)."""
  if input_file:
    size = Path(input_file).stat().st_size if Path(input_file).is_file() else 0
    # pieces small enough that a short file still has held-out ones (a tenth of them)
    pieces = max(256, min(trained.run.data.piece_chars, size // 20))
    config = dataclasses.replace(trained.run.data, input_files=(str(input_file),), dataset="", piece_chars=pieces)
  elif workdir and trained.run.task == "lm":
    config = trained.run.data
  else:
    raise UserError("the dictionary's pages show held-out text: give --input_file (a text file the model reads)")
  text = data.prepared_for(config, data.source_of(config, "text"))
  if not tokenizers.identical(text.tokenizer, trained.tokenizer):
    raise UserError(f"{text.directory} is tokenized by {text.tokenizer.name}, not the model's tokenizer")
  return text


EXPORTS = ("saelens", "circuit-tracer")


def export(paths: list[str], out: str | Path, kind: str) -> Path:
  """Trained dictionaries' workdirs written as a peer reads them: an SAE's or a transcoder's as SAELens's files
  (its hook_name TransformerLens's name of the point), transcoders (one a layer, or a cross-layer one) as
  circuit-tracer's set; checked whole before anything is written."""
  if kind not in EXPORTS:
    raise UserError(f"--export_as={kind!r}: choose {' or '.join(EXPORTS)}")
  out = Path(out)
  if kind == "saelens":
    if len(paths) != 1:
      raise UserError(f"SAELens's files hold one dictionary; give one workdir, not {len(paths)}")
    trained = inference.restore(paths[0], task="sae")
    c = trained.run.task_config
    if isinstance(trained.model, CrossLayerTranscoder):
      raise UserError(
        f"{paths[0]} is a cross-layer transcoder, which SAELens's files cannot hold: export it to circuit-tracer"
      )
    layer = middle_layer(source_model(c)[0], c.layer)  # (the model's shapes alone)
    hook = Point(c.point, layer).tl_name()
    return sae_formats.export_saelens(trained.model.config, trained.params, out, hook_name=hook)
  transcoders = load_transcoders(paths)[1].in_memory()
  scan = names(paths)[0]
  if isinstance(transcoders, CrossLayerTranscoders):
    args = (transcoders.clt.config, transcoders.params, out, transcoders.point_in, transcoders.point_out)
    return tracer_formats.export_circuit_tracer_clt(*args, scan=scan)
  layers = [(sae.config, p) for sae, p in zip(transcoders.saes, transcoders.params)]
  return tracer_formats.export_circuit_tracer(layers, out, transcoders.point_in, transcoders.point_out, scan=scan)


def _learned_from(trained: inference.Trained) -> inference.Trained:
  """The model an SAE task's run learned its activations from: a training run's (--config.run) or a
  Hugging Face directory's (--config.hf, read with the run's tokenizer)."""
  c = trained.run.task_config
  return inference.load(workdir=c.run) if c.run else inference.load(hf=c.hf, tokenizer=trained.run.data.tokenizer)


def frontier(workdirs: list[str | Path], png: Path | None = None) -> list[dict]:
  """Each SAE run's last evaluation (activation, L0, explained variance, ce_loss_score, ...) and, with
  `png`, the sparsity-fidelity frontier papers draw: explained variance against L0, one line per
  activation (TopK, BatchTopK, JumpReLU, ReLU)."""
  rows = []
  for workdir in map(Path, workdirs):
    run = inference.saved_run(workdir)
    evaluations = [r for r in metrics.read_jsonl(workdir / "metrics.jsonl") if "explained_variance" in r]
    if run is None or not evaluations:
      raise UserError(f"{workdir} holds no evaluated SAE run (config.json and metrics.jsonl with its scores)")
    rows.append({"workdir": str(workdir), "activation": run.model.activation, **evaluations[-1]})
  if png is not None:
    plt = probes.pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for activation in sorted({r["activation"] for r in rows}):
      points = sorted((r["l0"], r["explained_variance"]) for r in rows if r["activation"] == activation)
      ax.plot(*zip(*points), marker="o", label=activation)
    ax.set_xlabel("L0 (latents firing a token)")
    ax.set_ylabel("explained variance")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
  return rows
