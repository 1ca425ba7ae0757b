"""Golden fixtures from SAELens for tests/test_sae_formats.py: small random SAEs and transcoders of each
architecture saved by SAELens's own `save_model` (cfg.json + sae_weights.safetensors), with its encode and
decode of fixed inputs (reference.npz); and a check that SAELens loads our exports with equal encode/decode.

Not run by the test suite (torch is not a dependency of this project). Regenerate with a Python 3.11 venv:

  python3.11 -m venv /tmp/saeenv
  /tmp/saeenv/bin/pip install torch==2.13.0 transformers==5.23.0 sae-lens==6.54.12
  /tmp/saeenv/bin/python tests/make_saelens_fixtures.py            # writes tests/fixtures/saelens/<architecture>/
  /tmp/saeenv/bin/python tests/make_saelens_fixtures.py --check DIR
      # loads our export in DIR with SAE.load_from_disk and prints the largest differences of its encode and
      # decode from ours (DIR/ours.npz: the inputs, our latents and outputs), as JSON
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from sae_lens import SAE
from sae_lens.saes.jumprelu_sae import JumpReLUSAE, JumpReLUSAEConfig
from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig
from sae_lens.saes.transcoder import (
  JumpReLUTranscoder,
  JumpReLUTranscoderConfig,
  SkipTranscoder,
  SkipTranscoderConfig,
  Transcoder,
  TranscoderConfig,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "saelens"
D_IN, D_SAE, D_OUT = 12, 32, 10
MAKERS = {
  "standard": (StandardSAE, lambda: StandardSAEConfig(d_in=D_IN, d_sae=D_SAE)),
  "topk": (TopKSAE, lambda: TopKSAEConfig(d_in=D_IN, d_sae=D_SAE, k=5)),
  "jumprelu": (JumpReLUSAE, lambda: JumpReLUSAEConfig(d_in=D_IN, d_sae=D_SAE)),
  "transcoder": (Transcoder, lambda: TranscoderConfig(d_in=D_IN, d_sae=D_SAE, d_out=D_OUT, apply_b_dec_to_input=False)),
  "skip_transcoder": (
    SkipTranscoder,
    lambda: SkipTranscoderConfig(d_in=D_IN, d_sae=D_SAE, d_out=D_OUT, apply_b_dec_to_input=False),
  ),
  "jumprelu_transcoder": (
    JumpReLUTranscoder,
    lambda: JumpReLUTranscoderConfig(d_in=D_IN, d_sae=D_SAE, d_out=D_OUT, apply_b_dec_to_input=False),
  ),
}


def make(name: str, seed: int) -> None:
  torch.manual_seed(seed)
  cls, config = MAKERS[name]
  sae = cls(config())
  with torch.no_grad():  # every tensor random (biases too, thresholds positive), decoder rows not unit
    for key, p in sae.named_parameters():
      p.copy_(torch.rand_like(p) * 0.2 if key == "threshold" else torch.randn_like(p) * 0.3)
  out = FIXTURES / name
  sae.save_model(out)
  x = torch.randn(16, D_IN, generator=torch.Generator().manual_seed(seed))
  with torch.no_grad():
    z = sae.encode(x)
    y = sae.decode(z) if "skip" not in name else sae.forward(x)
  np.savez(out / "reference.npz", x=x.numpy(), z=z.numpy(), y=y.numpy())
  print(name, {k: tuple(v.shape) for k, v in sae.state_dict().items()}, int((z > 0).sum()))


def check(directory: str) -> None:
  sae = SAE.load_from_disk(directory)
  ours = np.load(Path(directory) / "ours.npz")
  x = torch.from_numpy(ours["x"])
  with torch.no_grad():
    z = sae.encode(x)
    y = sae.forward(x)
  print(json.dumps({"z": float(np.abs(z.numpy() - ours["z"]).max()), "y": float(np.abs(y.numpy() - ours["y"]).max())}))


if __name__ == "__main__":
  if sys.argv[1:2] == ["--check"]:
    check(sys.argv[2])
  else:
    for seed, name in enumerate(MAKERS):
      make(name, seed)
