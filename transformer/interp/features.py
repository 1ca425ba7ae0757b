"""Reading a sparse autoencoder's latents as features: for each latent, the held-out contexts that
activate it most (each token shaded by its activation), its activation histogram, its density, and
the tokens its decoder direction promotes and suppresses through the model's unembedding (the
direct path, as SAELens's dashboards show it); and for a text, which latents fire on each token.

`feature_pages` writes one self-contained HTML page (styles inline, histograms as embedded PNGs: it
opens from disk, in a browser or a notebook's IFrame) plus the PNGs and a JSON of the numbers.

    >>> report = feature_pages(sae, sae_params, source, tokenizer, out=Path("features/char"))
    >>> report.latents[0].top_contexts[0]        # [(token text, activation), ...]
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from transformer.errors import UserError
from transformer.interp import probes
from transformer.interp.activations import ModelActivations
from transformer.models import gpt
from transformer.models.sae import SAE

# The points in the residual stream's basis, whose directions the unembedding reads.
RESIDUAL_POINTS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "mlp_in", "embed", "pos_embed")


@dataclasses.dataclass
class Latent:
  index: int
  density: float  # the share of held-out tokens it fires on
  top_contexts: list  # [[(token, activation), ...], ...]: the tokens before each top activation, and 3 after
  top_activations: list  # each context's top activation, highest first
  centres: list  # where in each context that token is
  promoted: list  # [(token, logit weight), ...], the largest
  suppressed: list  # the most negative
  histogram_png: bytes


@dataclasses.dataclass
class FeatureReport:
  latents: list[Latent]
  text_latents: list  # for a text: [(token, [(latent, activation), ...]), ...]
  path: Path | None = None  # the HTML page


def latents_of(sae: SAE, sae_params, source: ModelActivations, tokens_BxT) -> np.ndarray:
  """B x T x Z: every latent's activation on every token."""
  x = source.at_point(jnp.asarray(tokens_BxT))
  _, z = sae.apply({"params": sae_params}, x.reshape(-1, source.d_in).astype(jnp.float32))
  return np.asarray(z).reshape(*tokens_BxT.shape, -1)


def readable_latents(z_BxTxZ: np.ndarray, count: int, dense: float = 0.1, least: int = 3) -> list[int]:
  """`count` latents to show first, as feature dashboards choose them: none that fires on more than
  `dense` of the tokens (a space, a constant), none that fires on fewer than `least` tokens, none whose
  activation lies mostly on the windows' first token (an artifact of where a window starts, not a
  feature of the text); of the rest, latents spread evenly over their range of densities, each band's
  strongest by mean activation where it fires. Fewer candidates: the most active of the others after them."""
  B, T, Z = z_BxTxZ.shape
  fires_Z = (z_BxTxZ > 0).reshape(-1, Z).sum(0)
  mass_Z = z_BxTxZ.sum((0, 1))
  at_start_Z = z_BxTxZ[:, 0].sum(0) / np.maximum(mass_Z, 1e-30)
  candidates = np.flatnonzero((fires_Z >= least) & (fires_Z <= dense * B * T) & (at_start_Z <= 0.5))
  by_density = candidates[np.argsort(fires_Z[candidates], kind="stable")]
  strength_Z = mass_Z / np.maximum(fires_Z, 1)
  chosen = []
  for band in np.array_split(by_density, min(count, len(by_density))) if len(by_density) else []:
    chosen.append(int(band[np.argmax(strength_Z[band])]))
  rest = [int(i) for i in np.argsort(-mass_Z) if int(i) not in chosen]
  return (chosen + rest)[:count]


def _histogram(values: np.ndarray, index: int) -> bytes:
  plt = probes.pyplot()
  fig, ax = plt.subplots(figsize=(3.2, 1.8), dpi=100)
  ax.hist(values[values > 0], bins=30, color="#c0392b")
  ax.set_title(f"latent {index}: activations > 0", fontsize=8)
  ax.tick_params(labelsize=7)
  fig.tight_layout()
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png")
  plt.close(fig)
  return buffer.getvalue()


def feature_pages(
  sae: SAE,
  sae_params,
  source: ModelActivations,
  tokenizer,
  *,
  latents: list[int] | None = None,
  count: int = 8,
  contexts: int = 8,
  window: int = 12,
  text: str | None = None,
  out: Path | None = None,
) -> FeatureReport:
  """The pages of `latents` (None: `count` a reader learns from, `readable_latents`) on the source's
  validation windows; `text`: which latents fire on each of its tokens."""
  tokens_BxT = source.eval_tokens_BxT()
  z_BxTxZ = latents_of(sae, sae_params, source, tokens_BxT)
  B, T, Z = z_BxTxZ.shape
  flat_NxZ = z_BxTxZ.reshape(-1, Z)
  if latents is None:
    latents = readable_latents(z_BxTxZ, count)
  bad = [i for i in latents if not 0 <= i < Z]
  if bad:
    raise UserError(f"latent {bad[0]} is not one of this SAE's {Z} (0 to {Z - 1})")
  ids = tokenizer.encode(text) if text else []
  if len(ids) > source.model.config.max_len:
    raise UserError(f"the text is {len(ids)} tokens, longer than the model's context of {source.model.config.max_len}")
  decoder_ZxD = np.asarray(sae.apply({"params": sae_params}, method=SAE.decoder)) / float(sae_params["input_scale"])
  # A direction in the residual stream's basis meets the unembedding directly (the direct path, the
  # final norm left out); one elsewhere (z, mlp_post) does not.
  in_stream = source.point in RESIDUAL_POINTS
  unembed_VxD = np.asarray(gpt.unembedding(source.model.config, source.params)) if in_stream else None
  piece = lambda t: tokenizer.decode([int(t)])
  report = []
  for index in latents:
    acts = flat_NxZ[:, index]
    order = [i for i in np.argsort(-acts)[:contexts] if acts[i] > 0]
    tops, peaks, centres = [], [float(acts[i]) for i in order], []
    for i in order:
      b, t = divmod(int(i), T)
      lo, hi = max(0, t - window), min(T, t + 4)
      tops.append([(piece(tokens_BxT[b, j]), float(z_BxTxZ[b, j, index])) for j in range(lo, hi)])
      centres.append(t - lo)
    promoted = suppressed = []
    if unembed_VxD is not None:
      weights_V = unembed_VxD @ decoder_ZxD[index]
      promoted = [(piece(v), float(weights_V[v])) for v in np.argsort(-weights_V)[:8]]
      suppressed = [(piece(v), float(weights_V[v])) for v in np.argsort(weights_V)[:8]]
    density = float((acts > 0).mean())
    report.append(Latent(index, density, tops, peaks, centres, promoted, suppressed, _histogram(acts, index)))
  text_latents = []
  if ids:
    z_1xTxZ = latents_of(sae, sae_params, source, np.asarray([ids], np.int32))[0]
    for t, token in enumerate(ids):
      firing = np.argsort(-z_1xTxZ[t])[:4]
      text_latents.append((piece(token), [(int(s), float(z_1xTxZ[t, s])) for s in firing if z_1xTxZ[t, s] > 0]))
  result = FeatureReport(report, text_latents)
  if out is not None:
    result.path = write_pages(result, Path(out))
  return result


def marked(context: list, centre: int) -> str:
  """A context as text, its top token in brackets."""
  return "".join(f"[{t}]" if i == centre else t for i, (t, _) in enumerate(context))


def _shaded(context: list, centre: int, peak: float) -> str:
  spans = []
  for i, (token, act) in enumerate(context):
    alpha = 0.0 if peak <= 0 else min(1.0, act / peak)
    border = "border-bottom:2px solid #000;" if i == centre else ""
    style = f"background:rgba(192,57,43,{alpha:.2f});{border}"
    # a newline drawn as one would break the line and leave its shading nothing to colour: a visible mark
    shown = token.replace("\r", "").replace("\n", "\u21b5")
    spans.append(f'<span title="{act:.3f}" style="{style}">{html.escape(shown)}</span>')
  return "".join(spans)


def write_pages(report: FeatureReport, out: Path) -> Path:
  """features.html (and each latent's histogram, features.json) of `report` in `out`."""
  out.mkdir(parents=True, exist_ok=True)
  parts = [
    "<!doctype html><meta charset='utf-8'><title>SAE features</title>",
    "<style>body{font-family:sans-serif;max-width:60em;margin:auto} .ctx{font-family:monospace;white-space:pre;"
    "border-bottom:1px solid #eee;padding:2px} td{padding:0 1em 0 0;font-family:monospace}</style>",
  ]
  for latent in report.latents:
    (out / f"latent_{latent.index}.png").write_bytes(latent.histogram_png)
    peak = max((a for c in latent.top_contexts for _, a in c), default=0.0)
    picture = base64.b64encode(latent.histogram_png).decode()
    parts.append(f"<h2>latent {latent.index}</h2><p>density {100 * latent.density:.2f}% of held-out tokens</p>")
    parts.append(f"<img src='data:image/png;base64,{picture}'>")
    contexts = "".join(
      f"<div class='ctx'>{_shaded(c, i, peak)}</div>" for c, i in zip(latent.top_contexts, latent.centres)
    )
    parts.append(f"<h3>top contexts</h3>{contexts}")
    if latent.promoted:
      rows = "".join(
        f"<tr><td>{html.escape(repr(p))} {w:+.2f}</td><td>{html.escape(repr(s))} {v:+.2f}</td></tr>"
        for (p, w), (s, v) in zip(latent.promoted, latent.suppressed)
      )
      parts.append(f"<h3>logits: promoted, suppressed</h3><table>{rows}</table>")
  if report.text_latents:
    rows = "".join(
      f"<tr><td>{html.escape(repr(token))}</td><td>{', '.join(f'{s} ({a:.2f})' for s, a in firing)}</td></tr>"
      for token, firing in report.text_latents
    )
    parts.append(f"<h2>the text, token by token: latents firing (activation)</h2><table>{rows}</table>")
  page = out / "features.html"
  page.write_text("\n".join(parts))
  numbers = {
    "latents": [
      {k: v for k, v in dataclasses.asdict(latent).items() if k != "histogram_png"} for latent in report.latents
    ],
    "text": report.text_latents,
  }
  (out / "features.json").write_text(json.dumps(numbers, indent=1))
  return page
