"""What launch.probe's verbs compute, as functions a notebook calls with arguments: every head's
detector scores (and the loss without some heads), a next-token logit split into its components'
shares, activation patching beside attribution patching, and a word's similarity across texts. Each
returns its numbers as a dataclass and, given `out`, writes its picture and JSON there; the launch
program only reads its flags, calls one of them and prints the result.

    >>> report = head_scores_and_ablations(model, params, ablate=[(1, 0)], validation=tokens)
    >>> report.scores["induction"][1, 0], report.losses
    >>> attribute(model, params, tokenizer, "ROMEO: O Juli", target="e", out=Path("probes/romeo"))
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from transformer.errors import UserError
from transformer.interp import interventions, patching, probes, probing
from transformer.layers.points import Point
from transformer.models.gpt import GPT

ABLATIONS = ("zero", "mean", "resample")


def _gpt(model, what: str) -> None:
  if not isinstance(model, GPT):
    raise UserError(f"{what} works on a GPT's heads and residual stream; this is a {type(model).__name__}")


def _write_json(out: Path | None, name: str, record: dict) -> None:
  if out is not None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(record) + "\n")


# --- heads ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class HeadReport:
  """Every head's scores on random tokens repeated twice, and the next-token losses with all heads
  and without the ablated ones: `losses[what] = (first copy, second copy, validation or None)`."""

  length: int  # the random tokens a row repeats
  scores: dict[str, np.ndarray]  # kind -> L x H (interventions.head_scores)
  losses: dict[str, tuple[float, float, float | None]]


def head_scores_and_ablations(
  model, params, *, ablate=(), ablation: str = "zero", validation=None, out: Path | None = None
) -> HeadReport:
  """The head detectors (interventions.head_scores) on 16 rows of random tokens, each repeated twice,
  as long as fits the context (at most 2 x 50); the loss on those tokens (and on the first windows of
  `validation`, a run's validation tokens, when given) with all heads and without the heads `ablate`
  names ((layer, head) pairs, `ablation` "zero" or "mean": their mean output over other random
  tokens). The random tokens are drawn among those `validation` has (a BPE's unused pieces never
  trained). heads.json in `out`."""
  _gpt(model, "scoring heads")
  if ablation not in ABLATIONS:
    raise UserError(f"unknown ablation {ablation!r}; choose one of {', '.join(ABLATIONS)}")
  length = min(50, model.config.max_len // 2)
  ids = None if validation is None else np.unique(np.asarray(validation[:100_000]))
  tokens = interventions.repeated_random_tokens(model.config.vocab_size, length, batch=16, ids=ids)
  scores = {kind: np.asarray(s) for kind, s in interventions.head_scores(model, params, tokens).items()}
  runs = {"all heads": None}
  if ablate:
    reference_z = None
    if ablation != "zero":  # other random tokens repeated (seed 1): their mean, or their own outputs
      reference = interventions.repeated_random_tokens(model.config.vocab_size, length, batch=16, seed=1, ids=ids)
      reference_z = interventions.run_with_cache(model, params, reference, names=("z",))[1]["z"]
    named = ",".join(f"L{layer}.H{head}" for layer, head in ablate)
    runs[f"without {named} ({ablation} ablation)"] = interventions.ablating(
      ablate, model.config.block.num_heads, ablation, reference_z
    )
  losses = {}
  for what, patches in runs.items():  # position t predicts token t + 1; the second copy's first token is random
    nll_T = interventions.next_token_losses(model, params, tokens, patches)
    held_out = None if validation is None else validation_loss(model, params, validation, patches)
    losses[what] = (float(nll_T[: length - 1].mean()), float(nll_T[length:].mean()), held_out)
  _write_json(out, "heads.json", {k: s.round(6).tolist() for k, s in scores.items()})
  return HeadReport(length, scores, losses)


def validation_loss(model, params, validation, patches=None, rows: int = 64) -> float:
  """The mean next-token loss on the first `rows` windows of the validation tokens, each as long as the context."""
  T = model.config.max_len
  count = min(rows, len(validation) // T)
  windows_BxT = jnp.asarray(np.asarray(validation[: count * T], np.int32).reshape(count, T))
  return float(interventions.next_token_losses(model, params, windows_BxT, patches).mean())


# --- a logit and its components --------------------------------------------------------------


def one_token(tokenizer, text: str, what: str) -> int:
  """The id of `text`, which must be one token (`what` names it in the error): a piece inside the text,
  without the BOS a tokenizer adds to a whole one."""
  ids = tokenizer.encode_piece(text)
  if len(ids) != 1:
    pieces = [tokenizer.decode([i]) for i in ids]
    raise UserError(
      f"{what}={text!r} is {len(ids)} tokens for this tokenizer {pieces}; give one token (with GPT-2's, a "
      f"word usually starts with its space: ' Juliet')"
    )
  return ids[0]


@dataclasses.dataclass
class Attribution:
  """A next-token logit (or a difference of two) at a text's last position, and each component's
  direct share of it (embeddings, every head, every MLP: they sum to it before a soft-cap)."""

  metric: str  # in words: "logit of 'e'" or "logit 'e' - logit 'a'"
  logit: float  # the model's own (soft-capped, if it caps)
  contributions: dict[str, float]  # each component's logit contribution, in logit units (not a fraction)


def attribute(model, params, tokenizer, text: str, target: str, versus: str | None = None, out=None) -> Attribution:
  """The `target` token's logit (minus `versus`'s) after `text`, split into the direct contributions
  of the embeddings, every head and every MLP (`ActivationCache.direct_logit_attribution`);
  attribution.png and attribution.json in `out`."""
  _gpt(model, "attribution")
  tokens_1xT = jnp.asarray([probes.encode(model, tokenizer, text)])
  target_id = one_token(tokenizer, target, "the target")
  versus_id = None if versus is None else one_token(tokenizer, versus, "the versus token")
  metric = f"logit of {target!r}" if versus is None else f"logit {target!r} - logit {versus!r}"

  _, cache = interventions.run_with_cache(model, params, tokens_1xT)

  def last(token):
    attributed = cache.direct_logit_attribution(jnp.full_like(tokens_1xT, token))
    return {k: float(np.asarray(x)[0, -1]) for k, x in attributed.items()}  # read on the host

  contributions = last(target_id)
  if versus_id is not None:
    contributions = {k: v - u for (k, v), u in zip(contributions.items(), last(versus_id).values())}
  logits_V = np.asarray(interventions.run_with_cache(model, params, tokens_1xT, names=())[0])[0, -1]
  logit = float(logits_V[target_id] - (0.0 if versus_id is None else logits_V[versus_id]))
  if out is not None:
    out.mkdir(parents=True, exist_ok=True)
    probes.draw_logit_attribution(contributions, out / "attribution.png", f"{metric} after {text[-40:]!r}")
  record = {"text": text, "metric": metric, "logit": logit, "contributions": contributions}
  _write_json(out, "attribution.json", record)
  return Attribution(metric, logit, contributions)


# --- activation patching ---------------------------------------------------------------------


@dataclasses.dataclass
class Patching:
  """The metric on the clean and the corrupt run, and what patching each piece of the clean run into
  the corrupt one does to it: `maps[name]` (layers x columns, `columns[name]`), measured and as
  attribution patching estimates it."""

  metric: str
  runs: dict[str, float]  # "clean", "corrupt"
  maps: dict[str, np.ndarray]
  columns: dict[str, list[str]]


@dataclasses.dataclass
class _Pair:
  """A clean/corrupt pair of texts as patching reads them: their ids (1 x T each), the metric of logits
  (`target`'s log-probability, or its logit minus `versus`'s, at the last position), its name, and
  its value on each run unpatched (`runs`: "clean", "corrupt")."""

  clean_ids: list[int]
  corrupt_ids: list[int]
  clean_1xT: jax.Array
  corrupt_1xT: jax.Array
  metric: object
  metric_name: str
  runs: dict[str, float]


def _pair(model, params, tokenizer, clean: str, corrupt: str, target: str, versus: str | None) -> _Pair:
  clean_ids, corrupt_ids = (probes.encode(model, tokenizer, text) for text in (clean, corrupt))
  if len(clean_ids) != len(corrupt_ids):
    raise UserError(
      f"the clean text is {len(clean_ids)} tokens and the corrupt one {len(corrupt_ids)}: patching pairs their "
      f"positions, so give texts of as many tokens (change a word for another of as many tokens)"
    )
  target_id = one_token(tokenizer, target, "the target")
  versus_id = None if versus is None else one_token(tokenizer, versus, "the versus token")
  # A logit alone moves with every logit; its log-probability says what patching changed.
  metric_name = f"log-probability of {target!r}" if versus is None else f"logit {target!r} - logit {versus!r}"

  def metric(logits_BxTxV):
    last_V = logits_BxTxV[0, -1]
    return jax.nn.log_softmax(last_V)[target_id] if versus_id is None else last_V[target_id] - last_V[versus_id]

  clean_1xT, corrupt_1xT = jnp.asarray([clean_ids]), jnp.asarray([corrupt_ids])
  runs = {
    name: float(metric(interventions.run_with_cache(model, params, x, names=())[0]))
    for name, x in (("clean", clean_1xT), ("corrupt", corrupt_1xT))
  }
  return _Pair(clean_ids, corrupt_ids, clean_1xT, corrupt_1xT, metric, metric_name, runs)


@dataclasses.dataclass
class PathPatching:
  """Path patching's result: the metric on the clean and corrupt runs, with the sender patched outright
  (`sender`) and only along the receivers' paths (`path`)."""

  metric: str
  runs: dict[str, float]  # "clean", "corrupt", "sender", "path"


def path(model, params, tokenizer, clean, corrupt, target, versus, sender, receivers, out=None) -> PathPatching:
  """Path patching (patching.path_patching) on the clean text: the `sender` head's output from the
  corrupt text, seen only by `receivers` [(layer, head, "q"|"k"|"v")], beside patching the sender
  outright. path.json in `out`."""
  _gpt(model, "path patching")
  backward = patching.backward_receivers(sender, receivers, model.config.block.parallel)
  if backward:
    names = ", ".join(f"L{r[0]}.H{r[1]}.{r[2]}" if len(r) == 3 else f"L{r[0]}.mlp" for r in backward)
    raise UserError(
      f"the receivers {names} read the stream before the sender L{sender[0]}.H{sender[1]} writes it: a path runs "
      f"forward; give receivers in later layers (above L{sender[0]})"
    )
  pair = _pair(model, params, tokenizer, clean, corrupt, target, versus)
  runs = dict(pair.runs)
  _, source = interventions.run_with_cache(model, params, pair.corrupt_1xT, names=("z",))
  only = (jnp.arange(model.config.block.num_heads) == sender[1])[:, None]
  outright = {("z", sender[0]): interventions.Patch.replace(source["z"][sender[0]], where=only)}
  patched = interventions.run_with_patches(model, params, pair.clean_1xT, patches=outright)
  runs["sender"] = float(pair.metric(patched))
  runs["path"] = float(
    patching.path_patching(
      model, params, pair.clean_1xT, pair.metric, sender=sender, receivers=receivers, source_BxT=pair.corrupt_1xT
    )
  )
  record = {"metric": pair.metric_name, "sender": list(sender), "receivers": receivers, "runs": runs}
  _write_json(out, "path.json", record)
  return PathPatching(pair.metric_name, runs)


def patch(
  model, params, tokenizer, clean: str, corrupt: str, target: str, versus: str | None = None, out=None
) -> Patching:
  """Activation patching from `clean` into `corrupt` (patching.patching_sweep), the residual
  stream by layer x position and the heads by layer x head, beside attribution patching's estimate of
  the same; the metric is `target`'s log-probability (or its logit minus `versus`'s) at the last
  position. patching.png and patching.json in `out`."""
  _gpt(model, "patching")
  pair = _pair(model, params, tokenizer, clean, corrupt, target, versus)
  clean_ids, corrupt_ids, clean_1xT, corrupt_1xT = pair.clean_ids, pair.corrupt_ids, pair.clean_1xT, pair.corrupt_1xT
  metric, metric_name, runs = pair.metric, pair.metric_name, pair.runs
  maps, columns = {}, {}
  labels = [
    c if c == d else f"{c}/{d}"
    for c, d in zip(probes.token_texts(tokenizer, clean_ids), probes.token_texts(tokenizer, corrupt_ids))
  ]
  for over, cols in (("positions", labels), ("heads", [f"H{h}" for h in range(model.config.block.num_heads)])):
    swept = patching.patching_sweep(model, params, clean_1xT, corrupt_1xT, metric, over=over)
    estimated = patching.attribution_patching(model, params, clean_1xT, corrupt_1xT, metric, over=over)
    name = "resid_pre" if over == "positions" else "z"
    maps[f"patched {name}, layer x {over[:-1]}"] = np.asarray(swept) - runs["corrupt"]
    maps[f"attribution patching, {name}"] = np.asarray(estimated)
    columns.update(dict.fromkeys(list(maps)[-2:], cols))
  if out is not None:
    out.mkdir(parents=True, exist_ok=True)
    title = f"effect on the {metric_name} of patching clean into corrupt"
    probes.draw_patching(maps, columns, out / "patching.png", title)
  record = {"metric": metric_name, "runs": runs, "columns": columns}
  _write_json(out, "patching.json", record | {"maps": {k: v.round(6).tolist() for k, v in maps.items()}})
  return Patching(metric_name, runs, maps, columns)


# --- the induction circuit --------------------------------------------------------------------


@dataclasses.dataclass
class Circuit:
  """An induction circuit traced (`induction_circuit`): the heads it names, the second copy's loss rise
  of ablating the previous-token head everywhere and along each path into the next layer, the
  strongest edges by edge attribution patching, the probes' held-out accuracies and the alignment
  search's interchange accuracies."""

  previous_token_head: tuple[int, int]
  induction_head: tuple[int, int]
  loss_rise: dict[str, float]  # "everywhere", "into keys", "into queries", "into values"
  top_edges: list[tuple[str, float]]  # "L0.H1 -> L1 k" (summed over layer 1's heads), estimated effect
  probes: dict[str, dict[str, float]]  # where -> test and control accuracy
  alignment: dict[str, float]  # rank; interchange accuracy of the subspace found, a random one, the whole point


def _second_copy_loss(tokens_BxT):
  """The mean next-token loss over the second copy of repeated tokens, as a metric of logits."""
  T = tokens_BxT.shape[1]

  def metric(logits_BxTxV):
    logp = jax.nn.log_softmax(logits_BxTxV[:, T // 2 : -1].astype(jnp.float32))
    return -jnp.take_along_axis(logp, tokens_BxT[:, T // 2 + 1 :, None], -1).mean()

  return metric


def induction_circuit(model, params, *, validation=None, rank: int = 16, out: Path | None = None) -> Circuit:
  """The induction circuit of a 2-layer attention-only GPT (experiments/induction.py), traced on random
  tokens repeated twice: path patching from the previous-token head into the next layer's keys,
  queries and values (K-composition: Olsson et al. 2022), edge attribution patching of every head ->
  head edge, linear probes for the previous token on the embeddings and on layer 0's output, and a
  distributed alignment search at layer 1's values for the copied token. circuit.json in `out`."""
  _gpt(model, "the circuit study")
  cfg = model.config
  if cfg.num_layers < 2:
    raise UserError("an induction circuit needs two layers: a previous-token head below an induction head")
  length = min(50, cfg.max_len // 2)
  ids = None if validation is None else np.unique(np.asarray(validation[:100_000]))
  tokens = interventions.repeated_random_tokens(cfg.vocab_size, length, batch=16, ids=ids)
  reference = interventions.repeated_random_tokens(cfg.vocab_size, length, batch=16, seed=1, ids=ids)
  scores = interventions.head_scores(model, params, tokens)
  previous = (0, int(np.argmax(np.asarray(scores["previous_token"][0]))))
  induction = (1, int(np.argmax(np.asarray(scores["induction"][1]))))
  metric = _second_copy_loss(tokens)
  rise = _ablation_rises(model, params, tokens, reference, previous, metric)
  # Edges: the first copy corrupted (other tokens), so that nothing earlier predicts the second.
  corrupt = jnp.concatenate([reference[:, :length], tokens[:, length:]], axis=1)
  ranked = _ranked_edges(patching.edge_attribution_patching(model, params, tokens, corrupt, metric), cfg)
  rows = interventions.repeated_random_tokens(cfg.vocab_size, length, batch=64, seed=2, ids=ids)
  alignment = _copied_token_alignment(model, params, tokens, length, rank)
  circuit = Circuit(previous, induction, rise, ranked[:6], _previous_token_probes(model, params, rows), alignment)
  _write_json(out, "circuit.json", dataclasses.asdict(circuit))
  return circuit


def _ablation_rises(model, params, tokens, reference, previous, metric) -> dict[str, float]:
  """How much the second copy's loss rises with the previous-token head mean-ablated everywhere, and
  along its paths into layer 1's keys, queries and values alone (path patching)."""
  H, D = model.config.block.num_heads, model.config.block.d_model
  plain = float(metric(interventions.run_with_cache(model, params, tokens, names=())[0]))
  _, ref = interventions.run_with_cache(model, params, reference, names=("result", "z"))
  mean_result = jnp.broadcast_to(ref["result"][previous[0]][:, :, previous[1]].mean((0, 1)), (*tokens.shape, D))
  ablated = interventions.ablating([previous], H, "mean", ref["z"])
  rise = {"everywhere": float(metric(interventions.run_with_patches(model, params, tokens, patches=ablated))) - plain}
  for role, name in (("k", "into keys"), ("q", "into queries"), ("v", "into values")):
    heads = model.config.block.num_heads if role == "q" else model.config.block.kv_heads
    receivers = [(1, h, role) for h in range(heads)]
    value = patching.path_patching(
      model, params, tokens, metric, sender=previous, receivers=receivers, sender_value=mean_result
    )
    rise[name] = float(value) - plain
  return rise


def _ranked_edges(edges: dict, cfg) -> list[tuple[str, float]]:
  """Each head's edges into a later layer's queries, keys or values, summed over the receiving heads,
  largest first."""
  L, H = cfg.num_layers, cfg.block.num_heads
  return sorted(
    (
      (f"L{a}.H{b} -> L{c} {role}", float(edges[role][a, b, c].sum()))
      for role in "qkv"
      for a in range(L)
      for b in range(H)
      for c in range(a + 1, L)
    ),
    key=lambda edge: -abs(edge[1]),
  )


def _previous_token_probes(model, params, rows) -> dict[str, dict]:
  """Linear probes for the previous token on the embeddings and on layer 0's output (`rows`: more
  sequences, held out by sequence)."""
  previous_BxT = jnp.concatenate([rows[:, :1], rows[:, :-1]], axis=1)
  mask = np.ones(rows.shape, bool)
  mask[:, 0] = False
  probes_ = {}
  for where, point, layer in (("embeddings", "embed", None), ("layer 0 output", "resid_post", 0)):
    probe = probing.linear_probe(model, params, rows, previous_BxT, point=point, layer=layer, mask_BxT=mask)
    probes_[where] = {"test_accuracy": probe.test_accuracy, "control_accuracy": probe.control_accuracy}
  return probes_


def _copied_token_alignment(model, params, tokens, length: int, rank: int) -> dict:
  """The copied token: layer 1's values (every head's copy of the stream) in the first copy from another
  row's tokens; in the second copy the model should then predict that row's next token."""
  source = jnp.roll(tokens, 1, axis=0)
  in_first = (jnp.arange(2 * length) < length)[:, None, None]
  counterfactual = jnp.concatenate([source[:, 1:], source[:, :1]], axis=1)
  loss_mask = (jnp.arange(2 * length) >= length)[None] & (jnp.arange(2 * length) < 2 * length - 1)[None]
  found = probing.distributed_alignment_search(
    model,
    params,
    tokens,
    source,
    counterfactual,
    point="v_input",
    layer=1,
    rank=rank,
    where=in_first,
    loss_mask_BxT=jnp.broadcast_to(loss_mask, tokens.shape),
    steps=300,
    learning_rate=0.02,
  )
  return {
    "rank": rank,
    "accuracy": found.accuracy,
    "random_accuracy": found.random_accuracy,
    "full_accuracy": found.full_accuracy,
  }


# --- what a point encodes -----------------------------------------------------------------------


def probe_layers(model, params, tokens_BxT, *, point: str = "resid_post", offset: int = -1, out=None) -> dict:
  """Whether the token `offset` positions away (-1: the previous one, 0: the current one) can be read
  off `point` by a linear probe, at the embeddings and after each layer: {where: {"test_accuracy",
  "control_accuracy"}} (probing.linear_probe: held out by sequence, the control task a random label
  per current token). probe.json in `out`."""
  _gpt(model, "probing")
  if Point.parse(point).layer is not None:
    raise UserError(f"--probe_point={point!r} names a block; the probes read every block's: name the point alone")
  point = Point.parse(point).name
  T = tokens_BxT.shape[1]
  if not -T < offset < T:
    raise UserError(f"--probe_offset={offset} reaches outside the {T} tokens of a row")
  labels_BxT = jnp.roll(tokens_BxT, -offset, axis=1)  # label at t: the token at t + offset
  mask_BxT = np.zeros(tokens_BxT.shape, bool)
  mask_BxT[:, max(0, -offset) : T - max(0, offset)] = True  # where t + offset is in the row
  found = {}
  where = [("embeddings", "embed", None)] + [(f"layer {l}", point, l) for l in range(model.config.num_layers)]
  for name, at, layer in where:
    probe = probing.linear_probe(
      model,
      params,
      tokens_BxT,
      labels_BxT,
      point=at,
      layer=layer,
      mask_BxT=mask_BxT,
    )
    found[name] = {"test_accuracy": probe.test_accuracy, "control_accuracy": probe.control_accuracy}
  _write_json(out, "probe.json", {"point": point, "offset": offset, "accuracy": found})
  return found


# --- a word across texts ---------------------------------------------------------------------


def compare(model, params, tokenizer, texts: list[str], word: str, out=None) -> np.ndarray:
  """The cosine similarity of `word` (its last token's residual stream) in each text to text 1's, by
  layer (probes.similarity_by_layer: L x N x N); similarity.json in `out`."""
  if len(texts) < 2:
    raise UserError("comparing a word needs at least two texts")
  similarity_LxNxN = probes.similarity_by_layer(model, params, tokenizer, texts, word)
  _write_json(
    out, "similarity.json", {"word": word, "texts": texts, "cosine_LxNxN": similarity_LxNxN.round(6).tolist()}
  )
  return similarity_LxNxN
