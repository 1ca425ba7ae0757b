r"""Looks inside a trained model: attention maps, the residual stream, the logit lens, contextual
embeddings, and (translation) the cross-attention alignment, as PNG pictures plus JSON numbers.

  python -m launch.probe --workdir=workdirs/shakespeare-char --text="ROMEO: But soft, what light" --out=probes/romeo
  python -m launch.probe --hf=path/to/gpt2 --text="The Eiffel Tower is in" --out=probes/eiffel
  python -m launch.probe --workdir=workdirs/de-en --text="Ich habe keine Zeit." --out=probes/de-en
  python -m launch.probe --workdir=workdirs/shakespeare-char --compare --word=Harry \
      --text="Harry stood at the edge of the Forbidden Forest, his wand gripped tightly in his hand." \
      --text="Prince Harry delivered a heartfelt speech at a star-studded charity gala last night."

Writes into --out: attention.png (layers x heads, rows are queries), residual_norms.png,
logit_lens.png (the top next token read from every layer), inside.json; for a translation also
alignment.png (target x source) and encoder_attention.png. The translation is the model's greedy
one unless --target gives it. --compare prints how alike --word is across the texts at each layer
(cosine similarity of its last token's residual stream; 1 = the same vector) and writes
similarity.json. --heads (a GPT) prints every head's previous-token, duplicate-token and induction
scores on random tokens repeated twice and writes heads.json. The same arrays in Python:
transformer.probes, transformer.interventions.

  python -m launch.probe --workdir=workdirs/shakespeare-char --heads --out=probes/heads
"""

import json
import sys
from pathlib import Path

import numpy as np
from absl import flags

import launch
from transformer import cli, interventions, probes, tokenizers
from transformer.errors import UserError
from transformer.models.gpt import GPT
from transformer.models.hf_gpt2 import import_hf_gpt2

_WORKDIR = flags.DEFINE_string("workdir", None, "A training workdir (launch.train's --workdir).")
_STEP = flags.DEFINE_string("step", "latest", "With --workdir: 'latest', 'best' or a step number.")
_HF = flags.DEFINE_string("hf", None, "Instead of --workdir: Hugging Face GPT-2 safetensors (a directory or file).")
_TOKENIZER = flags.DEFINE_string("tokenizer", "gpt2", "With --hf: the tokenizer.")
_TEXT = flags.DEFINE_multi_string("text", [], "A text (a source sentence for a translation model); repeatable.")
_TARGET = flags.DEFINE_string(
  "target", None, "Translation: the target sentence to probe (default: the model's greedy translation)."
)
_OUT = flags.DEFINE_string(
  "out", "probes", "Where the pictures and numbers go (one subdirectory per text when there are several)."
)
_COMPARE = flags.DEFINE_bool("compare", False, "Print the per-layer similarity of --word across the texts.")
_WORD = flags.DEFINE_string("word", None, "With --compare: the word to follow through the layers.")
_HEADS = flags.DEFINE_bool(
  "heads", False, "Score every head of a GPT as a previous-token, duplicate-token and induction head (no --text)."
)
_ABLATE = flags.DEFINE_list(
  "ablate", [], "With --heads: heads to zero (e.g. L1.H0,L1.H3), for the loss on the repeated tokens without them."
)


def load():
  """(model, params, tokenizer, description) from --workdir or --hf."""
  if (_WORKDIR.value is None) == (_HF.value is None):
    raise UserError("give exactly one of --workdir (a training run) or --hf (GPT-2 safetensors)")
  if _WORKDIR.value:
    trained = launch.restore(_WORKDIR.value, _STEP.value)
    return trained.model, trained.params, trained.tokenizer, f"{_WORKDIR.value} step {trained.step}"
  config, params = import_hf_gpt2(_HF.value)
  launch.say_kernels(config)
  return GPT(config), params, tokenizers.get_tokenizer(_TOKENIZER.value), _HF.value


def compare(model, params, tokenizer, texts: list[str]) -> None:
  if _WORD.value is None or len(texts) < 2:
    raise UserError("--compare needs --word and at least two --text")
  similarity_LxNxN = probes.similarity_by_layer(model, params, tokenizer, texts, _WORD.value)
  print(f"cosine similarity of {_WORD.value!r} (its last token) to text 1's, by layer")
  print("layer     " + "".join(f"  text {j + 1:<3}" for j in range(1, len(texts))))
  for l, sims in enumerate(similarity_LxNxN):
    name = "embed" if l == 0 else f"block {l - 1}"
    print(f"{name:<10}" + "".join(f"  {sims[0, j]:8.4f}" for j in range(1, len(texts))))
  out = Path(_OUT.value)
  out.mkdir(parents=True, exist_ok=True)
  (out / "similarity.json").write_text(
    json.dumps({"word": _WORD.value, "texts": texts, "cosine_LxNxN": similarity_LxNxN.round(6).tolist()}) + "\n"
  )


def heads(model, params) -> None:
  """The head detectors' table (transformer.interventions.head_scores) on 16 rows of random tokens,
  each repeated twice, as long as fits the context (at most 2 x 50); heads.json in --out."""
  if not isinstance(model, GPT):
    raise UserError(f"--heads scores the heads of a GPT; this is a {type(model).__name__}")
  length = min(50, model.config.max_len // 2)
  tokens = interventions.repeated_random_tokens(model.config.vocab_size, length, batch=16)
  scores = {kind: np.asarray(s) for kind, s in interventions.head_scores(model, params, tokens).items()}
  print(f"attention on {length} random tokens repeated twice (1: all of a head's attention there)")
  print(f"{'head':<8}" + "".join(f"{kind:>17}" for kind in scores))
  for l, h in np.ndindex(scores["induction"].shape):
    print(f"{f'L{l}.H{h}':<8}" + "".join(f"{s[l, h]:17.3f}" for s in scores.values()))
  losses = {"all heads": interventions.next_token_losses(model, params, tokens)}
  if _ABLATE.value:
    heads_ = [_head(name, *scores["induction"].shape) for name in _ABLATE.value]
    patches = interventions.ablating(heads_, scores["induction"].shape[1])
    losses[f"without {','.join(_ABLATE.value)}"] = interventions.next_token_losses(model, params, tokens, patches)
  for what, nll_T in losses.items():  # position t predicts token t + 1; the second copy's first token is random
    first, second = float(nll_T[: length - 1].mean()), float(nll_T[length:].mean())
    print(f"loss ({what}): first copy {first:.3f} nats a token, second copy {second:.3f}")
  out = Path(_OUT.value)
  out.mkdir(parents=True, exist_ok=True)
  (out / "heads.json").write_text(json.dumps({k: s.round(6).tolist() for k, s in scores.items()}) + "\n")


def _head(name: str, num_layers: int, num_heads: int) -> tuple[int, int]:
  """ "L1.H0" -> (1, 0), refused naming the model's range when it is not a head of this model."""
  try:
    layer, head = (int(part[1:]) for part in name.upper().split("."))
    if not (0 <= layer < num_layers and 0 <= head < num_heads):
      raise ValueError
  except ValueError:
    raise UserError(
      f"--ablate={name!r} is not a head of this model: write L<layer>.H<head> with layer < {num_layers} "
      f"and head < {num_heads}, e.g. L0.H1"
    ) from None
  return layer, head


def main(argv):
  del argv
  texts = list(_TEXT.value)
  if not texts and not _HEADS.value:
    raise UserError("give a --text to probe (or --heads)")
  model, params, tokenizer, source = load()
  print(f"# {source}", file=sys.stderr)
  if _HEADS.value:
    heads(model, params)
    return
  if _COMPARE.value:
    compare(model, params, tokenizer, texts)
    return
  for i, text in enumerate(texts):
    inside = probes.look_inside(model, params, tokenizer, text, target=_TARGET.value)
    if inside.translation is not None:
      print(f"translation (greedy): {inside.translation}")
    out = Path(_OUT.value) / str(i + 1) if len(texts) > 1 else Path(_OUT.value)
    for path in probes.write_pictures(inside, tokenizer, out):
      print(path)
    last = [row[-1][0] for row in inside.lens_top(1, tokenizer)]
    print("logit lens at the last position, by layer: " + ", ".join(f"{t!r} ({p:.2f})" for t, p in last))


if __name__ == "__main__":
  cli.run(main)
