"""Metrics: FLOPs and MFU, translation quality (sacreBLEU BLEU and chrF), JSONL + TensorBoard
writers, the loss-curve plot."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from pathlib import Path

import jax


# Peaks per chip from vendor data sheets (device_peaks.json, by `device.device_kind`): dense bf16
# FLOP/s, against which MFU is reported whatever the compute dtype, and memory bytes/s, the roofline
# of memory-bound work such as batch-1 decoding. CPUs have no entry ("n/a").
@functools.cache
def _peaks() -> dict:
  return json.loads((Path(__file__).parent / "device_peaks.json").read_text())


def _by_kind(table: dict[str, float], device) -> float | None:
  kind = device.device_kind
  if kind in table:
    return table[kind]
  # Names vary by driver and form factor: match on the table name's last word, the model number.
  for name, value in table.items():
    if name.split()[-1] in kind and device.platform != "cpu":
      return value
  return None


def peak_flops(device) -> float | None:
  return _by_kind(_peaks()["bf16_flops_per_s"], device)


def peak_bandwidth(device) -> float | None:
  return _by_kind(_peaks()["memory_bytes_per_s"], device)


def flops_per_token(num_params: int, num_layers: int, d_model: int, seq_len: int) -> float:
  """Training FLOPs per token: 6·N for the matmuls over the parameters (forward 2N, backward 4N)
  plus 12·L·d·T for attention's QKᵀ and AV (PaLM's appendix B; nanoGPT's estimate_mfu)."""
  return 6 * num_params + 12 * num_layers * d_model * seq_len


def mfu(tokens_per_second: float, flops_token: float, devices) -> float | None:
  peaks = [peak_flops(d) for d in devices]
  if any(p is None for p in peaks):
    return None
  return tokens_per_second * flops_token / sum(peaks)


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
  """sacreBLEU's corpus BLEU (13a tokenization) and chrF, one reference per sentence, and the BLEU
  signature (what to quote next to the number)."""
  from sacrebleu.metrics import BLEU, CHRF

  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
  bleu, chrf = BLEU(), CHRF()
  return {
    "bleu": float(bleu.corpus_score(list(hypotheses), [list(references)]).score),
    "chrf": float(chrf.corpus_score(list(hypotheses), [list(references)]).score),
    "bleu_signature": str(bleu.get_signature()),
  }


class MetricsWriter:
  """Appends one JSON object per record to `metrics.jsonl`, mirrors scalars to TensorBoard."""

  def __init__(self, workdir: Path, enabled: bool = True):
    self.enabled = enabled
    self.path = Path(workdir) / "metrics.jsonl"
    self._tb = None
    if enabled:
      from tensorboardX import SummaryWriter

      self._tb = SummaryWriter(str(Path(workdir) / "tensorboard"))

  def write(self, step: int, metrics: dict) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    for k, v in record.items():
      if k != "step" and isinstance(v, (int, float)) and v is not None and math.isfinite(v):
        self._tb.add_scalar(k, v, step)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def _plain(v):
  if hasattr(v, "item"):
    v = v.item()
  return v


def read_jsonl(path: Path) -> list[dict]:
  path = Path(path)
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def last_per_step(records: list[dict], key: str) -> dict[int, float]:
  """{step: value} keeping the last record of each step (a resumed run re-logs the steps it redoes)."""
  return {r["step"]: r[key] for r in records if key in r}


def plot_losses(jsonl: Path, png: Path, title: str = "", curves: tuple[str, ...] = ()) -> Path:
  """Train and validation loss by step; beside them, each evaluation metric in `curves` (e.g. dev
  BLEU) by minutes of training (`train_time_s`: steps and compiles, not evaluations)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  records = read_jsonl(jsonl)
  train = sorted(last_per_step(records, "loss").items())
  val = sorted(last_per_step(records, "val_loss").items())
  fig, axes = plt.subplots(1, 2 if curves else 1, figsize=(12 if curves else 7, 4), squeeze=False)
  ax = axes[0, 0]
  if train:
    ax.plot(*zip(*train), label="train loss", lw=1)
  if val:
    ax.plot(*zip(*val), "o-", label="validation loss")
  ax.set_xlabel("step")
  ax.set_ylabel("cross-entropy (nats/token)")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  if curves:
    ax = axes[0, 1]
    minutes = last_per_step(records, "train_time_s")
    for key in curves:
      points = sorted((minutes[step] / 60, v) for step, v in last_per_step(records, key).items() if step in minutes)
      if points:
        ax.plot(*zip(*points), "o-", label=key)
    ax.set_xlabel("minutes of training")
    ax.set_title(f"{', '.join(curves)} over training time")
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(png, dpi=100)
  plt.close(fig)
  return png


def plot_head_scores(jsonl: Path, png: Path, title: str = "") -> Path:
  """A run with config.head_scores, by step: the training and validation losses, every head's
  previous-token and induction (prefix-matching) scores, and the in-context score (late loss minus
  early: below 0, the context helps)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  records = read_jsonl(jsonl)
  heads = sorted({k.removeprefix("induction_") for r in records for k in r if k.startswith("induction_")})
  panels = [
    ("loss", ["loss", "val_loss"]),
    ("previous-token score per head", [f"previous_token_{h}" for h in heads]),
    ("induction score per head", [f"induction_{h}" for h in heads]),
    ("in-context score (nats)", ["in_context_score"]),
  ]
  fig, axes = plt.subplots(1, len(panels), figsize=(20, 4))
  for ax, (name, keys) in zip(axes, panels):
    for key in keys:
      points = sorted(last_per_step(records, key).items())
      if points:  # the training loss at every log step (where a phase change shows), the rest as points
        label = key.removeprefix("induction_").removeprefix("previous_token_")
        ax.plot(*zip(*points), "-" if key == "loss" else "o-", ms=3, lw=1, label=label)
    ax.set_xlabel("step")
    ax.set_title(f"{title}: {name}" if title else name)
    ax.grid(alpha=0.3)
    if len(keys) > 1:
      ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(png, dpi=100)
  plt.close(fig)
  return png


def device_summary() -> str:
  d = jax.devices()
  return f"{len(d)} x {d[0].device_kind} ({d[0].platform}), {jax.process_count()} process(es)"
