"""Golden arrays from TransformerLens's bridge for tests/test_families.py: the activations at the named
points on two family fixtures (tests/fixtures/families/smollm, a Llama with grouped-query attention; and
gemma2, local and global layers, soft-caps, pre and post norms), loaded by TransformerLens 4.3's
`TransformerBridge` from the fixture's directory, on the first 12 tokens of the reference batch's first
row (past Gemma 2's window of 8).

Not run by the test suite (torch is not a dependency of this project). Regenerate with the venv of
tests/make_lens_fixtures.py:

  /tmp/lensenv/bin/python tests/make_lens_family_fixtures.py   # writes tests/fixtures/families/<name>/lens.npz
"""

from pathlib import Path

import numpy as np
import torch
from transformer_lens.model_bridge import TransformerBridge

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "families"
TOKENS = 12
# Ours -> TransformerLens's, per block ("blocks.{l}." before it).
POINTS = {
  "resid_pre": "hook_resid_pre",
  "resid_mid": "hook_resid_mid",
  "resid_post": "hook_resid_post",
  "attn_out": "hook_attn_out",
  "mlp_out": "hook_mlp_out",
  "pattern": "attn.hook_pattern",
  "q": "attn.hook_q",
  "k": "attn.hook_k",
  "v": "attn.hook_v",
  "z": "attn.hook_z",
}


def make(name: str) -> None:
  directory = FIXTURES / name
  bridge = TransformerBridge.boot_transformers(str(directory), dtype=torch.float32)
  ids = np.load(directory / "reference.npz")["input_ids"][:1, :TOKENS]
  with torch.no_grad():
    logits, cache = bridge.run_with_cache(torch.from_numpy(ids).long())
  layers = bridge.cfg.n_layers
  arrays = {
    ours: np.stack([cache[f"blocks.{l}.{theirs}"].numpy() for l in range(layers)]) for ours, theirs in POINTS.items()
  }
  np.savez(directory / "lens.npz", input_ids=ids, logits=logits.numpy(), **arrays)
  print(name, {k: v.shape for k, v in arrays.items()})


if __name__ == "__main__":
  for name in ("smollm", "gemma2"):
    make(name)
