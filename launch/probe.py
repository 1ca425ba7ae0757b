r"""Looks inside a trained model: attention maps, the residual stream, the logit lens, contextual
embeddings, and (translation) the cross-attention alignment, as PNG pictures plus JSON numbers.

  python -m launch.probe --workdir=workdirs/shakespeare-char --text="ROMEO: But soft, what light" --out=probes/romeo
  python -m launch.probe --hf=path/to/gpt2 --text="The Eiffel Tower is in" --out=probes/eiffel
  python -m launch.probe --workdir=workdirs/de-en --text="Ich habe keine Zeit." --out=probes/de-en
  python -m launch.probe --hf=path/to/opus-mt-de-en --text="Ich habe keine Zeit." --out=probes/opus
  python -m launch.probe --workdir=workdirs/shakespeare-char --compare --word=Harry \
      --text="Harry stood at the edge of the Forbidden Forest, his wand gripped tightly in his hand." \
      --text="Prince Harry delivered a heartfelt speech at a star-studded charity gala last night."

Writes into --out: attention.png (layers x heads, rows are queries), residual_norms.png,
logit_lens.png (the top next token read from every layer), inside.json; for a translation also
alignment.png (target x source) and encoder_attention.png. The translation is the model's greedy
one unless --target gives it. --compare prints how alike --word is across the texts at each layer
(cosine similarity of its last token's residual stream; 1 = the same vector) and writes
similarity.json. --heads (a GPT) prints every head's previous-token, duplicate-token and induction
scores on random tokens repeated twice and writes heads.json; with --ablate, the loss on those tokens
without the heads named. --attribute splits the --target token's logit (minus --versus's) after each
--text into the direct contributions of the embeddings, every head and every MLP (attribution.png).
--patch runs the --corrupt text with each layer x position of the residual stream, and each layer x
head, taken from the --clean one, and draws what each does to the --target's log-probability (or
logit difference) beside attribution patching's estimate (patching.png). The same in Python:
transformer.probes, transformer.interventions.

  python -m launch.probe --workdir=workdirs/shakespeare-char --heads --ablate=L1.H0 --ablation=mean
  python -m launch.probe --workdir=workdirs/shakespeare-char --attribute --text="ROMEO: O Juli" --target=e
  python -m launch.probe --workdir=workdirs/shakespeare-char --patch --target=e --versus=a \
      --clean="ROMEO: O Juliet! JULIET: O Romeo! ROMEO: O Juli" \
      --corrupt="ROMEO: O Julian! JULIAN: O Romeo! ROMEO: O Juli"
"""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

import launch
from transformer import cli, inference, interventions, probes
from transformer.errors import UserError
from transformer.models.gpt import GPT

_MODEL = launch.ModelFlags(
  "A training workdir (launch.train's --workdir).",
  hf_help="Instead of --workdir: Hugging Face GPT-2 safetensors (a directory or file), or a Marian model's directory.",
)
_TEXT = flags.DEFINE_multi_string("text", [], "A text (a source sentence for a translation model); repeatable.")
_TARGET = flags.DEFINE_string(
  "target",
  None,
  "Translation: the target sentence to probe (default: the model's greedy translation). With --attribute "
  "or --patch: the next token whose logit is explained (one token, e.g. ' Juliet').",
)
_VERSUS = flags.DEFINE_string(
  "versus", None, "With --attribute or --patch: a second token; the logit difference target - versus is explained."
)
_OUT = flags.DEFINE_string(
  "out",
  "probes",
  "Where the pictures and numbers go (one subdirectory per text when there are several); by default "
  "probes/ in the directory the program runs in.",
)
_COMPARE = flags.DEFINE_bool("compare", False, "Print the per-layer similarity of --word across the texts.")
_WORD = flags.DEFINE_string("word", None, "With --compare: the word to follow through the layers.")
_HEADS = flags.DEFINE_bool(
  "heads", False, "Score every head of a GPT as a previous-token, duplicate-token and induction head (no --text)."
)
_ABLATION = flags.DEFINE_enum(
  "ablation",
  "zero",
  ["zero", "mean"],
  "With --ablate: zero the heads' outputs, or set them to their mean over other random tokens.",
)
_ATTRIBUTE = flags.DEFINE_bool(
  "attribute", False, "A GPT: the --target logit at the --text's last position, split into each component's share."
)
_PATCH = flags.DEFINE_bool(
  "patch", False, "A GPT: activation patching from --clean into --corrupt, by layer x position and layer x head."
)
_CLEAN = flags.DEFINE_string("clean", None, "With --patch: the clean text.")
_CORRUPT = flags.DEFINE_string("corrupt", None, "With --patch: the corrupted text, as many tokens as --clean.")
_ABLATE = flags.DEFINE_list(
  "ablate", [], "With --heads: heads to zero (e.g. L1.H0,L1.H3), for the loss on the repeated tokens without them."
)


def load():
  """(model, params, tokenizer, description, the run's validation tokens or None) from --workdir or --hf."""
  trained = _MODEL.load()
  validation = None
  if _MODEL.workdir.value and trained.run.task == "lm":
    validation = inference.split_task(trained, _MODEL.workdir.value).data.tokens("validation")
  return trained.model, trained.params, trained.tokenizer, trained.source, validation


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


def heads(model, params, validation=None) -> None:
  """The head detectors' table (transformer.interventions.head_scores) on 16 rows of random tokens,
  each repeated twice, as long as fits the context (at most 2 x 50); heads.json in --out. With
  --ablate, the loss on those tokens (and on the run's validation text, when there is one) without
  the heads named."""
  if not isinstance(model, GPT):
    raise UserError(f"--heads scores the heads of a GPT; this is a {type(model).__name__}")
  length = min(50, model.config.max_len // 2)
  ids = None if validation is None else np.unique(np.asarray(validation[:100_000]))  # tokens the text has
  tokens = interventions.repeated_random_tokens(model.config.vocab_size, length, batch=16, ids=ids)
  scores = {kind: np.asarray(s) for kind, s in interventions.head_scores(model, params, tokens).items()}
  print(f"attention on {length} random tokens repeated twice (1: all of a head's attention there)")
  print(f"{'head':<8}" + "".join(f"{kind:>17}" for kind in scores))
  for l, h in np.ndindex(scores["induction"].shape):
    print(f"{f'L{l}.H{h}':<8}" + "".join(f"{s[l, h]:17.3f}" for s in scores.values()))
  runs = {"all heads": None}
  if _ABLATE.value:
    heads_ = [_head(name, *scores["induction"].shape) for name in _ABLATE.value]
    mean_z = None
    if _ABLATION.value == "mean":  # each head's mean output over other random tokens repeated (seed 1)
      reference = interventions.repeated_random_tokens(model.config.vocab_size, length, batch=16, seed=1, ids=ids)
      mean_z = interventions.run_with_cache(model, params, reference, names=("z",))[1]["z"]
    patches = interventions.ablating(heads_, scores["induction"].shape[1], mean_z)
    runs[f"without {','.join(_ABLATE.value)} ({_ABLATION.value} ablation)"] = patches
  for what, patches in runs.items():  # position t predicts token t + 1; the second copy's first token is random
    nll_T = interventions.next_token_losses(model, params, tokens, patches)
    first, second = float(nll_T[: length - 1].mean()), float(nll_T[length:].mean())
    line = f"loss ({what}): first copy {first:.3f} nats a token, second copy {second:.3f}"
    if validation is not None:
      line += f", validation {_validation_loss(model, params, validation, patches):.3f}"
    print(line)
  out = Path(_OUT.value)
  out.mkdir(parents=True, exist_ok=True)
  (out / "heads.json").write_text(json.dumps({k: s.round(6).tolist() for k, s in scores.items()}) + "\n")


def _validation_loss(model, params, validation, patches, rows: int = 64) -> float:
  """The mean next-token loss on the first `rows` windows of the validation tokens, each as long as the context."""
  T = model.config.max_len
  count = min(rows, len(validation) // T)
  windows_BxT = jnp.asarray(np.asarray(validation[: count * T], np.int32).reshape(count, T))
  return float(interventions.next_token_losses(model, params, windows_BxT, patches).mean())


def _gpt(model, verb: str) -> None:
  if not isinstance(model, GPT):
    raise UserError(f"--{verb} works on a GPT's heads and residual stream; this is a {type(model).__name__}")


def _one_token(tokenizer, text: str, flag: str) -> int:
  ids = tokenizer.encode(text)
  if len(ids) != 1:
    pieces = [tokenizer.decode([i]) for i in ids]
    raise UserError(
      f"--{flag}={text!r} is {len(ids)} tokens for this tokenizer {pieces}; give one token (with GPT-2's, a "
      f"word usually starts with its space: ' Juliet')"
    )
  return ids[0]


def _answer(tokenizer) -> tuple[int, int | None, str]:
  """The --target token, the --versus token (or None) and what the metric is, in words."""
  if _TARGET.value is None:
    raise UserError("--attribute and --patch explain the logit of a --target token (and optionally --versus)")
  target = _one_token(tokenizer, _TARGET.value, "target")
  if _VERSUS.value is None:
    return target, None, f"logit of {_TARGET.value!r}"
  return target, _one_token(tokenizer, _VERSUS.value, "versus"), f"logit {_TARGET.value!r} - logit {_VERSUS.value!r}"


def attribute(model, params, tokenizer, text: str, out: Path) -> None:
  """The --target logit (or target - versus) at the text's last position, split into the direct
  contributions of the embeddings, every head and every MLP (interventions.direct_logit_attribution);
  attribution.png and attribution.json in `out`."""
  _gpt(model, "attribute")
  tokens_1xT = jnp.asarray([probes.encode(model, tokenizer, text)])
  target, versus, what = _answer(tokenizer)

  def last(token):
    at_1xT = jnp.full_like(tokens_1xT, token)
    return {
      k: float(x[0, -1]) for k, x in interventions.direct_logit_attribution(model, params, tokens_1xT, at_1xT).items()
    }

  share = last(target)
  if versus is not None:
    share = {k: v - u for (k, v), u in zip(share.items(), last(versus).values())}
  logits_V = interventions.run_with_cache(model, params, tokens_1xT, names=())[0][0, -1]
  logit = float(logits_V[target] - (0.0 if versus is None else logits_V[versus]))
  capped = " (the model's, soft-capped; the sum is before the cap)" if model.config.logits_softcap else ""
  print(f"{what} after {text!r}: {logit:.3f}{capped}; the components' sum {sum(share.values()):.3f}")
  for name, value in sorted(share.items(), key=lambda kv: -abs(kv[1]))[:12]:
    print(f"  {name:<18}{value:9.3f}")
  out.mkdir(parents=True, exist_ok=True)
  probes.draw_logit_attribution(share, out / "attribution.png", f"{what} after {text[-40:]!r}")
  (out / "attribution.json").write_text(
    json.dumps({"text": text, "metric": what, "logit": logit, "share": share}) + "\n"
  )
  print(out / "attribution.png")


def patch(model, params, tokenizer) -> None:
  """Activation patching from --clean into --corrupt (interventions.patching_sweep), the residual
  stream by layer x position and the heads by layer x head, beside attribution patching's estimate of
  the same; the metric is --target's log-probability (or its logit minus --versus's) at the last
  position. patching.png and patching.json in --out."""
  _gpt(model, "patch")
  if not (_CLEAN.value and _CORRUPT.value):
    raise UserError("--patch needs a --clean and a --corrupt text (and a --target token)")
  clean, corrupt = (probes.encode(model, tokenizer, text) for text in (_CLEAN.value, _CORRUPT.value))
  if len(clean) != len(corrupt):
    raise UserError(
      f"--clean is {len(clean)} tokens and --corrupt {len(corrupt)}: patching pairs their positions, so give "
      f"texts of as many tokens (change a word for another of as many tokens)"
    )
  target, versus, what = _answer(tokenizer)
  if versus is None:  # a logit alone moves with every logit; its log-probability says what patching changed
    what = f"log-probability of {_TARGET.value!r}"

  def metric(logits_BxTxV):
    last_V = logits_BxTxV[0, -1]
    return jax.nn.log_softmax(last_V)[target] if versus is None else last_V[target] - last_V[versus]

  clean_1xT, corrupt_1xT = jnp.asarray([clean]), jnp.asarray([corrupt])
  runs = {
    name: float(metric(interventions.run_with_cache(model, params, x, names=())[0]))
    for name, x in (("clean", clean_1xT), ("corrupt", corrupt_1xT))
  }
  print(f"{what}: clean {runs['clean']:.3f}, corrupt {runs['corrupt']:.3f}")
  maps, columns = {}, {}
  labels = [
    c if c == d else f"{c}/{d}"
    for c, d in zip(probes.token_texts(tokenizer, clean), probes.token_texts(tokenizer, corrupt))
  ]
  for over, cols in (("positions", labels), ("heads", [f"H{h}" for h in range(model.config.block.num_heads)])):
    swept = interventions.patching_sweep(model, params, clean_1xT, corrupt_1xT, metric, over=over)
    estimated = interventions.attribution_patching(model, params, clean_1xT, corrupt_1xT, metric, over=over)
    name = "resid_pre" if over == "positions" else "z"
    maps[f"patched {name}, layer x {over[:-1]}"] = np.asarray(swept) - runs["corrupt"]
    maps[f"attribution patching, {name}"] = np.asarray(estimated)
    columns.update(dict.fromkeys(list(maps)[-2:], cols))
  for name, map_LxC in maps.items():
    l, c = np.unravel_index(np.abs(map_LxC).argmax(), map_LxC.shape)
    print(f"  {name}: largest effect {map_LxC[l, c]:+.3f} at layer {l}, {columns[name][c]!r}")
  out = Path(_OUT.value)
  out.mkdir(parents=True, exist_ok=True)
  probes.draw_patching(maps, columns, out / "patching.png", f"effect on the {what} of patching clean into corrupt")
  (out / "patching.json").write_text(
    json.dumps(
      {"metric": what, "runs": runs, "columns": columns, "maps": {k: v.round(6).tolist() for k, v in maps.items()}}
    )
    + "\n"
  )
  print(out / "patching.png")


# The verbs: what a run of the program does (without one, it looks inside each --text).
_VERBS = {"compare": _COMPARE, "heads": _HEADS, "attribute": _ATTRIBUTE, "patch": _PATCH}


def _head(name: str, num_layers: int | None = None, num_heads: int | None = None) -> tuple[int, int]:
  """ "L1.H0" -> (1, 0), refused naming the model's range (when given) when it is not a head of this model."""
  try:
    layer, head = (int(part[1:]) for part in name.upper().split("."))
    if num_layers is not None and not (0 <= layer < num_layers and 0 <= head < num_heads):
      raise ValueError
  except ValueError:
    limits = "" if num_layers is None else f" with layer < {num_layers} and head < {num_heads}"
    raise UserError(
      f"--ablate={name!r} is not a head of this model: write L<layer>.H<head>{limits}, e.g. L0.H1"
    ) from None
  return layer, head


def _check_verbs() -> None:
  """One verb a run, and the flags of another verb only with it: refused before a model loads."""
  verbs = [name for name, flag in _VERBS.items() if flag.value]
  if len(verbs) > 1:
    raise UserError(f"give one of {', '.join('--' + v for v in _VERBS)} at a time, not {' and '.join(verbs)}")
  if _ABLATE.value and not _HEADS.value:
    raise UserError("--ablate names heads to remove while --heads scores them: give --heads with it")
  for name in _ABLATE.value:
    _head(name)  # the form now; the model's range once it is loaded


def main(argv):
  del argv
  texts = list(_TEXT.value)
  _check_verbs()
  if not texts and not (_HEADS.value or _PATCH.value):
    raise UserError("give a --text to probe (or --heads, or --patch with --clean and --corrupt)")
  model, params, tokenizer, source, validation = load()
  print(f"# {source}", file=sys.stderr)
  if _HEADS.value:  # before any table prints: a head this model does not have
    for name in _ABLATE.value:
      _head(name, model.config.num_layers, model.config.block.num_heads)
  if _HEADS.value:
    heads(model, params, validation)
    return
  if _PATCH.value:
    patch(model, params, tokenizer)
    return
  if _COMPARE.value:
    compare(model, params, tokenizer, texts)
    return
  for i, text in enumerate(texts):
    out = Path(_OUT.value) / str(i + 1) if len(texts) > 1 else Path(_OUT.value)
    if _ATTRIBUTE.value:
      attribute(model, params, tokenizer, text, out)
      continue
    inside = probes.look_inside(model, params, tokenizer, text, target=_TARGET.value)
    if inside.translation is not None:
      print(f"translation (greedy): {inside.translation}")
    for path in probes.write_pictures(inside, tokenizer, out):
      print(path)
    last = [row[-1][0] for row in inside.lens_top(1, tokenizer)]
    print("logit lens at the last position, by layer: " + ", ".join(f"{t!r} ({p:.2f})" for t, p in last))


if __name__ == "__main__":
  cli.run(main)
