"""TransformerLens's activation patching, timed for `launch.bench --what=patching` beside ours.

Runs in the PyTorch peers' venv with transformer-lens added (launch/bench/peer_env.py makes it); imports
nothing from this repository. Reads a JSON spec (a Hugging Face GPT-2 directory, the clean and
corrupt token ids, the answer and wrong token of the metric), loads the model with TransformerLens's
GPT-2 bridge (Hugging Face's numerics), and times `get_act_patch_resid_pre` (layer x position) and
`get_act_patch_attn_head_out_all_pos` (layer x head) on the pair; prints one JSON line: seconds and
the sweeps' values.

  <venv>/bin/python launch/bench/peers/lens_peer.py '<json spec>'
"""

import json
import sys
import time

import torch
import transformer_lens
import transformers
from transformer_lens import patching
from transformer_lens.model_bridge import TransformerBridge


def main(spec: dict) -> dict:
  torch.set_grad_enabled(False)
  hf = transformers.GPT2LMHeadModel.from_pretrained(spec["model_dir"], attn_implementation="eager").eval()
  model = TransformerBridge.boot_transformers(spec["model_dir"], hf_model=hf, tokenizer=None)
  clean, corrupt = torch.tensor([spec["clean"]]), torch.tensor([spec["corrupt"]])
  answer, wrong = spec["answer"], spec["wrong"]
  metric = lambda logits: (logits[:, -1, answer] - logits[:, -1, wrong]).mean()
  _, cache = model.run_with_cache(clean)
  out = {"versions": f"transformer-lens {getattr(transformer_lens, '__version__', '4.x')}, torch {torch.__version__}"}
  out["threads"] = torch.get_num_threads()
  for name, sweep in (
    ("positions", patching.get_act_patch_resid_pre),
    ("heads", patching.get_act_patch_attn_head_out_all_pos),
  ):
    start = time.perf_counter()
    values = sweep(model, corrupt, cache, metric)
    out[name] = {"seconds": time.perf_counter() - start, "values": values.tolist()}
  return out


if __name__ == "__main__":
  print(json.dumps(main(json.loads(sys.argv[1]))))
