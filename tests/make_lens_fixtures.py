"""Golden arrays from TransformerLens for tests/test_activation_cache.py: the activations at every
point we map to one of its hook points, its residual-stream algebra and its patching sweeps, on the
GPT-2-shaped fixture tests/fixtures/gpt2_tiny_b (3 layers, 3 heads, width 48, MLP 80, random weights),
loaded by TransformerLens's GPT-2 bridge with Hugging Face's numerics.

Not run by the test suite (torch is not a dependency of this project). Regenerate with a Python
3.11 venv holding torch's CPU build and TransformerLens:

  python3.11 -m venv /tmp/lensenv
  /tmp/lensenv/bin/pip install torch==2.13.0 transformers==5.23.0 transformer-lens==4.3.0
  /tmp/lensenv/bin/python tests/make_lens_fixtures.py       # writes tests/fixtures/lens/golden.npz
"""

from pathlib import Path

import numpy as np
import torch
import transformer_lens
import transformers
from transformer_lens import patching
from transformer_lens.model_bridge import TransformerBridge

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODEL = FIXTURES / "gpt2_tiny_b"
# Ours -> TransformerLens's, per block ("blocks.{l}." before it).
BLOCK_POINTS = {
  "resid_pre": "hook_resid_pre",
  "resid_mid": "hook_resid_mid",
  "resid_post": "hook_resid_post",
  "ln_1.scale": "ln1.hook_scale",
  "ln_1.normalized": "ln1.hook_normalized",
  "ln_2.scale": "ln2.hook_scale",
  "ln_2.normalized": "ln2.hook_normalized",
  "q": "attn.hook_q",
  "k": "attn.hook_k",
  "v": "attn.hook_v",
  "attn_scores": "attn.hook_attn_scores",
  "pattern": "attn.hook_pattern",
  "z": "attn.hook_z",
  "attn_out": "hook_attn_out",
  "mlp_pre": "mlp.hook_pre",
  "mlp_post": "mlp.hook_post",
  "mlp_out": "hook_mlp_out",
}
POINTS = {
  "embed": "hook_embed",
  "pos_embed": "hook_pos_embed",
  "ln_f.scale": "ln_final.hook_scale",
  "ln_f.normalized": "ln_final.hook_normalized",
}
ANSWER, WRONG = 7, 11  # the metric: logit of ANSWER minus logit of WRONG at the last position


def main() -> None:
  hf = transformers.GPT2LMHeadModel.from_pretrained(MODEL, attn_implementation="eager").eval()
  bridge = TransformerBridge.boot_transformers(str(MODEL), hf_model=hf, tokenizer=None)
  generator = torch.Generator().manual_seed(0)
  clean = torch.randint(0, hf.config.vocab_size, (2, 12), generator=generator)
  corrupt = clean.clone()
  corrupt[:, 4] = (clean[:, 4] + 5) % hf.config.vocab_size
  out = {"clean": clean.numpy(), "corrupt": corrupt.numpy()}
  with torch.no_grad():
    logits, cache = bridge.run_with_cache(clean)
  out["logits"] = logits.detach().numpy()
  L = hf.config.n_layer
  for ours, theirs in BLOCK_POINTS.items():
    out[f"point/{ours}"] = np.stack([cache[f"blocks.{l}.{theirs}"].detach().numpy() for l in range(L)])
  for ours, theirs in POINTS.items():
    out[f"point/{ours}"] = cache[theirs].detach().numpy()
  tokens = torch.full(clean.shape, ANSWER)
  for layer in (None, 1):
    key = "final" if layer is None else str(layer)
    out[f"decompose_resid/{key}"] = cache.decompose_resid(layer=layer).detach().numpy()
    out[f"decompose_resid_ln/{key}"] = cache.decompose_resid(layer=layer, apply_ln=True).detach().numpy()
    out[f"accumulated_resid_ln/{key}"] = cache.accumulated_resid(layer=layer, apply_ln=True).detach().numpy()
    out[f"stack_head_results/{key}"] = cache.stack_head_results(layer=-1 if layer is None else layer).detach().numpy()
  out["decompose_resid_mlp_input/1"] = cache.decompose_resid(layer=1, mlp_input=True, apply_ln=True).detach().numpy()
  out["logit_attrs"] = cache.logit_attrs(cache.decompose_resid(), tokens=tokens).detach().numpy()
  out["logit_attrs_diff"] = (
    cache.logit_attrs(cache.decompose_resid(), tokens=tokens, incorrect_tokens=torch.full(clean.shape, WRONG))
    .detach()
    .numpy()
  )
  metric = lambda logits: (logits[:, -1, ANSWER] - logits[:, -1, WRONG]).mean()
  with torch.no_grad():
    out["patch/resid_pre"] = patching.get_act_patch_resid_pre(bridge, corrupt, cache, metric).detach().numpy()
    out["patch/attn_head_out_by_pos"] = (
      patching.get_act_patch_attn_head_out_by_pos(bridge, corrupt, cache, metric).detach().numpy()
    )
  out["versions"] = np.array(
    f"transformer-lens {transformer_lens.__version__ if hasattr(transformer_lens, '__version__') else '?'}, torch {torch.__version__}, transformers {transformers.__version__}"
  )
  (FIXTURES / "lens").mkdir(exist_ok=True)
  np.savez_compressed(FIXTURES / "lens" / "golden.npz", **out)
  print({k: v.shape for k, v in out.items()})


if __name__ == "__main__":
  main()
