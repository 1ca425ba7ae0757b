"""Seeing inside a trained model: attention maps, the residual stream, the logit lens, contextual
embeddings, and a translation's cross-attention alignment.

    >>> inside = probes.look_inside(model, params, tokenizer, "ROMEO: But soft")
    >>> inside.attention_LxHxTxT[layer, head]       # rows are probabilities over the earlier tokens
    >>> inside.residual_LxTxD                      # after the embeddings (row 0) and after each block
    >>> inside.lens_top                            # per layer and position: the top tokens of the logit lens
    >>> probes.similarity_by_layer(model, params, tokenizer, ["Harry stood ...", "Prince Harry ..."], "Harry")

Each is read at the models' named points (`layers.point`; transformer.interp.interventions reads and
changes them): `pattern`, `resid_pre` and `resid_post`, recorded only when a run asks for them, so
training is unchanged. Reading them takes attention's readable path (einsum), whatever the model's
implementation. `launch.probe` draws the pictures.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.errors import UserError
from transformer.generation import beam_search
from transformer.generation.common import round_up
from transformer.interp import interventions
from transformer.models.gpt import GPT
from transformer.models.seq2seq import Transformer


@dataclasses.dataclass
class Inside:
  """What one forward pass shows, for one sequence (numpy arrays; L layers, H heads, T tokens)."""

  tokens: list[str]  # each token as text
  attention_LxHxTxT: np.ndarray  # (self-)attention probabilities, rows sum to 1
  residual_LxTxD: np.ndarray  # L + 1 rows: after the embeddings, then after each block
  lens_LxTxV: np.ndarray  # the final norm and head applied to each residual (log-probabilities)
  logits_TxV: np.ndarray  # the model's own output
  # Translation only: the source tokens and the decoder's cross-attention (L x H x T x S).
  source_tokens: list[str] = dataclasses.field(default_factory=list)
  cross_attention_LxHxTxS: np.ndarray | None = None
  encoder_attention_LxHxSxS: np.ndarray | None = None
  translation: str | None = None  # the model's own greedy translation, probed when no target was given

  def lens_top(self, k: int = 3, tokenizer=None) -> list[list[list[tuple[str, float]]]]:
    """Per layer, per position: the k most likely next tokens of the logit lens, with probabilities."""
    top = np.argsort(-self.lens_LxTxV, axis=-1)[..., :k]
    decode = (lambda i: tokenizer.decode([int(i)])) if tokenizer is not None else str
    return [
      [[(decode(i), float(np.exp(self.lens_LxTxV[l, t, i]))) for i in top[l, t]] for t in range(top.shape[1])]
      for l in range(top.shape[0])
    ]


def token_texts(tokenizer, ids) -> list[str]:
  """Each token's text; a special token's name (a Marian tokenizer decodes those to nothing)."""
  names = {i: name for name, i in tokenizer.special_tokens.items()}
  return [names.get(int(i)) or tokenizer.decode([int(i)]) for i in ids]


READ_BUCKET = 16  # a text's tokens are padded up to a multiple of this: few lengths compile


def _read(model, params, *inputs: list[int]) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
  """One sequence's run (a GPT's tokens, or an encoder-decoder's source and target): its output
  (logits, T x V), its blocks' points by name (L x ..., the batch axis gone) and the logit lens of its
  residual stream (log-probabilities, L + 1 x T x V: the embeddings, then each block).

  One compiled run (interventions.run_with_cache) on the tokens padded at the end to a multiple of
  READ_BUCKET, then cut back: every earlier position is blind to what follows it (causal attention;
  a source's padding is masked), so texts of many lengths share a few programs where a run per
  length, or eager ops, would compile each anew."""
  pads = []
  for tokens in inputs:
    padded = min(round_up(len(tokens), READ_BUCKET), model.config.max_len)
    pads.append(jnp.asarray([list(tokens) + [0] * (padded - len(tokens))], jnp.int32))
  # Each point's real lengths: a block's stream (T), an attention pattern's (queries, keys).
  if isinstance(model, GPT):
    [T], stream, kwargs = map(len, inputs), "", {}
    lengths = {"pattern": (T, T), "resid_pre": T, "resid_post": T}
  else:
    [S, T], stream = map(len, inputs), "decoder."
    kwargs = {"source_valid_BxS": jnp.arange(pads[0].shape[1])[None] < S}
    lengths = {"decoder.pattern": (T, T), "decoder.cross_attn.pattern": (T, S), "encoder.pattern": (S, S)}
    lengths |= {"decoder.resid_pre": T, "decoder.resid_post": T}
  output, cache = interventions.run_with_cache(model, params, *pads, names=tuple(lengths), **kwargs)
  points = {}
  for name, n in lengths.items():
    x = np.asarray(cache[name][:, 0])
    points[name] = x[..., : n[0], : n[1]] if isinstance(n, tuple) else x[:, :n]
  lens = np.asarray(_lens(model, params, cache[stream + "resid_pre"], cache[stream + "resid_post"]))
  return np.asarray(output[0, :T]), points, lens[:, :T]


@functools.partial(jax.jit, static_argnames="model")
def _lens(model, params, resid_pre_LxBxTxD, resid_post_LxBxTxD):
  """The logit lens of one sequence's residual stream: the embeddings, then each block's output."""
  residual_LxTxD = jnp.concatenate([resid_pre_LxBxTxD[:1, 0], resid_post_LxBxTxD[:, 0]])
  return jax.nn.log_softmax(model.apply({"params": params}, residual_LxTxD, method="output_logits"), axis=-1)


def look_inside(model, params, tokenizer, text: str, *, target: str | None = None) -> Inside:
  """One text through a GPT, or a source sentence and its translation through an encoder-decoder
  (`target`, or else the model's greedy translation, kept in `Inside.translation`): attention,
  residual stream, logit lens, output."""
  params = nn.unbox(params)
  if not isinstance(model, (GPT, Transformer)):
    raise UserError(
      f"probes read the attention and residual stream of a GPT or an encoder-decoder; this is a {type(model).__name__}"
    )
  if isinstance(model, Transformer):
    if target is not None:
      return _look_inside_seq2seq(model, params, tokenizer, text, target)
    [translation] = beam_search.translate_texts(model, params, tokenizer, [text], beam_size=1)
    return dataclasses.replace(
      _look_inside_seq2seq(model, params, tokenizer, text, translation), translation=translation
    )
  ids = encode(model, tokenizer, text)
  logits_TxV, point, lens = _read(model, params, ids)
  residual = np.concatenate([point["resid_pre"][:1], point["resid_post"]])  # the embeddings, then each block's
  return Inside(token_texts(tokenizer, ids), point["pattern"], residual, lens, logits_TxV)


def _look_inside_seq2seq(model: Transformer, params, tokenizer, source: str, target: str) -> Inside:
  source_ids = tokenizer.encode(source.strip())  # as training and translation feed it (Marian: ending in </s>)
  # The decoder's input: its start token (<eot>; Marian's <pad>), then the target's tokens.
  target_ids = [tokenizer.decoder_start_id] + tokenizer.encode_target(target.strip())
  _check_vocabulary(source_ids + target_ids, model.config.vocab_size)
  logits_TxV, point, lens = _read(model, params, source_ids, target_ids)
  residual = np.concatenate([point["decoder.resid_pre"][:1], point["decoder.resid_post"]])
  return Inside(
    token_texts(tokenizer, target_ids),
    point["decoder.pattern"],
    residual,
    lens,
    logits_TxV,
    token_texts(tokenizer, source_ids),
    point["decoder.cross_attn.pattern"],
    point["encoder.pattern"],
  )


def encode(model: GPT, tokenizer, text: str) -> list[int]:
  """`text`'s tokens for a GPT (an empty text: <eot>), refused when the tokenizer is not the model's
  or the text does not fit its context."""
  ids = tokenizer.encode(text) or [tokenizer.eot_id]
  _check_vocabulary(ids, model.config.vocab_size)
  if len(ids) > model.config.max_len:
    raise UserError(
      f"the text is {len(ids)} tokens, longer than the model's context of {model.config.max_len}; probe a shorter one"
    )
  return ids


def _check_vocabulary(ids: list[int], vocab_size: int) -> None:
  if max(ids) >= vocab_size:
    raise UserError(
      f"the text has token id {max(ids)}, beyond the model's vocabulary of {vocab_size}: the "
      f"tokenizer is not the model's (with --hf, pass its --tokenizer)"
    )


def word_position(tokenizer, text: str, word: str) -> int:
  """The index of the last token of the first occurrence of `word` in `text` (in a causal model, the
  first position whose state has read the whole word)."""
  start = text.find(word)
  if start < 0:
    raise UserError(f"{word!r} does not occur in {text!r}")
  end = start + len(word)
  ids, chars = tokenizer.encode(text), 0
  added = len(ids) - len(tokenizer.encode_piece(text))  # a BOS the tokenizer puts first (HFTokenizer)
  for i in range(added, len(ids)):
    chars = len(tokenizer.decode(ids[added : i + 1]))
    if chars >= end:
      return i
  return len(ids) - 1


def contextual_embeddings(model: GPT, params, tokenizer, texts: list[str], word: str) -> np.ndarray:
  """N x (L + 1) x D: the residual stream at `word` (its last token) in each text, at every layer."""
  if not isinstance(model, GPT):
    raise UserError(f"contextual embeddings follow a word through a GPT's layers; this is a {type(model).__name__}")
  rows = []
  for text in texts:
    inside = look_inside(model, params, tokenizer, text)
    rows.append(inside.residual_LxTxD[:, word_position(tokenizer, text, word)])
  return np.stack(rows)


def cosine_by_layer(embeddings_NxLxD: np.ndarray) -> np.ndarray:
  """L x N x N cosine similarities between the texts' embeddings of the word, layer by layer."""
  unit = embeddings_NxLxD / np.maximum(np.linalg.norm(embeddings_NxLxD, axis=-1, keepdims=True), 1e-12)
  return np.einsum("ild,jld->lij", unit, unit)


def similarity_by_layer(model: GPT, params, tokenizer, texts: list[str], word: str) -> np.ndarray:
  """L x N x N: how alike `word` is across `texts` at each depth (1: the same vector)."""
  return cosine_by_layer(contextual_embeddings(model, params, tokenizer, texts, word))


def as_json(inside: Inside, tokenizer, k: int = 5) -> dict[str, Any]:
  """The numbers of `inside` as plain JSON."""
  out = {
    "tokens": inside.tokens,
    "attention": inside.attention_LxHxTxT.round(5).tolist(),
    "residual_norms": np.linalg.norm(inside.residual_LxTxD, axis=-1).round(4).tolist(),
    "logit_lens_top": inside.lens_top(k, tokenizer),
  }
  if inside.cross_attention_LxHxTxS is not None:
    out.update(source_tokens=inside.source_tokens, cross_attention=inside.cross_attention_LxHxTxS.round(5).tolist())
  return out


# ---------------------------------------------------------------------------------------------
# Pictures (matplotlib, written as PNG).


def pyplot():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def _label(tokens: list[str]) -> list[str]:
  return [repr(t)[1:-1] if t.strip() else repr(t) for t in tokens]  # newlines and spaces made visible


def draw_attention(attention_LxHxTxS: np.ndarray, queries: list[str], keys: list[str], path, title: str) -> None:
  """A grid of heat maps, layers down and heads across; each row of a map is a query's probabilities."""
  plt = pyplot()
  L, H, T, S = attention_LxHxTxS.shape
  size = max(1.6, min(4.0, 0.16 * max(T, S)))
  fig, axes = plt.subplots(L, H, figsize=(size * H + 1, size * L + 1), squeeze=False)
  ticks = max(T, S) <= 48  # token labels while they are legible
  for l in range(L):
    for h in range(H):
      ax = axes[l, h]
      ax.imshow(attention_LxHxTxS[l, h], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
      ax.set_title(f"layer {l} head {h}", fontsize=8)
      ax.set_xticks(range(S) if ticks else [])
      ax.set_yticks(range(T) if ticks else [])
      if ticks:
        ax.set_xticklabels(_label(keys), rotation=90, fontsize=6)
        ax.set_yticklabels(_label(queries), fontsize=6)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def draw_residual_norms(residual_LxTxD: np.ndarray, tokens: list[str], path) -> None:
  """The residual stream's norm at every position, after the embeddings and after each block."""
  plt = pyplot()
  norms_LxT = np.linalg.norm(residual_LxTxD, axis=-1)
  fig, ax = plt.subplots(figsize=(7, 4))
  for t in range(norms_LxT.shape[1]):
    ax.plot(range(norms_LxT.shape[0]), norms_LxT[:, t], lw=1, alpha=0.6)
  ax.plot(range(norms_LxT.shape[0]), norms_LxT.mean(axis=1), "k-o", lw=2, label="mean over positions")
  ax.set_xticks(range(norms_LxT.shape[0]))
  ax.set_xticklabels(["embed"] + [f"block {i}" for i in range(norms_LxT.shape[0] - 1)])
  ax.set_ylabel("‖residual‖")
  ax.set_title(f"residual stream norms, {len(tokens)} tokens")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def draw_logit_lens(inside: Inside, tokenizer, path, max_positions: int = 24) -> None:
  """A table, layers down and positions across: the logit lens's top next token, shaded by its probability."""
  plt = pyplot()
  top = inside.lens_top(1, tokenizer)
  T = min(len(inside.tokens), max_positions)
  first = len(inside.tokens) - T
  probs_LxT = np.array([[row[t][0][1] for t in range(first, first + T)] for row in top])
  fig, ax = plt.subplots(figsize=(0.7 * T + 2, 0.5 * len(top) + 1.5))
  ax.imshow(probs_LxT, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
  for l, row in enumerate(top):
    for t in range(T):
      ax.text(
        t,
        l,
        _label([row[first + t][0][0]])[0],
        ha="center",
        va="center",
        fontsize=7,
        color="white" if probs_LxT[l, t] > 0.6 else "black",
      )
  ax.set_xticks(range(T))
  ax.set_xticklabels(_label(inside.tokens[first:]), rotation=90, fontsize=7)
  ax.set_yticks(range(len(top)))
  ax.set_yticklabels(["embed"] + [f"block {i}" for i in range(len(top) - 1)])
  ax.set_title("logit lens: the most likely next token read from each layer (shade: its probability)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def draw_alignment(inside: Inside, path) -> None:
  """The decoder's cross-attention, averaged over heads and layers: which source tokens each target
  token looked at (a soft word alignment)."""
  plt = pyplot()
  align_TxS = inside.cross_attention_LxHxTxS.mean(axis=(0, 1))
  T, S = align_TxS.shape
  fig, ax = plt.subplots(figsize=(0.35 * S + 2, 0.35 * T + 2))
  ax.imshow(align_TxS, cmap="Greys", vmin=0.0, aspect="auto")
  ax.set_xticks(range(S))
  ax.set_xticklabels(_label(inside.source_tokens), rotation=90, fontsize=7)
  ax.set_yticks(range(T))
  ax.set_yticklabels(_label(inside.tokens), fontsize=7)
  ax.set_xlabel("source")
  ax.set_ylabel("target (the decoder's input)")
  ax.set_title("cross-attention alignment (mean over layers and heads)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def draw_logit_attribution(contribution: dict[str, float], path, title: str) -> None:
  """One bar per component (`ActivationCache.direct_logit_attribution` at one position), in the
  model's order: embeddings, then each layer's heads and MLP; the bars sum to the logit."""
  plt = pyplot()
  names, values = list(contribution), np.array(list(contribution.values()))
  fig, ax = plt.subplots(figsize=(7, 0.22 * len(names) + 1.5))
  ax.barh(range(len(names)), values, color=np.where(values >= 0, "tab:blue", "tab:red"))
  ax.set_yticks(range(len(names)))
  ax.set_yticklabels(names, fontsize=7)
  ax.invert_yaxis()
  ax.axvline(0.0, color="black", lw=0.8)
  ax.set_xlabel(f"direct contribution (sum {values.sum():.3f})")
  ax.set_title(title, fontsize=9)
  ax.grid(axis="x", alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def draw_patching(maps: dict[str, np.ndarray], columns: dict[str, list[str]], path, title: str) -> None:
  """Heat maps one above the other, layers down: each map's name -> an L x C array (e.g. the residual
  stream's layer x position effects of patching, then attribution patching's estimate of them), with
  `columns[name]` labelling its columns. Red: the patch moves the metric up; blue: down."""
  plt = pyplot()
  width = 0.3 * max(m.shape[1] for m in maps.values()) + 3
  heights = [0.35 * m.shape[0] + 1.4 for m in maps.values()]
  fig, axes = plt.subplots(len(maps), 1, figsize=(width, sum(heights) + 0.6), height_ratios=heights, squeeze=False)
  for ax, (name, map_LxC) in zip(axes[:, 0], maps.items()):
    bound = float(np.abs(map_LxC).max()) or 1.0
    image = ax.imshow(map_LxC, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
    ax.set_xticks(range(map_LxC.shape[1]))
    ax.set_xticklabels(_label(columns[name]), rotation=90 if map_LxC.shape[1] > 12 else 0, fontsize=7)
    ax.set_yticks(range(map_LxC.shape[0]))
    ax.set_yticklabels([f"layer {l}" for l in range(map_LxC.shape[0])], fontsize=7)
    ax.set_title(name, fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.02, pad=0.01)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def write_pictures(inside: Inside, tokenizer, out_dir) -> list:
  """All pictures of `inside` and its numbers (inside.json) into `out_dir`; returns the paths."""
  import json
  from pathlib import Path

  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = [out / "attention.png", out / "residual_norms.png", out / "logit_lens.png", out / "inside.json"]
  what = "decoder self-attention" if inside.cross_attention_LxHxTxS is not None else "attention"
  draw_attention(inside.attention_LxHxTxT, inside.tokens, inside.tokens, paths[0], f"{what}: rows are queries")
  draw_residual_norms(inside.residual_LxTxD, inside.tokens, paths[1])
  draw_logit_lens(inside, tokenizer, paths[2])
  paths[3].write_text(json.dumps(as_json(inside, tokenizer)) + "\n")
  if inside.cross_attention_LxHxTxS is not None:
    paths.append(out / "alignment.png")
    draw_alignment(inside, paths[-1])
    paths.append(out / "encoder_attention.png")
    draw_attention(
      inside.encoder_attention_LxHxSxS,
      inside.source_tokens,
      inside.source_tokens,
      paths[-1],
      "encoder self-attention: rows are queries",
    )
  return paths
