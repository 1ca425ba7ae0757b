"""The Hugging Face peer for launch/bench.py: GPT-2 in PyTorch (eager, CPU), timed the same way.

Runs in its own Python 3.11 venv with torch + transformers (torch has CPU wheels for 3.11 only;
neither is a dependency of this project). launch/bench.py makes that venv and runs:

  <venv>/bin/python launch/hf_peer.py '<json spec>'

and reads one JSON line back: median seconds of `generate` (KV cache, greedy, exactly
new_tokens per row) for each batch size, and of one training step (forward, backward, AdamW).
Standalone on purpose: it imports nothing from this repository.
"""

import json
import statistics
import sys
import time

import torch
import transformers


def median_seconds(fn, repeats: int, warmup: int = 1) -> float:
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main(spec: dict) -> dict:
  torch.manual_seed(0)
  m = spec["model"]
  config = transformers.GPT2Config(vocab_size=m["vocab_size"], n_positions=m["context_length"], n_layer=m["num_layers"],
                                   n_head=m["num_heads"], n_embd=m["d_model"], resid_pdrop=0.0, embd_pdrop=0.0,
                                   attn_pdrop=0.0)
  model = transformers.GPT2LMHeadModel(config)
  result = {"torch": torch.__version__, "transformers": transformers.__version__, "threads": torch.get_num_threads(),
            "generate": {}, "train": None}

  model.eval()
  g = spec["generate"]
  for batch in g["batch_sizes"]:
    prompt = torch.randint(0, m["vocab_size"], (batch, g["prompt_len"]))
    mask = torch.ones_like(prompt)

    def generate():
      with torch.inference_mode():
        out = model.generate(prompt, attention_mask=mask, max_new_tokens=g["new_tokens"],
                             min_new_tokens=g["new_tokens"], do_sample=False, use_cache=True,
                             pad_token_id=0, eos_token_id=None)
      assert out.shape == (batch, g["prompt_len"] + g["new_tokens"])

    result["generate"][str(batch)] = median_seconds(generate, spec["repeats"])

  t = spec["train"]
  if t:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    batch = torch.randint(0, m["vocab_size"], (t["batch_size"], t["seq_len"] + 1))

    def step():
      optimizer.zero_grad(set_to_none=True)
      loss = model(batch[:, :-1], labels=None).logits
      loss = torch.nn.functional.cross_entropy(loss.reshape(-1, loss.shape[-1]), batch[:, 1:].reshape(-1))
      loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      optimizer.step()

    result["train"] = median_seconds(step, spec["repeats"])
  return result


if __name__ == "__main__":
  print(json.dumps(main(json.loads(sys.argv[1]))))
