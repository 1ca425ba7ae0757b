"""The residual stream's algebra (transformer.interp.activation_cache) and the patching methods
(transformer.interp.patching): equal to TransformerLens on the same weights (golden arrays made by
tests/make_lens_fixtures.py), and each held to what it claims on small and planted models."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_interventions import CFG, TOKENS, _corrupted, _params, _planted

from transformer import layers
from transformer.interp import interventions, patching, probing
from transformer.interp.interventions import Patch
from transformer.models.formats.gpt2 import import_hf_gpt2
from transformer.models.gpt import GPT

from conftest import REPO

GOLDEN = REPO / "tests" / "fixtures" / "lens" / "golden.npz"
ANSWER, WRONG = 7, 11  # as tests/make_lens_fixtures.py


@pytest.fixture(scope="module")
def lens():
  """(model, params, golden arrays, our logits, our cache) on the fixture's clean tokens."""
  cfg, params = import_hf_gpt2(REPO / "tests" / "fixtures" / "gpt2_tiny_b")
  model, golden = GPT(cfg), dict(np.load(GOLDEN))
  logits, cache = interventions.run_with_cache(model, params, jnp.asarray(golden["clean"]))
  return model, params, golden, logits, cache


def test_every_mapped_point_equals_transformer_lens(lens):
  _, _, golden, logits, cache = lens
  np.testing.assert_allclose(logits, golden["logits"], atol=1e-4)
  T = golden["clean"].shape[1]
  for key, want in golden.items():
    if not key.startswith("point/"):
      continue
    name = key.removeprefix("point/")
    ours = np.broadcast_to(cache[name], want.shape)
    if name == "attn_scores":  # masked scores: each library's own large negative number above the diagonal
      below = np.tril(np.ones((T, T), bool))
      ours, want = ours[..., below], want[..., below]
    np.testing.assert_allclose(ours, want, atol=1e-4, err_msg=name)


def test_the_residual_algebra_equals_transformer_lens(lens):
  _, _, golden, _, cache = lens
  for layer, key in ((None, "final"), (1, "1")):
    np.testing.assert_allclose(cache.decompose_resid(layer=layer), golden[f"decompose_resid/{key}"], atol=1e-4)
    np.testing.assert_allclose(
      cache.decompose_resid(layer=layer, apply_ln=True), golden[f"decompose_resid_ln/{key}"], atol=1e-4
    )
    np.testing.assert_allclose(
      cache.accumulated_resid(layer=layer, apply_ln=True), golden[f"accumulated_resid_ln/{key}"], atol=1e-4
    )
    np.testing.assert_allclose(cache.stack_head_results(layer=layer), golden[f"stack_head_results/{key}"], atol=1e-4)
  np.testing.assert_allclose(
    cache.decompose_resid(layer=1, mlp_input=True, apply_ln=True), golden["decompose_resid_mlp_input/1"], atol=1e-4
  )
  parts = cache.decompose_resid()
  tokens, wrong = jnp.full(golden["clean"].shape, ANSWER), jnp.full(golden["clean"].shape, WRONG)
  # TransformerLens on unfolded weights reads the head's row alone (fold_norm=False).
  np.testing.assert_allclose(cache.logit_attrs(parts, tokens, fold_norm=False), golden["logit_attrs"], atol=1e-4)
  np.testing.assert_allclose(
    cache.logit_attrs(parts, tokens, wrong, fold_norm=False), golden["logit_attrs_diff"], atol=1e-4
  )
  _, labels = cache.decompose_resid(return_labels=True)
  assert labels[:4] == ["embed", "pos_embed", "0_attn_out", "0_mlp_out"]
  assert cache.stack_head_results(return_labels=True)[1][:4] == ["L0H0", "L0H1", "L0H2", "L1H0"]


def test_patching_sweeps_equal_transformer_lens(lens):
  model, params, golden, _, _ = lens
  clean, corrupt = jnp.asarray(golden["clean"]), jnp.asarray(golden["corrupt"])
  metric = lambda logits: (logits[:, -1, ANSWER] - logits[:, -1, WRONG]).mean()
  resid_LxT = patching.patching_sweep(model, params, clean, corrupt, metric)
  np.testing.assert_allclose(resid_LxT, golden["patch/resid_pre"], atol=1e-4)
  heads_LxTxH = patching.patching_sweep(model, params, clean, corrupt, metric, over="positions_and_heads", chunk_size=7)
  np.testing.assert_allclose(heads_LxTxH, golden["patch/attn_head_out_by_pos"], atol=1e-4)


def test_a_steer_adds_and_a_replace_of_its_own_values_changes_nothing():
  model, params = GPT(CFG), _params()
  plain, cache = interventions.run_with_cache(model, params, TOKENS)
  v_D = jnp.linspace(-1.0, 1.0, CFG.block.d_model)
  _, steered = interventions.run_with_patches(
    model, params, TOKENS, patches={("resid_pre", 1): Patch.steer(v_D)}, return_cache=True, names=("resid_pre",)
  )
  np.testing.assert_allclose(steered["resid_pre"][1], cache["resid_pre"][1] + v_D, atol=1e-6)
  np.testing.assert_allclose(steered["resid_pre"][0], cache["resid_pre"][0], atol=1e-6)
  # Steering one position only.
  at_3 = (jnp.arange(8) == 3)[:, None]
  _, one = interventions.run_with_patches(
    model, params, TOKENS, patches={("resid_pre", 1): Patch.steer(v_D, where=at_3)}, return_cache=True
  )
  want = np.broadcast_to(jnp.where(at_3, v_D, 0.0), cache["resid_pre"][1].shape)
  np.testing.assert_allclose(one["resid_pre"][1] - cache["resid_pre"][1], want, atol=1e-6)
  same = {(name, l): Patch.replace(cache[name][l]) for name in ("resid_pre", "z", "mlp_post") for l in range(2)}
  np.testing.assert_allclose(interventions.run_with_patches(model, params, TOKENS, patches=same), plain, atol=1e-5)


def test_python_values_pass_through_as_static_arguments():
  model, params = GPT(CFG), _params()
  plain, _ = interventions.run_with_cache(model, params, TOKENS, names=())
  # `deterministic` and `decode` are Python booleans the model branches on: traced, they would fail.
  logits, cache = interventions.run_with_cache(model, params, TOKENS, deterministic=True, decode=False, names=("z",))
  np.testing.assert_allclose(logits, plain, atol=1e-6)
  patched = interventions.run_with_patches(
    model, params, TOKENS, deterministic=True, patches={("z", 0): Patch.ablate()}
  )
  assert patched.shape == plain.shape


def test_decompose_resid_sums_to_the_stream_and_logit_attrs_is_the_direct_attribution():
  for cfg in (CFG, CFG.replace(norm="rms_norm", tie_embeddings=False, positions="rope", use_bias=False)):
    model, params = GPT(cfg), _params(cfg)
    _, cache = interventions.run_with_cache(model, params, TOKENS)
    np.testing.assert_allclose(cache.decompose_resid().sum(0), cache["resid_post"][-1], atol=1e-5)
    np.testing.assert_allclose(cache.decompose_resid(layer=1).sum(0), cache["resid_pre"][1], atol=1e-5)
    target = (TOKENS * 3 + 1) % cfg.vocab_size
    parts = interventions.run_with_cache(model, params, TOKENS)[1].direct_logit_attribution(target)
    by_mlp = cache.logit_attrs(cache.decompose_resid(mode="mlp"), target)
    np.testing.assert_allclose(by_mlp[-1], parts["L1.mlp"], atol=1e-5)
    heads = cache.logit_attrs(cache.stack_head_results(), target)
    np.testing.assert_allclose(heads[cfg.block.num_heads + 1], parts["L1.H1"], atol=1e-5)
    # The logit lens's last layer is the model's logits; its other layers are each stream's.
    lens_NxBxTxV = cache.logit_lens()
    assert lens_NxBxTxV.shape == (cfg.num_layers + 1, *cache["logits"].shape)
    np.testing.assert_allclose(lens_NxBxTxV[-1], cache["logits"], atol=1e-4)
  direction_D = jax.random.normal(jax.random.key(1), (CFG.block.d_model,))
  attrs = cache.logit_attrs(cache.decompose_resid(), direction=direction_D, apply_ln=False)
  np.testing.assert_allclose(attrs.sum(0), cache["resid_post"][-1] @ direction_D, atol=1e-4)
  with pytest.raises(KeyError, match="names"):
    interventions.run_with_cache(model, params, TOKENS, names=("z",))[1].decompose_resid()


def test_a_chunked_sweep_equals_one_at_once_and_fractions_run_from_corrupt_to_clean():
  """Chunks of 3 patched runs, or all at once on a scanned model (its blocks' params stacked): the
  same numbers; each patch runs from its layer up and the head from the first position the metric
  reads (here position 4)."""
  model, params = GPT(CFG), _params()
  corrupt = _corrupted(TOKENS)
  metric = lambda logits: logits[:, 4, 5].mean() - logits[:, -1, 7].mean()
  chunked = patching.patching_sweep(model, params, TOKENS, corrupt, metric, chunk_size=3)
  scanned, stacked = GPT(CFG.replace(scan_layers=True)), {**params, "h": layers.stack_layers(params["h"], 2)}
  np.testing.assert_allclose(
    patching.patching_sweep(scanned, stacked, TOKENS, corrupt, metric, chunk_size=1000), chunked, atol=1e-5
  )
  fraction = patching.fraction_recovered(chunked, model, params, TOKENS, corrupt, metric)
  np.testing.assert_allclose(fraction[0, 2], 1.0, atol=1e-4)  # the corrupted position at layer 0: all of it
  np.testing.assert_allclose(fraction[:, 0], 0.0, atol=1e-4)  # a position before it: nothing
  # Any block's point, over heads: the per-head queries.
  assert patching.patching_sweep(model, params, TOKENS, corrupt, metric, point="q", over="heads").shape == (2, 2)
  with pytest.raises(ValueError, match="no head axis"):
    patching.patching_sweep(model, params, TOKENS, corrupt, metric, point="mlp_out", over="heads")
  with pytest.raises(ValueError, match="a sweep patches a point of a GPT's blocks"):
    patching.patching_sweep(model, params, TOKENS, corrupt, metric, point="embed")


def test_resample_ablation_takes_another_inputs_outputs():
  model, params = GPT(CFG), _params()
  other = (TOKENS + 5) % CFG.vocab_size
  _, ref = interventions.run_with_cache(model, params, other, names=("z",))
  patches = interventions.ablating([(1, 0)], 2, "resample", ref["z"])
  _, patched = interventions.run_with_patches(model, params, TOKENS, patches=patches, return_cache=True, names=("z",))
  np.testing.assert_allclose(patched["z"][1][:, :, 0], ref["z"][1][:, :, 0], atol=1e-6)
  with pytest.raises(ValueError, match="reference_z"):
    interventions.ablating([(1, 0)], 2, "resample")


def test_path_patching_with_no_receivers_changes_nothing_and_with_every_reader_patches_the_sender():
  model, params = GPT(CFG), _params()
  corrupt = _corrupted(TOKENS)
  metric = lambda logits: logits[:, -1, 5].mean() - logits[:, -1, 7].mean()
  plain, _ = interventions.run_with_cache(model, params, TOKENS, names=())
  sender = (0, 1)
  none = patching.path_patching(model, params, TOKENS, metric, sender=sender, receivers=[], source_BxT=corrupt)
  np.testing.assert_allclose(none, metric(plain), atol=1e-6)
  # Every reader downstream of head L0.H1: layer 0's MLP, each head of layer 1 (q, k, v), layer 1's MLP, the output.
  every = [(0, "mlp"), *[(1, h, r) for h in range(2) for r in "qkv"], (1, "mlp"), "logits"]
  path = patching.path_patching(model, params, TOKENS, metric, sender=sender, receivers=every, source_BxT=corrupt)
  _, source = interventions.run_with_cache(model, params, corrupt, names=("z",))
  direct = interventions.run_with_patches(
    model, params, TOKENS, patches={("z", 0): Patch.replace(source["z"][0], where=(jnp.arange(2) == 1)[:, None])}
  )
  np.testing.assert_allclose(path, metric(direct), atol=1e-5)
  assert abs(float(path - metric(plain))) > 1e-4  # the sender mattered


@pytest.mark.slow  # trains or sweeps on the planted model: seconds of compilation cold
def test_path_patching_and_edge_attribution_name_the_planted_k_composition():
  """The planted induction circuit (test_interventions._planted): layer 0's head 0 writes the token
  before; layer 1's head 0 matches it with its keys. Ablating L0.H0 only on the path into L1.H0's
  keys takes the induction away; into its queries or values, nothing."""
  model, params = _planted(2)
  permutations = np.stack([np.random.default_rng(i).permutation(8) for i in range(4)])
  tokens = jnp.asarray(np.concatenate([permutations, permutations], axis=1))
  losses = lambda logits: _second_copy_loss(logits, tokens)
  B, T = tokens.shape
  zeros = jnp.zeros((B, T, model.config.block.d_model))
  plain = losses(interventions.run_with_cache(model, params, tokens, names=())[0])
  rise = {}
  for role in "qkv":
    receivers = [(1, 0, role)]
    rise[role] = (
      patching.path_patching(model, params, tokens, losses, sender=(0, 0), receivers=receivers, sender_value=zeros)
      - plain
    )
  everywhere = (
    interventions.next_token_losses(model, params, tokens, interventions.ablating([(0, 0)], 2))[T // 2 :].mean() - plain
  )
  assert rise["k"] > 0.8 * everywhere > 0.1, (rise, everywhere)
  assert abs(rise["q"]) < 0.2 * everywhere and abs(rise["v"]) < 0.2 * everywhere, (rise, everywhere)
  # Edge attribution patching, the first copy corrupted (other tokens before each), softer attention
  # (a first-order estimate sees nothing through a saturated softmax): the K edge ranks first.
  model, params = _planted(2, a=1.0)
  corrupt = jnp.concatenate([(tokens[:, : T // 2] + 1) % 8, tokens[:, T // 2 :]], axis=1)
  edges = patching.edge_attribution_patching(model, params, tokens, corrupt, losses)
  largest = max(abs(float(x)) for r in "qkv" for x in np.ravel(edges[r]))
  assert abs(float(edges["k"][0, 0, 1, 0])) == largest, edges


def _second_copy_loss(logits_BxTxV, tokens_BxT) -> jax.Array:
  """The mean next-token loss over the second copy of repeated tokens (where induction predicts)."""
  T = tokens_BxT.shape[1]
  logp = jax.nn.log_softmax(logits_BxTxV[:, T // 2 : -1])
  return -jnp.take_along_axis(logp, tokens_BxT[:, T // 2 + 1 :, None], -1).mean()


@pytest.mark.slow  # trains or sweeps on the planted model: seconds of compilation cold
def test_a_probe_reads_the_previous_token_where_a_head_wrote_it():
  """The planted model's L0.H0 copies the previous token into the stream: a linear probe reads it
  from layer 0's output (held out), not from the embeddings. The control task (a random label per
  current token) is learnt too: the stream holds the current token one-hot, and 8 types are few."""
  model, params = _planted(2)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 8, (64, 16)))
  previous = jnp.concatenate([jnp.zeros((64, 1), int), tokens[:, :-1]], axis=1)
  mask = np.ones((64, 16), bool)
  mask[:, 0] = False
  after = probing.linear_probe(model, params, tokens, previous, point="resid_post", layer=0, mask_BxT=mask)
  before = probing.linear_probe(model, params, tokens, previous, point="embed", mask_BxT=mask)
  assert after.test_accuracy > 0.9 and after.control_accuracy > 0.9, after
  assert before.test_accuracy < 0.3, before


@pytest.mark.slow  # trains or sweeps on the planted model: seconds of compilation cold
def test_das_of_full_rank_is_patching_the_whole_point():
  model, params = GPT(CFG), _params()
  source = (TOKENS + 3) % CFG.vocab_size
  _, base = interventions.run_with_cache(model, params, TOKENS, names=("resid_pre",))
  _, other = interventions.run_with_cache(model, params, source, names=("resid_pre",))
  D = CFG.block.d_model
  rotation_DxD = probing._orthonormal(jax.random.normal(jax.random.key(3), (D, D)))
  swapped = probing.interchange(
    model, params, TOKENS, base["resid_pre"][1], other["resid_pre"][1], rotation_DxD, point="resid_pre", layer=1
  )
  whole = interventions.run_with_patches(
    model, params, TOKENS, patches={("resid_pre", 1): Patch.replace(other["resid_pre"][1])}
  )
  np.testing.assert_allclose(swapped, whole, atol=1e-4)
  # A trained subspace of rank 1 at the corrupted position recovers the source's prediction better than a random one.
  found = probing.distributed_alignment_search(
    model,
    params,
    TOKENS,
    source,
    jnp.argmax(interventions.run_with_cache(model, params, source, names=())[0], -1),
    point="resid_pre",
    layer=1,
    rank=2,
    steps=60,
    learning_rate=0.05,
  )
  assert found.subspace_Dxr.shape == (D, 2)
  np.testing.assert_allclose(found.subspace_Dxr.T @ found.subspace_Dxr, np.eye(2), atol=1e-5)
  assert found.losses[-1] < found.losses[0] and found.accuracy >= found.random_accuracy, found
