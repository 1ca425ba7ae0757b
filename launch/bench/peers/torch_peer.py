"""The PyTorch peers for launch/bench/__init__.py, timed the same way as ours (CPU, eager):

  hf       Hugging Face transformers' GPT2LMHeadModel: `generate` (its KV cache) and a training step.
  family   An open family's model from a directory (AutoModelForCausalLM): a prefill and `generate`.
  minimal  A GPT written the way nanoGPT writes it (fused qkv Linear, F.scaled_dot_product_attention
           with is_causal, GELU-tanh MLP, tied head), with a minimal KV-cache greedy loop: the
           simplest PyTorch program of the same shape.

Both train with AdamW (betas 0.9/0.95, weight decay 0.1) and global-norm clipping at 1.0, as ours.
Runs in its own Python 3.11 venv with torch + transformers (torch has CPU wheels for 3.11 only;
neither is a dependency of this project). launch/bench/__init__.py makes that venv and runs:

  <venv>/bin/python launch/bench/peers/torch_peer.py '<json spec>'

and reads one JSON line back: for each peer, median seconds of generation (greedy, exactly
new_tokens per row) for each batch size and of one training step. Standalone on purpose: it
imports nothing from this repository.
"""

import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import transformers
from torch import nn


def median_seconds(fn, repeats: int, warmup: int = 1, warmup_seconds: float = 0.0) -> float:
  """As transformer.benchmark.median_seconds: `warmup` untimed calls, then more until `warmup_seconds`."""
  start, calls = time.perf_counter(), 0
  while calls < warmup or time.perf_counter() - start < warmup_seconds:
    fn()
    calls += 1
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


class Block(nn.Module):
  def __init__(self, d_model: int, num_heads: int):
    super().__init__()
    self.num_heads = num_heads
    self.ln_1, self.ln_2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
    self.c_attn, self.c_proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
    self.c_fc, self.mlp_proj = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

  def forward(self, x, cache=None, position: int = 0):
    """cache: (k, v) tensors (B, H, context, head_dim) filled up to `position`, or None (training)."""
    B, T, C = x.shape
    q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
    q, k, v = (t.view(B, T, self.num_heads, C // self.num_heads).transpose(1, 2) for t in (q, k, v))
    if cache is None:
      y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
      cache[0][:, :, position : position + T], cache[1][:, :, position : position + T] = k, v
      k, v = cache[0][:, :, : position + T], cache[1][:, :, : position + T]
      y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)  # prefill: causal; one token: all
    x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
    return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class MinimalGPT(nn.Module):
  def __init__(self, vocab_size: int, max_len: int, num_layers: int, num_heads: int, d_model: int):
    super().__init__()
    self.wte, self.wpe = nn.Embedding(vocab_size, d_model), nn.Embedding(max_len, d_model)
    self.h = nn.ModuleList(Block(d_model, num_heads) for _ in range(num_layers))
    self.ln_f = nn.LayerNorm(d_model)
    self.num_heads, self.max_len = num_heads, max_len
    for name, p in self.named_parameters():  # GPT-2's init
      if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
        nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * num_layers))
      elif p.dim() == 2:
        nn.init.normal_(p, 0.0, 0.02)

  def forward(self, tokens, caches=None, position: int = 0):
    T = tokens.shape[1]
    x = self.wte(tokens) + self.wpe(torch.arange(position, position + T))
    for i, block in enumerate(self.h):
      x = block(x, None if caches is None else caches[i], position)
    return self.ln_f(x) @ self.wte.weight.T  # the tied head

  @torch.inference_mode()
  def generate(self, prompt, new_tokens: int):
    B, P = prompt.shape
    C, H = self.wte.weight.shape[1], self.num_heads
    caches = [(torch.empty(B, H, P + new_tokens, C // H), torch.empty(B, H, P + new_tokens, C // H)) for _ in self.h]
    logits = self(prompt, caches, 0)[:, -1]
    out = []
    for i in range(new_tokens):
      token = logits.argmax(-1, keepdim=True)
      out.append(token)
      if i + 1 < new_tokens:
        logits = self(token, caches, P + i)[:, -1]
    return torch.cat([prompt, *out], dim=1)


def train_step_fn(model, logits_of, t: dict, vocab_size: int):
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
  batch = torch.randint(0, vocab_size, (t["batch_size"], t["seq_len"] + 1))

  def step():
    optimizer.zero_grad(set_to_none=True)
    logits = logits_of(batch[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()

  return step


def hf_peer(spec: dict) -> dict:
  m, g = spec["model"], spec["generate"]
  config = transformers.GPT2Config(
    vocab_size=m["vocab_size"],
    n_positions=m["max_len"],
    n_layer=m["num_layers"],
    n_head=m["num_heads"],
    n_embd=m["d_model"],
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
  )
  model = transformers.GPT2LMHeadModel(config)
  result = {"generate": {}, "train": None}
  model.eval()
  for batch in g["batch_sizes"]:
    prompt = torch.randint(0, m["vocab_size"], (batch, g["prompt_len"]))
    mask = torch.ones_like(prompt)

    def generate():
      with torch.inference_mode():
        out = model.generate(
          prompt,
          attention_mask=mask,
          max_new_tokens=g["new_tokens"],
          min_new_tokens=g["new_tokens"],
          do_sample=False,
          use_cache=True,
          pad_token_id=0,
          eos_token_id=None,
        )
      assert out.shape == (batch, g["prompt_len"] + g["new_tokens"])

    result["generate"][str(batch)] = median_seconds(generate, spec["repeats"])
  if spec["train"]:
    model.train()
    step = train_step_fn(model, lambda x: model(x).logits, spec["train"], m["vocab_size"])
    result["train"] = median_seconds(step, spec["repeats"], warmup_seconds=spec["train"]["warmup_seconds"])
  return result


def family_peer(spec: dict) -> dict:
  """An open family's model (spec["family"]["directory"]: what launch/bench/hf.py exported), loaded with
  AutoModelForCausalLM in float32: a prefill (one forward over the prompt) and greedy `generate` per
  batch size, and the first row's greedy tokens (that the two generate the same)."""
  f = spec["family"]
  model = transformers.AutoModelForCausalLM.from_pretrained(f["directory"], dtype=torch.float32).eval()
  vocab = model.config.vocab_size
  result = {"prefill": {}, "generate": {}, "tokens": None}
  for batch in f["batch_sizes"]:
    prompt = torch.tensor(f["prompts"][:batch])
    mask = torch.ones_like(prompt)

    def prefill():
      with torch.inference_mode():
        model(input_ids=prompt, attention_mask=mask, use_cache=False)

    def generate():
      with torch.inference_mode():
        return model.generate(
          prompt,
          attention_mask=mask,
          max_new_tokens=f["new_tokens"],
          min_new_tokens=f["new_tokens"],
          do_sample=False,
          pad_token_id=0,
          eos_token_id=None,
        )

    result["prefill"][str(batch)] = median_seconds(prefill, spec["repeats"])
    result["generate"][str(batch)] = median_seconds(generate, spec["repeats"])
    if result["tokens"] is None:
      result["tokens"] = generate()[0, prompt.shape[1] :].tolist()
  assert vocab > 0
  return result


def minimal_peer(spec: dict) -> dict:
  m, g = spec["model"], spec["generate"]
  model = MinimalGPT(m["vocab_size"], m["max_len"], m["num_layers"], m["num_heads"], m["d_model"])
  result = {"generate": {}, "train": None}
  model.eval()
  for batch in g["batch_sizes"]:
    prompt = torch.randint(0, m["vocab_size"], (batch, g["prompt_len"]))

    def generate():
      assert model.generate(prompt, g["new_tokens"]).shape == (batch, g["prompt_len"] + g["new_tokens"])

    result["generate"][str(batch)] = median_seconds(generate, spec["repeats"])
  if spec["train"]:
    model.train()
    result["train"] = median_seconds(
      train_step_fn(model, model, spec["train"], m["vocab_size"]),
      spec["repeats"],
      warmup_seconds=spec["train"]["warmup_seconds"],
    )
  return result


def main(spec: dict) -> dict:
  torch.manual_seed(0)
  peers = {"hf": hf_peer, "minimal": minimal_peer, "family": family_peer}
  result = {"torch": torch.__version__, "transformers": transformers.__version__, "threads": torch.get_num_threads()}
  for name in spec.get("peers", ["hf"]):
    result[name] = peers[name](spec)
  return result


if __name__ == "__main__":
  print(json.dumps(main(json.loads(sys.argv[1]))))
