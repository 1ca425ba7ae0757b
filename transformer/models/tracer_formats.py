"""circuit-tracer's transcoder files <-> our per-layer and cross-layer transcoders, both ways.

A directory with a config.yaml (`model_kind`: transcoder_set or cross_layer_transcoder; `feature_input_hook`
and `feature_output_hook` in TransformerLens's names under blocks.<l>.; `scan`), in any of circuit-tracer 0.5's
layouts:

  cache       no `transcoders` key; layer_<l>.safetensors beside config.yaml (what its
              `save_transcoders_to_cache` writes and `load_transcoders_from_cache` reads: what we write)
  published   `transcoders`: one entry a layer, `hf://<owner>/<repo>/<path>` (or a local path); the files as
              downloaded beside config.yaml, at <path> (a published repository's own layout)
  first       `transcoders`: entries with `id`, `layer` and `filepath` (circuit-tracer's first releases)

A layer's file: circuit-tracer's safetensors (`W_enc` Z x D, `W_dec` Z x D, `b_enc`, `b_dec`, a skip
transcoder's `W_skip` D x D, a JumpReLU's `activation_function.threshold`), or Gemma Scope's params.npz (`W_enc`
D x Z, `threshold`: what its "gemma-scope" loader reads). A cross-layer transcoder's files, in every layout:
W_enc_<l>.safetensors (W_enc_<l> Z x D, b_enc_<l>, b_dec_<l>, threshold_<l>) and W_dec_<l>.safetensors
(W_dec_<l> Z x (L - l) x D) beside config.yaml. Neither subtracts b_dec from the input it encodes.

    >>> export_circuit_tracer([(config, params), ...], "set/", point_in="mlp_input")   # one transcoder a layer
    >>> layers, point_in, point_out = import_circuit_tracer("set/")   # read whole, float32
    >>> files, point_in, point_out = open_circuit_tracer("set/")     # LayerFiles: headers only, read a piece at a time
    >>> config, params, point_in, point_out = import_circuit_tracer_clt("clt/")
"""

from __future__ import annotations

import dataclasses
import zipfile
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import flax.linen as nn
import jax
import numpy as np
import yaml

from transformer import hostmem
from transformer.errors import CheckpointError, ConfigError
from transformer.models import hf_files
from transformer.models.clt import CLTConfig
from transformer.models.sae import SAEConfig
from transformer.models.sae_formats import folded

CONFIG = "config.yaml"
# circuit-tracer's hook (TransformerLens's name under blocks.<l>., or its ReplacementMLP's) -> our point. The
# stream the MLP branch reads is resid_mid in a sequential block (TransformerLens's hook_mlp_in is off unless
# asked for); mlp.hook_in is the MLP's own input (after ln2 and its weight: circuit-tracer loads TransformerLens
# with fold_ln=False), mlp.hook_out its output before any norm after it.
HOOKS_IN = {
  "hook_resid_mid": "mlp_in",
  "hook_mlp_in": "mlp_in",
  "ln2.hook_normalized": "ln_2.normalized",
  "mlp.hook_in": "mlp_input",
}
HOOKS_OUT = {"hook_mlp_out": "mlp_out", "mlp.hook_out": "mlp_output"}
# ours -> the hook written
_WRITTEN_IN = {"mlp_in": "hook_resid_mid", "resid_mid": "hook_resid_mid", "ln_2.normalized": "ln2.hook_normalized"}
_WRITTEN_IN["mlp_input"] = "mlp.hook_in"
_WRITTEN_OUT = {"mlp_out": "hook_mlp_out", "mlp_output": "mlp.hook_out"}


def kind(directory: str | Path) -> str:
  """circuit-tracer's `model_kind` of a directory's config.yaml: "transcoder_set" (one file a layer) or
  "cross_layer_transcoder" (W_enc_<l> and W_dec_<l> files); "" where there is no config.yaml."""
  path = Path(directory) / CONFIG
  if not path.is_file():
    return ""
  return (_read_config(path) or {}).get("model_kind", "transcoder_set")


def _read_config(path: Path) -> dict:
  try:
    cfg = yaml.safe_load(path.read_text())
  except yaml.YAMLError as e:
    raise CheckpointError(f"{path} is not YAML ({e}): circuit-tracer's config.yaml names its hooks") from None
  if cfg is not None and not isinstance(cfg, dict):
    raise CheckpointError(f"{path} holds a {type(cfg).__name__}, not circuit-tracer's config (model_kind, hooks)")
  return cfg or {}


def _points(cfg: dict, path: Path) -> tuple[str, str]:
  """(our point in, our point out) of config.yaml's hooks; one error naming those we read."""
  hook_in, hook_out = cfg.get("feature_input_hook"), cfg.get("feature_output_hook")
  if hook_in not in HOOKS_IN or hook_out not in HOOKS_OUT:
    raise CheckpointError(
      f"{path}: transcoders from {hook_in!r} to {hook_out!r}; we read those from {', '.join(HOOKS_IN)} "
      f"to {', '.join(HOOKS_OUT)}"
    )
  return HOOKS_IN[hook_in], HOOKS_OUT[hook_out]


def write_config(out_dir: Path, model_kind: str, point_in: str, point_out: str, model_name: str = "", scan: str = ""):
  """config.yaml of a set whose files are written beside it (one layer at a time, by a caller that cannot hold
  the set whole): `model_kind`, the hooks of our points, the scan (default: the directory's name)."""
  cfg = _config(model_kind, point_in, point_out, model_name, scan or Path(out_dir).name)
  (Path(out_dir) / CONFIG).write_text(yaml.safe_dump(cfg, sort_keys=False))


def _config(model_kind: str, point_in: str, point_out: str, model_name: str, scan: str) -> dict:
  if point_in not in _WRITTEN_IN or point_out not in _WRITTEN_OUT:
    raise ConfigError(
      f"circuit-tracer's transcoders read {', '.join(_WRITTEN_IN)} and write {', '.join(_WRITTEN_OUT)} (its "
      f"hooks), not {point_in!r} -> {point_out!r}"
    )
  cfg = {"model_kind": model_kind, "feature_input_hook": _WRITTEN_IN[point_in]}
  cfg |= {"feature_output_hook": _WRITTEN_OUT[point_out], "scan": scan}
  return cfg | ({"model_name": model_name} if model_name else {})


def export_circuit_tracer(
  layers: list[tuple[SAEConfig, dict]],
  out_dir: str | Path,
  point_in: str = "mlp_in",
  point_out: str = "mlp_out",
  model_name: str = "",
  scan: str = "",
) -> Path:
  """Writes one transcoder a layer (`layers[l]`: its config and params, boxed or not) in circuit-tracer 0.5's
  cache layout: config.yaml and layer_<l>.safetensors, each in the model's units (the scales folded in), which
  its `load_transcoders_from_cache` reads. `scan`: the set's name in its viewer (default: the directory's)."""
  out_dir = Path(out_dir)
  cfg = _config("transcoder_set", point_in, point_out, model_name, scan or out_dir.name)
  tensors_of = []
  for layer, (config, params) in enumerate(layers):  # every layer checked before anything is written
    if not config.transcoder or config.activation not in ("relu", "jumprelu", "batchtopk"):
      raise ConfigError(
        f"layer {layer}: circuit-tracer's loaders read ReLU and JumpReLU transcoders (BatchTopK as its inference "
        f"JumpReLU), not a {config.activation} {'transcoder' if config.transcoder else 'SAE'}"
        + (
          ": its files have no way to say TopK (its TopK activation is built in Python only, and its loaders would "
          "read the weights as a ReLU's); train with --config.model.activation=batchtopk or jumprelu"
          if config.activation == "topk"
          else ""
        )
      )
    t = folded(config, params)
    tensors = {"W_enc": t["W_enc"].T, "W_dec": t["W_dec"], "b_enc": t["b_enc"], "b_dec": t["b_dec"]}
    if "threshold" in t:
      tensors["activation_function.threshold"] = t["threshold"]
    if "W_skip" in t:
      tensors["W_skip"] = t["W_skip"]
    tensors_of.append(tensors)
  out_dir.mkdir(parents=True, exist_ok=True)
  for layer, tensors in enumerate(tensors_of):
    hf_files.save_safetensors(tensors, out_dir / f"layer_{layer}.safetensors")
  (out_dir / CONFIG).write_text(yaml.safe_dump(cfg, sort_keys=False))
  return out_dir


def names(directory: str | Path) -> tuple[str, tuple[str, ...]]:
  """(the set's scan, its layers' files) of a circuit-tracer directory: config.yaml's `scan` (else the directory's
  name) and its transcoders list (else the files beside it)."""
  directory = Path(directory)
  cfg = _read_config(directory / CONFIG)
  listed = cfg.get("transcoders")
  if isinstance(listed, list) and all(isinstance(e, str) for e in listed):
    files = tuple(listed)
  elif cfg.get("model_kind") == "cross_layer_transcoder":
    files = tuple(str(f) for f in sorted(directory.glob("W_*_*.safetensors")))
  else:
    files = tuple(str(f) for _, f in sorted(_layer_files(directory, cfg, directory / CONFIG).items()))
  return str(cfg.get("scan") or directory.name), files


def import_circuit_tracer(directory: str | Path) -> tuple[list[tuple[SAEConfig, dict]], str, str]:
  """(one (config, params) a layer, read whole in float32; the point they read, the point they write) of
  circuit-tracer's transcoder set in `directory`, in any of its layouts (the module docstring)."""
  layers, point_in, point_out = open_circuit_tracer(directory)
  refuse_unless_fits(4 * sum(layer.values() for layer in layers), "reading its transcoders whole in float32", directory)
  return [layer.load() for layer in layers], point_in, point_out


def open_circuit_tracer(directory: str | Path) -> tuple[list[LayerFile], str, str]:
  """(each layer's file, its headers read and nothing else; the point they read, the point they write) of
  circuit-tracer's transcoder set in `directory`: what a graph over a set too large to hold reads a piece at a
  time. Refused up front where even one layer's encoder (stored, and in float32) would not fit in memory."""
  directory = Path(directory)
  path = directory / CONFIG
  if not path.is_file():
    raise CheckpointError(f"no {CONFIG} in {directory}: circuit-tracer's transcoder sets have one")
  cfg = _read_config(path)
  point_in, point_out = _points(cfg, path)
  files = _layer_files(directory, cfg, path)
  layers = [LayerFile.of(files[layer]) for layer in range(len(files))]
  refuse_unless_fits(
    max(layer.encoder_bytes() for layer in layers), "reading one layer's encoder to encode it", directory
  )
  return layers, point_in, point_out


def refuse_unless_fits(needed: int, what: str, directory: Path) -> None:
  """One error, before anything is read, where `needed` bytes are more than the host has free."""
  available = hostmem.available_bytes()
  if available is not None and needed > available:
    raise CheckpointError(
      f"{directory}: {what} needs {needed / 2**30:.2f} GiB and this machine has {available / 2**30:.2f} GiB "
      "free: read it on a machine with that much memory"
    )


@dataclasses.dataclass(frozen=True)
class LayerFile:
  """One layer's transcoder as its file holds it (circuit-tracer's safetensors, or Gemma Scope's params.npz),
  read a piece at a time in its stored dtype: the encoder whole to encode, the rows of the latents that fire,
  the rest (biases, a skip path) small. `shapes`: each tensor's, in circuit-tracer's names and orientation."""

  path: Path
  config: SAEConfig
  shapes: tuple[tuple[str, tuple[int, ...]], ...]

  @classmethod
  def of(cls, path: Path) -> LayerFile:
    shapes = _npz_shapes(path) if path.suffix == ".npz" else hf_files.header_shapes(path)
    if path.suffix == ".npz":
      if not {"W_enc", "W_dec", "b_enc", "b_dec", "threshold"} <= set(shapes):
        raise CheckpointError(f"{path} is not a Gemma Scope transcoder (W_enc, W_dec, b_enc, b_dec, threshold)")
      shapes["W_enc"] = shapes["W_enc"][::-1]  # stored d_model x d_sae
      shapes[_THRESHOLD] = shapes.pop("threshold")
    if "W_enc" not in shapes or "log_thresholds" in shapes:
      raise CheckpointError(f"{path} is not a circuit-tracer ReLU or JumpReLU transcoder (W_enc, W_dec, b_enc, b_dec)")
    d_sae, d_in = shapes["W_enc"]
    jumprelu = _THRESHOLD in shapes
    config = SAEConfig(
      d_in=d_in,
      d_sae=d_sae,
      d_out=shapes["W_dec"][1],
      skip="W_skip" in shapes,
      activation="jumprelu" if jumprelu else "relu",
      normalize_decoder=False,
    ).check()
    return cls(path, config, tuple(sorted(shapes.items())))

  def values(self) -> int:
    return sum(int(np.prod(shape)) for _, shape in self.shapes)

  def encoder_bytes(self) -> int:
    """The bytes encoding reads at once: the encoder as stored and in float32."""
    return int(np.prod(dict(self.shapes)["W_enc"])) * (self._itemsize("W_enc") + 4)

  def _itemsize(self, key: str) -> int:
    return 4 if self.path.suffix == ".npz" else hf_files.itemsize(self.path, key)

  def _read(self, keys) -> dict[str, np.ndarray]:
    """Whole tensors by circuit-tracer's names, stored dtype (W_enc Z x D)."""
    if self.path.suffix != ".npz":
      return {k: v for k, v in hf_files.read_tensors(self.path, skip=lambda key: key not in keys)}
    named = {_THRESHOLD: "threshold"}
    with np.load(self.path) as npz:
      t = {k: np.asarray(npz[named.get(k, k)]) for k in keys}
    if "W_enc" in t:
      t["W_enc"] = t["W_enc"].T
    return t

  def small_params(self) -> dict[str, np.ndarray]:
    """What a replacement model holds of this layer beside its features: the output bias, a skip path (D x D)
    and the unit scales (float32, in our params' names and orientation)."""
    t = self._read([k for k in ("b_dec", "W_skip") if k in dict(self.shapes)])
    params = {"b_dec": t["b_dec"].astype(np.float32), "input_scale": np.ones((), np.float32)}
    params["output_scale"] = np.ones((), np.float32)
    if "W_skip" in t:
      params["W_skip"] = t["W_skip"].T.astype(np.float32)
    return params

  def encoder(self) -> dict[str, np.ndarray]:
    """The encoder as `sae.encode` reads it: W_enc (D x Z), b_enc, a JumpReLU's threshold, stored dtype."""
    t = self._read([k for k in ("W_enc", "b_enc", _THRESHOLD) if k in dict(self.shapes)])
    params = {"W_enc": t["W_enc"].T, "b_enc": t["b_enc"], "input_scale": np.ones((), np.float32)}
    if _THRESHOLD in t:
      params["threshold"] = t[_THRESHOLD].reshape(-1)
    return params

  def rows(self, key: str, latents_k) -> np.ndarray:
    """`W_enc`'s or `W_dec`'s rows (Z x D, circuit-tracer's orientation) of these latents, float32: only those
    rows are read from a safetensors file."""
    if self.path.suffix == ".npz":
      return self._read([key])[key][np.asarray(latents_k, np.int64)].astype(np.float32)
    return hf_files.read_rows(self.path, key, latents_k).astype(np.float32)

  def load(self) -> tuple[SAEConfig, dict]:
    """(config, params) of the whole layer, float32."""
    t = {k: np.asarray(v, np.float32) for k, v in self._read([k for k, _ in self.shapes]).items()}
    params = {
      "W_enc": t["W_enc"].T,
      "b_enc": t["b_enc"],
      "W_dec": t["W_dec"],
      "b_dec": t["b_dec"],
      "since_fired": np.zeros(self.config.d_sae, np.float32),
      "input_scale": np.ones((), np.float32),
      "output_scale": np.ones((), np.float32),
    }
    if _THRESHOLD in t:
      params["threshold"] = t[_THRESHOLD].reshape(-1)
    if "W_skip" in t:
      params["W_skip"] = t["W_skip"].T
    return self.config, params


_THRESHOLD = "activation_function.threshold"


def _npz_shapes(file: Path) -> dict[str, tuple[int, ...]]:
  """Each array's shape in an .npz, from its headers alone."""
  shapes = {}
  with zipfile.ZipFile(file) as archive:
    for name in archive.namelist():
      with archive.open(name) as member:
        version = np.lib.format.read_magic(member)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shapes[name.removesuffix(".npy")] = tuple(read(member)[0])
  return shapes


def _layer_files(directory: Path, cfg: dict, path: Path) -> dict[int, Path]:
  """{layer: its file} of a transcoder set's config.yaml, in whichever layout; one error for a layer missing."""
  entries = cfg.get("transcoders")
  if entries is None:  # the cache layout: the files beside config.yaml
    files = {int(f.stem.removeprefix("layer_")): f for f in directory.glob("layer_*.safetensors")}
  elif not isinstance(entries, list):
    raise CheckpointError(f"{path}: `transcoders` is a {type(entries).__name__}, not a list of a file a layer")
  elif entries and all(isinstance(e, dict) for e in entries):  # the first releases'
    files = {int(e["layer"]): directory / e["filepath"] for e in entries}
  else:
    repos = [_repo_and_file(e, path, layer)[0] for layer, e in enumerate(entries)]
    home = max(repos, key=repos.count)  # the set's own repository: most of its files' (a tie: the first layer's)
    files = {layer: _local(directory, entry, path, layer, home) for layer, entry in enumerate(entries)}
  if not files or sorted(files) != list(range(len(files))):
    raise CheckpointError(
      f"{path}: a transcoder a layer from 0 is needed; found layers {sorted(files)} "
      f"({'layer_<l>.safetensors beside it' if entries is None else 'its transcoders list'})"
    )
  for layer, file in files.items():
    if not file.is_file():
      raise CheckpointError(f"{file} is missing: {path} names it for layer {layer}")
  return files


def _repo_and_file(entry, path: Path, layer: int) -> tuple[str, str]:
  """(repository, file in it) of an hf:// entry; ("", the path) of a local one."""
  if not isinstance(entry, str):
    raise CheckpointError(f"{path}: layer {layer}'s entry is {entry!r}, not a file path or an hf:// URI")
  if not entry.startswith("hf://"):
    return "", entry
  uri = urlparse(entry)
  repo_path = uri.path.lstrip("/").split("/", 1)
  if not uri.netloc or len(repo_path) != 2:
    raise CheckpointError(f"{path}: layer {layer}'s {entry!r} is not an hf://<owner>/<repo>/<file> URI")
  return f"{uri.netloc}/{repo_path[0]}", repo_path[1]


def _local(directory: Path, entry: str, path: Path, layer: int, home: str) -> Path:
  """The file of one `transcoders` entry: a local path (relative to config.yaml), or an hf:// URI found where a
  download puts it beside config.yaml: at its path in the repository, or (the set's own repository, downloaded
  from a subfolder) at the end of that path. A file of another repository is looked for at its full path only."""
  repo, file = _repo_and_file(entry, path, layer)
  if not repo:
    return directory / file
  parts = Path(file).parts
  tails = [Path(*parts[i:]) for i in range(len(parts))] if repo == home else [Path(file)]
  for tail in tails:
    if (directory / tail).is_file():
      return directory / tail
  revision = parse_qs(urlparse(entry).query).get("revision", [None])[0]
  raise CheckpointError(
    f"{path}: layer {layer}'s file {entry} is not beside it (looked for {directory / file}): it is in the "
    f"repository {repo}; fetch it there with `huggingface-cli download {repo} {file} --local-dir {directory}"
    f"{f' --revision {revision}' if revision else ''}` (every layer's file, the same way)"
  )


def export_circuit_tracer_clt(
  config: CLTConfig,
  params: dict,
  out_dir: str | Path,
  point_in: str = "mlp_in",
  point_out: str = "mlp_out",
  model_name: str = "",
  scan: str = "",
) -> Path:
  """Writes a cross-layer transcoder as circuit-tracer writes one (`CrossLayerTranscoder.to_safetensors`:
  W_enc_<l>.safetensors with W_enc_<l> (Z x D), b_enc_<l>, b_dec_<l> and a JumpReLU's threshold_<l>;
  W_dec_<l>.safetensors with W_dec_<l> (Z x (L - l) x D)) and a config.yaml, the scales folded in: its cache
  layout, which `load_transcoders_from_cache` reads."""
  if config.activation not in ("relu", "jumprelu"):
    raise ConfigError(f"circuit-tracer reads ReLU and JumpReLU cross-layer transcoders, not {config.activation}")
  out_dir = Path(out_dir)
  cfg = _config("cross_layer_transcoder", point_in, point_out, model_name, scan or out_dir.name)
  # (params as SAE.init or a restored workdir gives them: boxed with their logical axes)
  p = {k: np.asarray(jax.device_get(v), np.float32) for k, v in nn.unbox(params).items()}
  s_in, s_out = p["input_scale"], p["output_scale"]
  out_dir.mkdir(parents=True, exist_ok=True)
  for layer in range(config.layers):
    encoder = {
      f"W_enc_{layer}": (p["W_enc"][layer] * s_in[layer]).T,
      f"b_enc_{layer}": p["b_enc"][layer],
      f"b_dec_{layer}": p["b_dec"][layer] / s_out[layer],
    }
    if config.activation == "jumprelu":
      encoder[f"threshold_{layer}"] = np.maximum(p["threshold"][layer], 0.0)
    hf_files.save_safetensors(encoder, out_dir / f"W_enc_{layer}.safetensors")
    decoder = p[f"W_dec_{layer}"] / s_out[layer:, None]
    hf_files.save_safetensors({f"W_dec_{layer}": decoder}, out_dir / f"W_dec_{layer}.safetensors")
  (out_dir / CONFIG).write_text(yaml.safe_dump(cfg, sort_keys=False))
  return out_dir


def import_circuit_tracer_clt(directory: str | Path) -> tuple[CLTConfig, dict, str, str]:
  """(config, params, the point it reads, the point it writes) of circuit-tracer's cross-layer transcoder files
  in `directory` (W_enc_<l>.safetensors, W_dec_<l>.safetensors; config.yaml for the hooks, when there is one)."""
  directory = Path(directory)
  path = directory / CONFIG
  cfg = _read_config(path) if path.is_file() else {}
  cfg = {"feature_input_hook": "hook_resid_mid", "feature_output_hook": "hook_mlp_out", **cfg}
  point_in, point_out = _points(cfg, path)
  L = 0
  while (directory / f"W_enc_{L}.safetensors").is_file():
    L += 1
  if not L or any(not (directory / f"W_dec_{layer}.safetensors").is_file() for layer in range(L)):
    raise CheckpointError(
      f"{directory}: no W_enc_<l> and W_dec_<l>.safetensors for layers 0 .. L-1 (circuit-tracer's CLT)"
    )
  files = [directory / f"W_{kind}_{layer}.safetensors" for kind in ("enc", "dec") for layer in range(L)]
  refuse_unless_fits(4 * sum(map(hf_files.numel, files)), "reading its transcoder whole in float32", directory)
  enc = [dict(hf_files.read_tensors(directory / f"W_enc_{layer}.safetensors")) for layer in range(L)]
  Z, D = enc[0]["W_enc_0"].shape
  jumprelu = "threshold_0" in enc[0]
  params = {
    "W_enc": np.stack([e[f"W_enc_{layer}"].T for layer, e in enumerate(enc)]).astype(np.float32),
    "b_enc": np.stack([e[f"b_enc_{layer}"] for layer, e in enumerate(enc)]).astype(np.float32),
    "b_dec": np.stack([e[f"b_dec_{layer}"] for layer, e in enumerate(enc)]).astype(np.float32),
    "since_fired": np.zeros((L, Z), np.float32),
    "input_scale": np.ones(L, np.float32),
    "output_scale": np.ones(L, np.float32),
  }
  for layer in range(L):
    decoder = dict(hf_files.read_tensors(directory / f"W_dec_{layer}.safetensors"))[f"W_dec_{layer}"]
    params[f"W_dec_{layer}"] = np.asarray(decoder, np.float32)
  if jumprelu:
    thresholds = [e[f"threshold_{layer}"].reshape(-1) for layer, e in enumerate(enc)]
    params["threshold"] = np.stack(thresholds).astype(np.float32)
  activation = "jumprelu" if jumprelu else "relu"
  config = CLTConfig(layers=L, d_in=D, d_out=D, d_sae=Z, activation=activation).check()
  return config, params, point_in, point_out
