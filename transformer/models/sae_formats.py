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

Gemma Scope's `params.npz` (W_enc d_model x d_sae, W_dec, b_enc, b_dec, threshold) is a JumpReLU SAE that
subtracts no b_dec from its input: z = JumpReLU(x W_enc + b_enc), x̂ = z W_dec + b_dec. circuit-tracer's
transcoder files are transformer.models.tracer_formats.
"""

from __future__ import annotations

import json
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

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
  tensors = folded(config, params)
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


def folded(config: SAEConfig, params: dict) -> dict[str, np.ndarray]:
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
