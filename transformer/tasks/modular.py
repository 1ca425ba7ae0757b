"""config.task="modular": a GPT learns c = a ∘ b mod p from the sequence "a b =", the loss read only at
"=" (the answer's position) — the setting where grokking was found (Power et al. 2022) and explained
(Nanda et al. 2023; the analysis: transformer.interp.fourier).

The data is every pair (a, b) (b ≠ 0 for division), split once by `split_seed` into
`train_fraction` for training and the rest for testing; the split is saved with the run
(`modular_split.npz` in the workdir). Training is full batch: every step reads the whole training
split, which stays on the devices (no data pipeline in the way); with `--config.steps_per_call=N`,
N steps run as one compiled call. The answer is one of p classes: the logits of the vocabulary's
other tokens ("=", the tokenizer's specials) are not read.

Every evaluation logs, besides train/test loss and accuracy, Nanda et al.'s progress measures: the
embedding's norm by Fourier frequency (`frequency_norms`) and the largest `num_key_frequencies` of them
(`key_frequencies`), their Gini coefficient, the restricted loss (the logits kept on the key
frequencies' directions) and the excluded loss (those directions removed), both on the training
pairs, and the sum of squared weights. The end of a run writes `grokking.png` (the measures over
training) and `mechanism.json` (`mechanism`: the neuron-by-frequency table, the ablations, the
interference fit; `phases`: the step and seconds at which each phase shows).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer import metrics, tokenizers
from transformer.config import RunConfig
from transformer.errors import ConfigError
from transformer.interp import fourier, interventions, probes
from transformer.interp.interventions import Patch
from transformer.models.gpt import GPT
from transformer.tasks.base import Task

OPERATIONS = {  # name: (c of a and b mod p, whether p must be prime)
  "add": (lambda a, b, p: (a + b) % p, False),
  "subtract": (lambda a, b, p: (a - b) % p, False),
  "multiply": (lambda a, b, p: (a * b) % p, True),
  "divide": (lambda a, b, p: (a * pow_mod(b, p - 2, p)) % p, True),  # b⁻¹ = b^(p-2) (Fermat)
  "x2_xy_y2": (lambda a, b, p: (a * a + a * b + b * b) % p, False),  # Power et al.'s a² + ab + b²
}
SPLIT_FILE = "modular_split.npz"


def pow_mod(b, e: int, p: int):
  """b**e mod p, elementwise for an integer array (square and multiply: no overflow for p < 2**31)."""
  result, b = np.ones_like(b), b % p
  while e:
    if e & 1:
      result = result * b % p
    b, e = b * b % p, e >> 1
  return result


def is_prime(n: int) -> bool:
  return n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))


@dataclasses.dataclass(frozen=True)
class ModularConfig:
  p: int = 113  # the modulus: tokens 0..p-1 are the numbers
  operation: str = "add"  # OPERATIONS
  train_fraction: float = 0.3  # of the pairs, for training; the rest are the test split
  split_seed: int = 0  # which pairs (the run's config.seed initialises the model)
  num_key_frequencies: int = 5  # how many of the embedding's largest frequencies the measures call key
  # The last block computes only what the loss reads (GPT's last_only: its query, attention output and
  # MLP at "="; the same logits); False: every position, as the reference model does.
  answer_only: bool = True

  may_change: ClassVar[tuple[str, ...]] = ("num_key_frequencies", "answer_only")

  def check(self, run: RunConfig, data_parallel: int | None) -> None:
    if self.operation not in OPERATIONS:
      raise ConfigError(f"--config.operation={self.operation!r} is unknown; choose one of {', '.join(OPERATIONS)}")
    if self.p < 3:
      raise ConfigError(f"--config.p must be at least 3, got {self.p}")
    if OPERATIONS[self.operation][1] and not is_prime(self.p):
      raise ConfigError(
        f"--config.operation={self.operation!r} needs a prime modulus (its numbers form a group only "
        f"then); --config.p={self.p} is not prime: try 97, 113 or 59"
      )
    if not 0 < self.train_fraction < 1:
      raise ConfigError(f"--config.train_fraction must be in (0, 1), got {self.train_fraction}")
    if not 0 < self.num_key_frequencies <= (self.p - 1) // 2:
      raise ConfigError(
        f"--config.num_key_frequencies must be in 1..{(self.p - 1) // 2}, got {self.num_key_frequencies}"
      )
    if run.model.max_len < 3:
      raise ConfigError("the inputs 'a b =' are 3 tokens: --config.model.max_len must be at least 3")


def tokenizer_for(p: int) -> tokenizers.WordTokenizer:
  """The numbers 0..p-1 (ids 0..p-1) and "=" (id p): a word tokenizer, saved with the run."""
  return tokenizers.WordTokenizer([str(i) for i in range(p)] + ["="])


def all_pairs(p: int, operation: str) -> tuple[np.ndarray, np.ndarray]:
  """(tokens N x 3: "a b =", answers N) for every pair, in the order a * p + b (b ≥ 1 for divide)."""
  a, b = np.divmod(np.arange(p * p, dtype=np.int64), p)
  if operation == "divide":
    a, b = a[b > 0], b[b > 0]
  tokens_Nx3 = np.stack([a, b, np.full_like(a, p)], 1).astype(np.int32)
  return tokens_Nx3, OPERATIONS[operation][0](a, b, p).astype(np.int32)


def split(num_pairs: int, train_fraction: float, seed: int) -> np.ndarray:
  """The training pairs' indices (sorted): the same for the same seed; the test split is the rest."""
  count = int(round(train_fraction * num_pairs))
  return np.sort(np.random.default_rng(seed).permutation(num_pairs)[:count])


@dataclasses.dataclass
class ModularData:
  tokenizer: tokenizers.Tokenizer
  tokens_Nx3: np.ndarray  # every pair
  answers_N: np.ndarray
  train_N: np.ndarray  # the training pairs' indices

  @property
  def test_N(self) -> np.ndarray:
    return np.setdiff1d(np.arange(len(self.answers_N)), self.train_N)


class FullBatch:
  """The training split, every step (resumable: the position is the step count)."""

  def __init__(self, batch: dict):
    self.batch, self.step = batch, 0

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    self.step += 1
    return self.batch

  def get_state(self) -> dict:
    return {"step": self.step}

  def set_state(self, state: dict) -> None:
    self.step = int(state["step"])


class ModularArithmetic(Task):
  """A GPT (config.model) on modular arithmetic; see the module docstring."""

  name = "modular"
  Config = ModularConfig
  families = ("gpt",)
  data_kind = "modular"
  best_metric = ("test_loss", "min")
  curves = ("train_accuracy", "test_accuracy")

  @classmethod
  def load_data(cls, run: RunConfig) -> ModularData:
    c = run.task_config
    tokens_Nx3, answers_N = all_pairs(c.p, c.operation)
    return ModularData(tokenizer_for(c.p), tokens_Nx3, answers_N, split(len(answers_N), c.train_fraction, c.split_seed))

  def build_model(self, model_config):
    return GPT(model_config)

  def init_inputs(self) -> tuple:
    return (jnp.zeros((2, 3), jnp.int32),)

  def save_files(self, workdir: Path) -> None:
    np.savez(workdir / SPLIT_FILE, train=self.data.train_N, test=self.data.test_N)

  def answer_logits(self, params, tokens_Nx3, train: bool = False) -> jax.Array:
    """The logits of the p numbers at "=" (N x p)."""
    answer_only = self.config.answer_only
    logits_NxTxV = self.model.apply({"params": params}, tokens_Nx3, deterministic=not train, last_only=answer_only)
    return logits_NxTxV[:, -1, : self.config.p]

  def loss(self, params, batch, rng, train: bool):
    logits_NxP = self.answer_logits(params, batch["tokens"], train)
    losses_N = optax.softmax_cross_entropy_with_integer_labels(logits_NxP, batch["answers"][:, 0])
    return losses_N.sum(), jnp.float32(losses_N.shape[0])

  def _batch(self, indices_N) -> dict:
    """{"tokens": N x 3, "answers": N x 1} (batch-major, as every batch is sharded)."""
    return {"tokens": self.data.tokens_Nx3[indices_N], "answers": self.data.answers_N[indices_N, None]}

  def train_batches(self) -> FullBatch:
    return FullBatch(self._batch(self.data.train_N))

  def eval_batches(self) -> list:
    return [self._batch(self.data.test_N)]

  def count_tokens(self, host_batch) -> int:
    return len(host_batch["answers"])

  def flops_per_token(self, num_params: int) -> float:
    return metrics.flops_per_token(num_params, self.model_config.num_layers, self.model_config.block.d_model, 3)

  @functools.cached_property
  def _all_logits(self):
    """params -> the logits of every pair, compiled once (every evaluation runs it)."""
    tokens_Nx3 = jnp.asarray(self.data.tokens_Nx3)
    return jax.jit(lambda params: self.answer_logits(params, tokens_Nx3))

  def evaluate(self, params, eval_fn, batches: list) -> dict:
    logits_NxP = np.asarray(self._all_logits(params), np.float64)
    return progress_measures(self, params, logits_NxP)

  def describe(self, result: dict) -> str:
    line = (
      f"train loss {result['train_loss']:.4f} (accuracy {result['train_accuracy']:.1%}), test loss "
      f"{result['test_loss']:.4f} ({result['test_accuracy']:.1%}); key frequencies {result['key_frequencies']}"
    )
    if "restricted_loss" in result:  # addition's
      line += f", restricted {result['restricted_loss']:.3f}, excluded {result['excluded_loss']:.3f}"
    return line

  def finish(self, params, workdir: Path, mean_of_last) -> dict:
    found = {**mechanism(self, params), "phases": phases(workdir / "metrics.jsonl")}
    if jax.process_index() == 0:
      (workdir / "mechanism.json").write_text(json.dumps(found, indent=1) + "\n")
      plot_progress(workdir / "metrics.jsonl", workdir / "grokking.png", title=workdir.name)
      if "neurons" in found:
        plot_mechanism(self, np.asarray(self._all_logits(params)), found, workdir / "mechanism.png")
    return {k: v for k, v in found.items() if not isinstance(v, (list, dict))}


def progress_measures(task: ModularArithmetic, params, logits_NxP: np.ndarray) -> dict:
  """The measures of the module docstring, from the logits of every pair (N x p)."""
  c, data = task.config, task.data
  train_N, answers_N = data.train_N, data.answers_N
  result = {}
  for name, rows in (("train", train_N), ("test", data.test_N)):
    result[f"{name}_loss"] = fourier.cross_entropy(logits_NxP[rows], answers_N[rows])
    result[f"{name}_accuracy"] = float(np.mean(logits_NxP[rows].argmax(-1) == answers_N[rows]))
  norms_K, keys = embedding_frequencies(task, params)
  result.update(frequency_norms=[round(float(x), 5) for x in norms_K], key_frequencies=keys, gini=fourier.gini(norms_K))
  if c.operation == "add":  # the key directions are those of a + b (fourier.key_directions)
    for name, logits in (("restricted", fourier.restricted), ("excluded", fourier.excluded)):
      result[f"{name}_loss"] = fourier.cross_entropy(logits(logits_NxP, c.p, keys)[train_N], answers_N[train_N])
  result["weight_norm"] = float(sum(np.square(np.asarray(x, np.float64)).sum() for x in jax.tree.leaves(params)))
  result["val_loss"] = result["test_loss"]  # what the loss plot draws beside the training loss
  return result


def embedding_frequencies(task: ModularArithmetic, params) -> tuple[np.ndarray, list[int]]:
  """(the norm of each frequency in the numbers' embedding, the config's count of the largest)."""
  norms_K = fourier.frequency_norms(np.asarray(params["wte"]["embedding"])[: task.config.p])
  return norms_K, fourier.key_frequencies(norms_K, task.config.num_key_frequencies)


def mechanism(task: ModularArithmetic, params) -> dict:
  """Nanda et al.'s checks of the algorithm, on every pair: the MLP neurons' best frequencies and
  the share of their variance it explains; the loss with the logits restricted to the key frequencies
  and with each key frequency ablated from them alone; the loss with the neurons at "=" restricted
  to the key frequencies' directions (a patch of `mlp_post`); and how much of the logits
  Σ_k α_k cos(w_k(a + b - c)) explains."""
  c, data = task.config, task.data
  tokens_Nx3, answers_N = jnp.asarray(data.tokens_Nx3), data.answers_N
  logits_NxP, cache = interventions.run_with_cache(task.model, params, tokens_Nx3, names=("mlp_post",))
  logits_NxP = np.asarray(logits_NxP[:, -1, : c.p], np.float64)
  _, keys = embedding_frequencies(task, params)
  loss = lambda logits: fourier.cross_entropy(logits, answers_N)
  accuracy = float(np.mean(logits_NxP.argmax(-1) == answers_N))
  found = {"key_frequencies": keys, "loss": loss(logits_NxP), "accuracy": accuracy}
  if c.operation != "add" or len(answers_N) != c.p * c.p:
    return found  # the checks below are of addition's algorithm
  acts_NxF = np.asarray(cache["mlp_post"][0][:, -1], np.float64)
  best_F, explained_F = fourier.neuron_frequencies(acts_NxF, c.p)
  found["neurons"] = {
    "best_frequency": best_F.tolist(),
    "explained": [round(float(x), 4) for x in explained_F],
  }
  found["neurons_explained_85"] = float(np.mean(explained_F >= 0.85))
  found["neurons_on_key_frequencies"] = float(np.mean(np.isin(best_F, keys)))
  found["neurons_by_key_frequency"] = {str(k): int(np.sum((best_F == k) & (explained_F >= 0.85))) for k in keys}
  found["restricted_loss"] = loss(fourier.restricted(logits_NxP, c.p, keys))
  found["excluded_loss"] = loss(fourier.excluded(logits_NxP, c.p, keys))
  found["loss_without_frequency"] = {str(k): loss(fourier.ablate(logits_NxP, c.p, [k])) for k in keys}
  # The neurons at "=" kept on the key frequencies' directions over (a, b), through a patch.
  Q = fourier.key_directions(c.p, keys)
  restricted_acts_NxF = Q @ (Q.T @ acts_NxF)
  value_NxTxF = jnp.broadcast_to(
    jnp.asarray(restricted_acts_NxF, jnp.float32)[:, None], (*tokens_Nx3.shape, acts_NxF.shape[1])
  )
  at_answer = (jnp.arange(3) == 2)[None, :, None]
  patched_NxTxV = interventions.run_with_patches(
    task.model, params, tokens_Nx3, patches={("mlp_post", 0): Patch.replace(value_NxTxF, where=at_answer)}
  )
  found["neurons_restricted_loss"] = loss(np.asarray(patched_NxTxV[:, -1, : c.p], np.float64))
  found["interference_explained"], alpha_K = fourier.interference_fit(logits_NxP, c.p, keys)
  found["interference_weights"] = [round(float(x), 4) for x in alpha_K]
  return found


def phases(jsonl: Path) -> dict:
  """When each phase shows in the evaluations (step and training seconds; None: not in this run):
  training accuracy reaches 100% (memorisation), the restricted loss falls below 0.1 nats (the key
  frequencies alone fit the training pairs: the circuit has formed), test accuracy passes 50% and 99%
  (generalisation), the excluded loss peaks, and the sum of squared weights falls to half of its peak
  (clean-up)."""
  records = [r for r in metrics.read_jsonl(jsonl) if "train_accuracy" in r]

  def first(test) -> dict | None:
    r = next((r for r in records if test(r)), None)
    return None if r is None else {"step": r["step"], "seconds": round(r.get("train_time_s", 0.0), 1)}

  found = {
    "train_accuracy_100": first(lambda r: r["train_accuracy"] == 1.0),
    "test_accuracy_50": first(lambda r: r["test_accuracy"] >= 0.5),
    "test_accuracy_99": first(lambda r: r["test_accuracy"] >= 0.99),
  }
  if records and "restricted_loss" in records[0]:
    found["restricted_loss_below_0.1"] = first(lambda r: r["restricted_loss"] < 0.1)
    peak = max(records, key=lambda r: r["excluded_loss"])
    found["excluded_loss_peak"] = first(lambda r: r is peak)
  if records:
    heaviest = max(records, key=lambda r: r["weight_norm"])
    found["weight_norm_half_of_peak"] = first(
      lambda r: r["step"] > heaviest["step"] and r["weight_norm"] < heaviest["weight_norm"] / 2
    )
  return found


def plot_mechanism(task: ModularArithmetic, logits_NxP, found: dict, png: Path) -> Path:
  """The algorithm, seen: the logit of c = 0 over (a, b) (`logits_NxP`: every pair's, a * p + b)
  beside Σ_k α_k cos(w_k(a + b)) (the fit of `fourier.interference_fit`), and each MLP neuron's share
  of variance explained by its best frequency."""
  plt, p = probes.pyplot(), task.config.p
  logits_PxP = np.asarray(logits_NxP)[:, 0].reshape(p, p)
  a, b = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
  fit = sum(
    w * np.cos(2 * np.pi * k / p * (a + b)) for k, w in zip(found["key_frequencies"], found["interference_weights"])
  )
  fig, axes = plt.subplots(1, 3, figsize=(17, 4.6))
  for ax, image, title in (
    (axes[0], logits_PxP - logits_PxP.mean(), "logit of c = 0 (centred)"),
    (axes[1], fit, f"Σ α_k cos(w_k(a+b)), k in {found['key_frequencies']}"),
  ):
    shown = ax.imshow(image, origin="lower", cmap="RdBu_r")
    ax.set(xlabel="b", ylabel="a", title=title)
    fig.colorbar(shown, ax=ax)
  best, explained = np.array(found["neurons"]["best_frequency"]), np.array(found["neurons"]["explained"])
  for k in found["key_frequencies"]:
    axes[2].hist(explained[best == k], bins=np.linspace(0, 1, 41), alpha=0.7, label=f"frequency {k}")
  axes[2].hist(
    explained[~np.isin(best, found["key_frequencies"])], bins=np.linspace(0, 1, 41), alpha=0.5, label="other"
  )
  axes[2].set(
    xlabel="share of the neuron's variance its best frequency explains", ylabel="neurons", title="MLP neurons"
  )
  axes[2].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(png, dpi=110)
  plt.close(fig)
  return png


def plot_progress(jsonl: Path, png: Path, title: str = "") -> Path:
  """The measures over training, as the paper draws them: losses (train, test, restricted, excluded;
  log scale), accuracies, the Gini coefficient and the sum of squared weights, and the embedding's
  norm by frequency at each evaluation."""
  plt = probes.pyplot()
  records = [r for r in metrics.read_jsonl(jsonl) if "train_accuracy" in r]
  steps = [r["step"] for r in records]
  fig, axes = plt.subplots(1, 4, figsize=(22, 4.2))
  for key in ("train_loss", "test_loss", "restricted_loss", "excluded_loss"):
    if records and key in records[-1]:
      axes[0].plot(steps, [r[key] for r in records], label=key.replace("_", " "))
  axes[0].set(yscale="log", xlabel="step (= epoch: full batch)", ylabel="cross-entropy", title=title)
  for key in ("train_accuracy", "test_accuracy"):
    axes[1].plot(steps, [r[key] for r in records], label=key.replace("_", " "))
  axes[1].set(xlabel="step", ylabel="accuracy", title="accuracy")
  axes[2].plot(steps, [r["gini"] for r in records], color="C2", label="Gini of the embedding's frequency norms")
  axes[2].set(xlabel="step", ylabel="Gini", title="sparsity in the Fourier basis, and weight norm")
  weights = axes[2].twinx()
  weights.plot(steps, [r["weight_norm"] for r in records], color="C3", label="sum of squared weights")
  weights.set_ylabel("sum of squared weights")
  for ax in axes[:3]:
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
  weights.legend(loc="center right", fontsize=8)
  if records:
    norms = np.array([r["frequency_norms"] for r in records]).T
    last = max(steps[-1], steps[0] + 1)  # one measurement so far: a column of width one step, not zero
    image = axes[3].imshow(norms, aspect="auto", origin="lower", extent=(steps[0], last, 0.5, len(norms) + 0.5))
    fig.colorbar(image, ax=axes[3])
  axes[3].set(xlabel="step", ylabel="frequency k", title="embedding norm by frequency")
  fig.tight_layout()
  fig.savefig(png, dpi=110)
  plt.close(fig)
  return png
