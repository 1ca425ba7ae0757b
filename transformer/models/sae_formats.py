"""SAELens's on-disk format (cfg.json + sae_weights.safetensors) <-> our SAEs and transcoders, both ways.

SAELens keeps `W_enc` (d_in x d_sae), `b_enc`, `W_dec` (d_sae x d_out), `b_dec`, JumpReLU's `threshold` and a
skip transcoder's `W_skip` (d_out x d_in); cfg.json names the architecture ("standard", "topk", "jumprelu",
"transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder") and the widths. Ours
learns in scaled spaces (inputs times `input_scale`, a transcoder's outputs times `output_scale`): an export
folds the scales into the weights, so that SAELens's encode and decode of the model's activations are ours.
BatchTopK is written as SAELens writes it for inference: a JumpReLU with its inference threshold.

    >>> export_saelens(config, params, "out/", hook_name="blocks.2.hook_resid_pre")
    >>> config, params = import_saelens("out/")      # SAELens's SAE.save_model files, or ours
    >>> config, params = import_gemma_scope("params.npz")   # a Gemma Scope JumpReLU SAE

circuit-tracer's transcoder set (a directory: config.yaml naming the model, the feature input and output hooks
in TransformerLens's names and one file a layer; each safetensors holds `W_enc` (d_sae x d_in), `W_dec` (d_sae x
d_out), `b_enc`, `b_dec`, a skip transcoder's `W_skip` (d_out x d_in) and a JumpReLU's
`activation_function.threshold`) is what its attribution graphs read (transformer.interp.graph is ours):

    >>> export_circuit_tracer([(config, params), ...], "set/", point_in="mlp_in")   # one transcoder a layer
    >>> layers, point_in, point_out = import_circuit_tracer("set/")
    >>> config, params, point_in, point_out = import_circuit_tracer_clt("clt/")   # its cross-layer transcoders

Gemma Scope's `params.npz` (W_enc d_model x d_sae, W_dec, b_enc, b_dec, threshold) is a JumpReLU SAE that
subtracts no b_dec from its input: z = JumpReLU(x W_enc + b_enc), x̂ = z W_dec + b_dec.
"""

from __future__ import annotations

import json
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import yaml

from transformer.errors import CheckpointError, ConfigError
from transformer.models import hf_files
from transformer.models.sae import SAE, SAEConfig

CONFIG, WEIGHTS = "cfg.json", "sae_weights.safetensors"
# (our activation, a transcoder, with a skip path) -> SAELens's architecture
ARCHITECTURES = {
  ("relu", False, False): "standard",
  ("topk", False, False): "topk",
  ("jumprelu", False, False): "jumprelu",
  ("relu", True, False): "transcoder",
  ("relu", True, True): "skip_transcoder",
  ("jumprelu", True, False): "jumprelu_transcoder",
  ("jumprelu", True, True): "jumprelu_skip_transcoder",
}
_OURS = {arch: key for key, arch in ARCHITECTURES.items()}


def export_saelens(config: SAEConfig, params: dict, out_dir: str | Path, hook_name: str = "") -> Path:
  """Writes `params` of an SAE or transcoder of `config` as SAELens's files in `out_dir`."""
  activation = "jumprelu" if config.activation == "batchtopk" else config.activation
  key = (activation, config.transcoder, config.skip)
  if key not in ARCHITECTURES:
    raise ConfigError(
      f"SAELens has no architecture for a {config.activation} {'transcoder' if config.transcoder else 'SAE'}"
    )
  tensors = _folded(config, params)
  cfg = {
    "architecture": ARCHITECTURES[key],
    "d_in": config.d_in,
    "d_sae": config.latents,
    "dtype": "float32",
    "device": "cpu",
    "apply_b_dec_to_input": not config.transcoder,
    "normalize_activations": "none",
    "reshape_activations": "none",
    "metadata": {"hook_name": hook_name},
  }
  if config.activation == "topk":
    cfg.update(k=config.k, rescale_acts_by_decoder_norm=False)
  if config.transcoder:
    cfg["d_out"] = config.d_out
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  hf_files.save_safetensors(tensors, out_dir / WEIGHTS)
  (out_dir / CONFIG).write_text(json.dumps(cfg, indent=2) + "\n")
  return out_dir


def _folded(config: SAEConfig, params: dict) -> dict[str, np.ndarray]:
  """The weights in the model's units (the scales folded in), as SAELens orients them: W_enc d_in x d_sae,
  W_dec d_sae x d_out (unit rows where ours are), W_skip d_out x d_in, JumpReLU's threshold at least 0."""
  # (params as SAE.init or a restored workdir gives them: boxed with their logical axes)
  p = {k: np.asarray(jax.device_get(v), np.float32) for k, v in nn.unbox(params).items()}
  s_in = float(p["input_scale"])
  s_out = float(p["output_scale"]) if config.transcoder else s_in
  decoder_ZxO = np.asarray(SAE(config).apply({"params": params}, method=SAE.decoder), np.float32)
  tensors = {"W_enc": p["W_enc"] * s_in, "b_enc": p["b_enc"], "W_dec": decoder_ZxO / s_out, "b_dec": p["b_dec"] / s_out}
  if config.activation in ("jumprelu", "batchtopk"):
    tensors["threshold"] = np.maximum(p["threshold"], 0.0)
  if config.skip:
    tensors["W_skip"] = (p["W_skip"] * s_in / s_out).T
  return tensors


def import_saelens(directory: str | Path) -> tuple[SAEConfig, dict]:
  """(config, params) of SAELens's files in `directory`: its decoder rows taken as they are
  (`normalize_decoder=False`), its encoder bias folded where it applies no b_dec to the input."""
  directory = Path(directory)
  path = directory / CONFIG
  if not path.is_file():
    raise CheckpointError(f"no {CONFIG} in {directory}: SAELens's SAE.save_model writes it beside {WEIGHTS}")
  cfg = json.loads(path.read_text())
  arch = cfg.get("architecture", "standard")
  if arch not in _OURS:
    raise CheckpointError(f"{path}: architecture {arch!r} is not one we read; supported: {', '.join(_OURS)}")
  if cfg.get("normalize_activations", "none") != "none" or cfg.get("rescale_acts_by_decoder_norm"):
    raise CheckpointError(f"{path}: normalize_activations / rescale_acts_by_decoder_norm other than SAELens's defaults")
  activation, transcoder, skip = _OURS[arch]
  t = {k: np.asarray(v, np.float32) for k, v in hf_files.read_tensors(directory / WEIGHTS)}
  config = SAEConfig(
    d_in=cfg["d_in"],
    d_sae=cfg["d_sae"],
    d_out=cfg.get("d_out", 0) if transcoder else 0,
    skip=skip,
    activation=activation,
    k=cfg.get("k", 32),
    normalize_decoder=False,
  ).check()
  b_enc = t["b_enc"]
  if not transcoder and not cfg.get("apply_b_dec_to_input", True):  # ours subtracts b_dec: add it back in b_enc
    b_enc = b_enc + t["b_dec"] @ t["W_enc"]
  Z = config.latents
  params = {
    "W_enc": t["W_enc"],
    "b_enc": b_enc,
    "W_dec": t["W_dec"],
    "b_dec": t["b_dec"],
    "since_fired": np.zeros(Z, np.float32),
    "input_scale": np.ones((), np.float32),
  }
  if transcoder:
    params["output_scale"] = np.ones((), np.float32)
  if activation == "jumprelu":
    params["threshold"] = t["threshold"]
  if skip:
    params["W_skip"] = t["W_skip"].T
  return config, params


def import_gemma_scope(path: str | Path) -> tuple[SAEConfig, dict]:
  """(config, params) of a Gemma Scope SAE's params.npz (a file, or the directory holding it)."""
  path = Path(path)
  file = path / "params.npz" if path.is_dir() else path
  if not file.is_file():
    raise CheckpointError(f"no Gemma Scope params.npz at {path}: its SAEs are a directory of one params.npz each")
  with np.load(file) as npz:
    t = {k: np.asarray(npz[k], np.float32) for k in npz.files}
  missing = sorted({"W_enc", "W_dec", "b_enc", "b_dec", "threshold"} - set(t))
  if missing:
    raise CheckpointError(f"{file} lacks {', '.join(missing)}: not a Gemma Scope JumpReLU SAE")
  d_in, d_sae = t["W_enc"].shape
  config = SAEConfig(d_in=d_in, d_sae=d_sae, activation="jumprelu", normalize_decoder=False).check()
  params = {
    "W_enc": t["W_enc"],
    "b_enc": t["b_enc"] + t["b_dec"] @ t["W_enc"],  # ours subtracts b_dec from the input; theirs does not
    "W_dec": t["W_dec"],
    "b_dec": t["b_dec"],
    "threshold": t["threshold"],
    "since_fired": np.zeros(d_sae, np.float32),
    "input_scale": np.ones((), np.float32),
  }
  return config, params


CIRCUIT_TRACER_CONFIG = "config.yaml"
# our point <-> circuit-tracer's hook (TransformerLens's name under blocks.<l>.): the input a transcoder reads
# (the MLP's copy of the stream is resid_mid in a sequential block) and the output it writes
_TRACER_IN = {"mlp_in": "hook_resid_mid", "resid_mid": "hook_resid_mid", "ln_2.normalized": "ln2.hook_normalized"}
_TRACER_IN_READ = {"hook_resid_mid": "mlp_in", "hook_mlp_in": "mlp_in", "ln2.hook_normalized": "ln_2.normalized"}
_TRACER_OUT_READ = {"hook_mlp_out": "mlp_out", "mlp.hook_out": "mlp_out"}


def export_circuit_tracer(
  layers: list[tuple[SAEConfig, dict]], out_dir: str | Path, point_in: str = "mlp_in", model_name: str = ""
) -> Path:
  """Writes one transcoder a layer (`layers[l]`: its config and params) as circuit-tracer's transcoder set in
  `out_dir`: config.yaml and layer_<l>.safetensors, each in the model's units (the scales folded in)."""
  if point_in not in _TRACER_IN:
    raise ConfigError(f"circuit-tracer's transcoders read {', '.join(_TRACER_IN)} (its hooks), not {point_in!r}")
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  entries = []
  for layer, (config, params) in enumerate(layers):
    if not config.transcoder or config.activation not in ("relu", "jumprelu", "batchtopk"):
      raise ConfigError(
        f"layer {layer}: circuit-tracer reads ReLU and JumpReLU transcoders (BatchTopK as its inference JumpReLU), "
        f"not a {config.activation} {'transcoder' if config.transcoder else 'SAE'}"
      )
    t = _folded(config, params)
    tensors = {"W_enc": t["W_enc"].T, "W_dec": t["W_dec"], "b_enc": t["b_enc"], "b_dec": t["b_dec"]}
    if "threshold" in t:
      tensors["activation_function.threshold"] = t["threshold"]
    if "W_skip" in t:
      tensors["W_skip"] = t["W_skip"]
    hf_files.save_safetensors(tensors, out_dir / f"layer_{layer}.safetensors")
    entries.append({"id": f"layer_{layer}", "layer": layer, "filepath": f"layer_{layer}.safetensors"})
  config = {
    "model_kind": "transcoder_set",
    "model_name": model_name,
    "scan": out_dir.name,
    "feature_input_hook": _TRACER_IN[point_in],
    "feature_output_hook": "hook_mlp_out",
    "transcoders": entries,
  }
  (out_dir / CIRCUIT_TRACER_CONFIG).write_text(yaml.safe_dump(config, sort_keys=False))
  return out_dir


def import_circuit_tracer(directory: str | Path) -> tuple[list[tuple[SAEConfig, dict]], str, str]:
  """(one (config, params) a layer, the point they read, the point they write) of circuit-tracer's transcoder
  set in `directory` (its config.yaml's files, relative to it)."""
  directory = Path(directory)
  path = directory / CIRCUIT_TRACER_CONFIG
  if not path.is_file():
    raise CheckpointError(f"no {CIRCUIT_TRACER_CONFIG} in {directory}: circuit-tracer's transcoder sets have one")
  cfg = yaml.safe_load(path.read_text())
  hook_in, hook_out = cfg.get("feature_input_hook"), cfg.get("feature_output_hook")
  if hook_in not in _TRACER_IN_READ or hook_out not in _TRACER_OUT_READ:
    raise CheckpointError(
      f"{path}: transcoders from {hook_in!r} to {hook_out!r}; we read those from {', '.join(_TRACER_IN_READ)} "
      f"to {', '.join(_TRACER_OUT_READ)}"
    )
  by_layer = {int(t["layer"]): directory / t["filepath"] for t in cfg.get("transcoders", [])}
  if sorted(by_layer) != list(range(len(by_layer))) or not by_layer:
    raise CheckpointError(f"{path}: a transcoder a layer from 0 is needed; it lists layers {sorted(by_layer)}")
  return [_tracer_layer(by_layer[layer]) for layer in range(len(by_layer))], _TRACER_IN_READ[hook_in], "mlp_out"


def _tracer_layer(file: Path) -> tuple[SAEConfig, dict]:
  if not file.is_file():
    raise CheckpointError(f"{file} is missing: the transcoder set's config.yaml names it")
  t = {k: np.asarray(v, np.float32) for k, v in hf_files.read_tensors(file)}
  if "W_enc" not in t or "log_thresholds" in t:
    raise CheckpointError(f"{file} is not a circuit-tracer ReLU or JumpReLU transcoder (W_enc, W_dec, b_enc, b_dec)")
  d_sae, d_in = t["W_enc"].shape
  jumprelu = "activation_function.threshold" in t
  config = SAEConfig(
    d_in=d_in,
    d_sae=d_sae,
    d_out=t["W_dec"].shape[1],
    skip="W_skip" in t,
    activation="jumprelu" if jumprelu else "relu",
    normalize_decoder=False,
  ).check()
  params = {
    "W_enc": t["W_enc"].T,
    "b_enc": t["b_enc"],
    "W_dec": t["W_dec"],
    "b_dec": t["b_dec"],
    "since_fired": np.zeros(d_sae, np.float32),
    "input_scale": np.ones((), np.float32),
    "output_scale": np.ones((), np.float32),
  }
  if jumprelu:
    params["threshold"] = t["activation_function.threshold"]
  if "W_skip" in t:
    params["W_skip"] = t["W_skip"].T
  return config, params


def circuit_tracer_kind(directory: str | Path) -> str:
  """circuit-tracer's `model_kind` of a directory's config.yaml: "transcoder_set" (one file a layer) or
  "cross_layer_transcoder" (W_enc_<l> and W_dec_<l> files); "" where there is no config.yaml."""
  path = Path(directory) / CIRCUIT_TRACER_CONFIG
  if not path.is_file():
    return ""
  return (yaml.safe_load(path.read_text()) or {}).get("model_kind", "transcoder_set")


def export_circuit_tracer_clt(config: SAEConfig, params: dict, out_dir: str | Path, point_in: str = "mlp_in") -> Path:
  """Writes a cross-layer transcoder as circuit-tracer writes one (`CrossLayerTranscoder.to_safetensors`:
  W_enc_<l>.safetensors with W_enc_<l> (Z x D), b_enc_<l>, b_dec_<l> and a JumpReLU's threshold_<l>;
  W_dec_<l>.safetensors with W_dec_<l> (Z x (L - l) x D)) and a config.yaml, the scales folded in."""
  if config.activation not in ("relu", "jumprelu"):
    raise ConfigError(f"circuit-tracer reads ReLU and JumpReLU cross-layer transcoders, not {config.activation}")
  # (params as SAE.init or a restored workdir gives them: boxed with their logical axes)
  p = {k: np.asarray(jax.device_get(v), np.float32) for k, v in nn.unbox(params).items()}
  s_in, s_out = p["input_scale"], p["output_scale"]
  out_dir = Path(out_dir)
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
  cfg = {
    "model_kind": "cross_layer_transcoder",
    "scan": out_dir.name,
    "feature_input_hook": _TRACER_IN[point_in],
    "feature_output_hook": "hook_mlp_out",
  }
  (out_dir / CIRCUIT_TRACER_CONFIG).write_text(yaml.safe_dump(cfg, sort_keys=False))
  return out_dir


def import_circuit_tracer_clt(directory: str | Path) -> tuple[SAEConfig, dict, str, str]:
  """(config, params, the point it reads, the point it writes) of circuit-tracer's cross-layer transcoder files
  in `directory` (W_enc_<l>.safetensors, W_dec_<l>.safetensors; config.yaml for the hooks, when there is one)."""
  directory = Path(directory)
  cfg = yaml.safe_load((directory / CIRCUIT_TRACER_CONFIG).read_text()) if circuit_tracer_kind(directory) else {}
  hook_in = cfg.get("feature_input_hook", "hook_resid_mid")
  if hook_in not in _TRACER_IN_READ or cfg.get("feature_output_hook", "hook_mlp_out") not in _TRACER_OUT_READ:
    raise CheckpointError(
      f"{directory}: a cross-layer transcoder from {hook_in!r}; we read {', '.join(_TRACER_IN_READ)}"
    )
  L = 0
  while (directory / f"W_enc_{L}.safetensors").is_file():
    L += 1
  if not L or any(not (directory / f"W_dec_{layer}.safetensors").is_file() for layer in range(L)):
    raise CheckpointError(
      f"{directory}: no W_enc_<l> and W_dec_<l>.safetensors for layers 0 .. L-1 (circuit-tracer's CLT)"
    )
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
    params["threshold"] = np.stack([e[f"threshold_{layer}"].reshape(-1) for layer, e in enumerate(enc)]).astype(
      np.float32
    )
  activation = "jumprelu" if jumprelu else "relu"
  config = SAEConfig(d_in=D, d_out=D, d_sae=Z, layers=L, activation=activation, normalize_decoder=False).check()
  return config, params, _TRACER_IN_READ[hook_in], "mlp_out"
