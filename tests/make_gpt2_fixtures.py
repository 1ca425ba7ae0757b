"""Golden fixtures for GPT-2 parity, made with Hugging Face transformers' GPT2LMHeadModel.

Not run by the test suite (torch is not a dependency of this project). Regenerate with a Python
3.11 venv holding the CPU build of torch (its CPU wheels exist for Python 3.11 only; under 3.12 pip
would pull a multi-GB CUDA build):

  python3.11 -m venv /tmp/torchenv
  /tmp/torchenv/bin/pip install torch==2.13.0 transformers safetensors numpy
  /tmp/torchenv/bin/python tests/make_gpt2_fixtures.py            # writes tests/fixtures/gpt2_*/
  /tmp/torchenv/bin/python tests/make_gpt2_fixtures.py --check DIR FIXTURE
      # loads an exported DIR with GPT2LMHeadModel.from_pretrained and compares its logits on the
      # FIXTURE's input ids with the FIXTURE's reference logits (used by tests/test_gpt_hf.py when
      # TRANSFORMER_TORCH_PYTHON points at such a python)
"""

import sys
from pathlib import Path

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CONFIGS = {
  # Two shapes that differ in everything an importer could get wrong: heads, widths, n_inner, depth.
  "gpt2_tiny_a": dict(vocab_size=97, n_positions=32, n_embd=64, n_layer=2, n_head=4),
  "gpt2_tiny_b": dict(vocab_size=131, n_positions=48, n_embd=48, n_layer=3, n_head=3, n_inner=80),
}


def make(name: str, seed: int) -> None:
  torch.manual_seed(seed)
  cfg = GPT2Config(**CONFIGS[name], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
  model = GPT2LMHeadModel(cfg).eval()
  with torch.no_grad():  # fresh init has zero biases and unit LayerNorms: perturb so every tensor matters
    for p in model.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  out = FIXTURES / name
  model.save_pretrained(out, safe_serialization=True)
  ids = torch.randint(0, cfg.vocab_size, (3, cfg.n_positions), generator=torch.Generator().manual_seed(seed))
  with torch.no_grad():
    logits = model(ids).logits
  np.save(out / "input_ids.npy", ids.numpy().astype(np.int32))
  np.save(out / "logits.npy", logits.numpy().astype(np.float32))
  print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters -> {out}")


# A GPT-2 with a tokenizer of its own (a byte-level BPE of a few hundred tokens): its directory as
# save_pretrained writes it (tokenizer.json beside the weights), GPT-2's older vocab.json + merges.txt under
# slow/, and AutoTokenizer's ids and the model's logits of TEXT.
OWN = "gpt2_own_tokenizer"
TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer"
CORPUS = [
  "The slings and arrows of outrageous fortune, or to take arms against a sea of troubles,",
  "and by opposing end them. To die, to sleep; no more; and by a sleep to say we end",
  "the heart-ache and the thousand natural shocks that flesh is heir to: 'tis a consummation",
  "devoutly to be wish'd. To die, to sleep; to sleep, perchance to dream. Ay, there's the rub.",
]


def make_own_tokenizer(seed: int) -> None:
  from tokenizers import ByteLevelBPETokenizer
  from transformers import AutoTokenizer, GPT2Tokenizer, GPT2TokenizerFast

  bpe = ByteLevelBPETokenizer()
  bpe.train_from_iterator(CORPUS * 4, vocab_size=320, min_frequency=2, special_tokens=["<|endoftext|>"])
  fast = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
  out = FIXTURES / OWN
  fast.save_pretrained(out)
  for name in ("vocab.json", "merges.txt", "special_tokens_map.json"):  # the fast files alone at the top
    (out / name).unlink(missing_ok=True)
  slow = out / "slow"
  slow.mkdir(exist_ok=True)
  bpe.save_model(str(slow))  # vocab.json + merges.txt
  assert GPT2Tokenizer(str(slow / "vocab.json"), str(slow / "merges.txt"))(TEXT)["input_ids"] == fast(TEXT)["input_ids"]
  torch.manual_seed(seed)
  cfg = GPT2Config(vocab_size=len(fast), n_positions=64, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0)
  cfg.embd_pdrop = cfg.attn_pdrop = 0.0
  cfg.bos_token_id = cfg.eos_token_id = fast.eos_token_id
  model = GPT2LMHeadModel(cfg).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  model.save_pretrained(out, safe_serialization=True)
  ids = AutoTokenizer.from_pretrained(out)(TEXT)["input_ids"]
  with torch.no_grad():
    logits = model(torch.tensor([ids])).logits
  (out / "text.txt").write_text(TEXT)
  np.save(out / "input_ids.npy", np.asarray([ids], np.int32))
  np.save(out / "logits.npy", logits.numpy().astype(np.float32))
  print(f"{OWN}: vocabulary {len(fast)}, {len(ids)} ids of the text -> {out}")


def check(exported: str, fixture: str) -> None:
  model = GPT2LMHeadModel.from_pretrained(exported).eval()
  ids = torch.from_numpy(np.load(Path(fixture) / "input_ids.npy").astype(np.int64))
  with torch.no_grad():
    logits = model(ids).logits.numpy()
  print(f"max_abs_diff {np.abs(logits - np.load(Path(fixture) / 'logits.npy')).max():.3e}")


if __name__ == "__main__":
  if sys.argv[1:2] == ["--check"]:
    check(sys.argv[2], sys.argv[3])
  else:
    for i, name in enumerate(CONFIGS):
      make(name, seed=i)
    make_own_tokenizer(seed=len(CONFIGS))
