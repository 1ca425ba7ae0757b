"""Named points (layers.point) and what reads and changes them (transformer.interp.interventions)."""

import functools
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import layers, tokenizers
from transformer.errors import UserError
from transformer.interp import interventions, patching, probes
from transformer.interp.interventions import Patch
from transformer.layers import heads
from transformer.layers.points import TL_NAMES, TL_OUTSIDE, Point, functions_at
from transformer.models.gpt import GPT, GPTConfig
from transformer.models.seq2seq import Transformer, preset

from conftest import REPO, compiled_apply, compiled_init, nontrivial_png, replaced

CFG = GPTConfig().replace(vocab_size=40, max_len=16, num_layers=2, num_heads=2, d_model=16)
TOKENS = np.array([[3, 7, 1, 9, 4, 4, 12, 5], [8, 2, 2, 6, 11, 3, 1, 0]], np.int32)


def _corrupted(tokens_BxT, position=2, token=30):
  """A copy of the tokens with every row's `position` set to `token`."""
  return replaced(tokens_BxT, (slice(None), position), token)


@functools.lru_cache  # initialised once per config in a test process (tests copy what they change)
def _params(cfg=CFG):
  return compiled_init(GPT(cfg), TOKENS)


def test_a_run_that_asks_for_nothing_compiles_to_the_same_program(monkeypatch):
  """The training step's program with the named points and with none (`point` the identity)."""
  params = _params()

  def lowered():
    loss = lambda p: jnp.mean(GPT(CFG).apply({"params": p}, TOKENS))
    return jax.jit(jax.value_and_grad(loss)).lower(params).as_text()

  with_points = lowered()
  monkeypatch.setattr(layers, "point", lambda module, name, x: x)
  assert lowered() == with_points


def test_a_function_at_named_points_makes_only_what_they_need(monkeypatch):
  """`functions_at(fn, names)`: a function at the MLP's output alone leaves the attention, its per-head results
  and the norms as a plain run has them (the same program); one that fixes the pattern takes the fused q/k/v
  projection part by part, so that the gradient through the fixed pattern computes no product for q and k."""
  params, tokens = _params(), jax.device_put(TOKENS)

  def gradient(names, fn=lambda path, x: x):
    def run(p, x_BxTxD):  # a gradient with respect to the stream: the attribution graph's backward pass
      def added(path, x):
        return fn(path, x) + x_BxTxD if path[-1] == "embed" else fn(path, x)

      with functions_at(added, names):
        return jnp.sum(GPT(CFG).apply({"params": p}, tokens))

    return jax.jit(jax.grad(run, argnums=1)).lower(params, np.zeros((2, 8, 16), np.float32))

  assert gradient({"embed", "mlp_out"}).as_text() == gradient({"embed"}).as_text()
  assert gradient({"embed", "mlp_out"}).as_text() != gradient(None).as_text()  # every point: results, reference path
  fixed = {"pattern": np.full((2, 2, 8, 8), 1 / 8, np.float32)}
  flops = lambda: gradient({"embed", "pattern"}, lambda path, x: fixed.get(path[-1], x)).cost_analysis()["flops"]
  apart = flops()
  monkeypatch.setattr(heads, "_apart", lambda module: False)  # the fused product, as a plain run has it
  fused = flops()
  # q's and k's share of the projection's gradient: 2 x (B T) x D x (H K) x 2 flops a layer, two layers
  assert fused - apart == pytest.approx(2 * 2 * 16 * 16 * 16 * 2 * 2, rel=0.2)


def test_every_named_point_is_read_with_a_layer_axis():
  logits, cache = interventions.run_with_cache(GPT(CFG), _params(), TOKENS)
  B, T, H, K, D, L = 2, 8, 2, 8, 16, 2
  want = {
    "embed": (B, T, D),
    "pos_embed": (1, T, D),  # the same positions for every row (none given)
    "resid_pre": (L, B, T, D),
    "ln_1.scale": (L, B, T, 1),
    "ln_1.normalized": (L, B, T, D),
    "q": (L, B, T, H, K),
    "k": (L, B, T, H, K),
    "v": (L, B, T, H, K),
    "attn_scores": (L, B, H, T, T),
    "pattern": (L, B, H, T, T),
    "z": (L, B, T, H, K),
    "result": (L, B, T, H, D),
    "attn_out": (L, B, T, D),
    "resid_mid": (L, B, T, D),
    "mlp_in": (L, B, T, D),
    "ln_2.scale": (L, B, T, 1),
    "ln_2.normalized": (L, B, T, D),
    "mlp_input": (L, B, T, D),
    "mlp_pre": (L, B, T, 4 * D),
    "mlp_post": (L, B, T, 4 * D),
    "mlp_output": (L, B, T, D),
    "mlp_out": (L, B, T, D),
    "resid_post": (L, B, T, D),
    "ln_f.scale": (B, T, 1),
    "ln_f.normalized": (B, T, D),
    "final_norm": (B, T, D),
    "logits": (B, T, CFG.vocab_size),
  }
  assert {name: x.shape for name, x in cache.items()} == want
  np.testing.assert_allclose(cache["logits"], logits, atol=1e-6)
  np.testing.assert_allclose(cache["resid_pre"][1], cache["resid_post"][0], atol=1e-6)  # the stream flows on
  np.testing.assert_allclose(cache["pattern"].sum(-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(cache["result"].sum(3), cache["attn_out"], atol=1e-5)  # the biases start at zero
  # Each head's copies of the stream are read by name (a cache that names nothing leaves them out).
  _, heads_in = interventions.run_with_cache(GPT(CFG), _params(), TOKENS, names=("q_input", "v_input"))
  assert heads_in["q_input"].shape == (L, B, T, H, D)
  np.testing.assert_allclose(heads_in["v_input"][:, :, :, 1], cache["resid_pre"], atol=1e-6)
  _, some = interventions.run_with_cache(GPT(CFG), _params(), TOKENS, names=("pattern",))
  assert list(some) == ["pattern"]
  np.testing.assert_allclose(some["pattern"], cache["pattern"], atol=1e-7)
  with pytest.raises(KeyError, match="no named point 'hook_q'"):
    interventions.run_with_cache(GPT(CFG), _params(), TOKENS, names=("hook_q",))


def _table_names() -> dict[str, list[str]]:
  """{our name: TransformerLens's names} as the interventions' docstring table lists a block's points."""
  table = {}
  for row in interventions.__doc__.splitlines():
    cells = [c.strip() for c in row.split("|")[1:-1]]
    if len(cells) == 3 and cells[0].startswith("`"):
      ours = [w for w in cells[0].split("`")[1::2] if not w.startswith("ln_2.")]
      table.update(zip(ours, [w for w in cells[1].split("`")[1::2] if not w.startswith("ln2.")]))
  return table


def test_every_transformer_lens_name_parses_to_ours_and_back():
  """Each name of the docstring's table and outside the blocks: TransformerLens's parses to ours and
  formats back; ours with a block and a head reads back; a TransformerLens-shaped name it does not have
  is one error naming the ones it has."""
  table = _table_names()
  assert len(table) == 25 and {k: TL_NAMES[k] for k in table} == table  # the docstring agrees with the map
  for ours, tl in TL_NAMES.items():
    point = Point.parse(f"blocks.3.{tl}")
    assert point == Point(ours, 3) == Point.parse(f"L3.{ours}") and point.tl_name() == f"blocks.3.{tl}"
    assert Point.parse(tl) == Point(ours)  # without its block, as circuit-tracer's config.yaml names its hooks
  for ours, tl in TL_OUTSIDE.items():
    assert Point.parse(tl) == Point(ours) == Point.parse(ours) and Point(ours).tl_name() == tl
  assert str(Point("z", 3, 5)) == "L3H5.z" and Point.parse("L3H5.z") == Point("z", 3, 5)
  assert Point.parse("encoder.pattern") == Point("encoder.pattern")
  with pytest.raises(KeyError, match="no named point 'blocks.0.hook_nothing'.*blocks.{l}.hook_resid_pre"):
    Point.parse("blocks.0.hook_nothing")
  with pytest.raises(KeyError, match="'cross_attn.q' in block 1 has no TransformerLens name"):
    Point("cross_attn.q", 1).tl_name()


def test_a_cache_read_by_transformer_lens_names_equals_the_one_read_by_ours():
  """run_with_cache kept by TransformerLens's names, read by them (and by ours with a block and a head),
  gives exactly ours; a patch keyed by either name is the same patch."""
  _, ours = interventions.run_with_cache(GPT(CFG), _params(), TOKENS, names=("resid_post", "pattern", "embed"))
  tl_names = ("blocks.1.hook_resid_post", "blocks.0.attn.hook_pattern", "hook_embed")
  _, theirs = interventions.run_with_cache(GPT(CFG), _params(), TOKENS, names=tl_names)
  assert sorted(theirs) == ["embed", "pattern", "resid_post"]
  np.testing.assert_array_equal(theirs["blocks.1.hook_resid_post"], ours["resid_post"][1])
  np.testing.assert_array_equal(theirs["blocks.0.attn.hook_pattern"], ours["pattern"][0])
  np.testing.assert_array_equal(theirs["hook_embed"], ours["embed"])
  np.testing.assert_array_equal(theirs["L0H1.pattern"], ours["pattern"][0][:, 1])
  np.testing.assert_array_equal(theirs[Point("resid_post", 0)], ours["resid_post"][0])
  with pytest.raises(KeyError, match="'resid_post' has no heads' axis"):
    theirs["L0H1.resid_post"]
  steer = Patch.steer(np.ones(16, np.float32))
  by_tuple = interventions.run_with_patches(GPT(CFG), _params(), TOKENS, patches={("resid_pre", 1): steer})
  by_tl = interventions.run_with_patches(GPT(CFG), _params(), TOKENS, patches={"blocks.1.hook_resid_pre": steer})
  np.testing.assert_array_equal(by_tl, by_tuple)
  with pytest.raises(KeyError, match="names layer 0 and layer 1"):
    interventions.run_with_patches(GPT(CFG), _params(), TOKENS, patches={("blocks.0.hook_resid_pre", 1): steer})


def test_the_cached_read_equals_what_look_inside_reports():
  tokenizer = tokenizers.CharTokenizer.from_corpus("to be or not to be")
  cfg = CFG.replace(vocab_size=tokenizer.vocab_size)
  params = _params(cfg)
  inside = probes.look_inside(GPT(cfg), params, tokenizer, "to be or not")
  _, cache = interventions.run_with_cache(
    GPT(cfg), params, jnp.asarray([tokenizer.encode("to be or not")]), names=("pattern", "resid_post")
  )
  np.testing.assert_allclose(cache["pattern"][:, 0], inside.attention_LxHxTxT, atol=1e-6)
  np.testing.assert_allclose(cache["resid_post"][:, 0], inside.residual_LxTxD[1:], atol=1e-6)


def test_scanned_layers_read_and_patch_as_unrolled_ones():
  scanned = CFG.replace(scan_layers=True)
  params = _params()
  stacked = {**params, "h": layers.stack_layers(params["h"], CFG.num_layers)}
  _, unrolled_cache = interventions.run_with_cache(GPT(CFG), params, TOKENS)
  _, scanned_cache = interventions.run_with_cache(GPT(scanned), stacked, TOKENS)
  for name, x in unrolled_cache.items():
    np.testing.assert_allclose(scanned_cache[name], x, atol=1e-5, err_msg=name)
  patch = {("z", 1): Patch.ablate(where=jnp.arange(2)[:, None] == 0)}  # ablate head 0 of layer 1
  np.testing.assert_allclose(
    interventions.run_with_patches(GPT(scanned), stacked, TOKENS, patches=patch),
    interventions.run_with_patches(GPT(CFG), params, TOKENS, patches=patch),
    atol=1e-5,
  )


_SHARDED = r"""
import json, sys
sys.path.insert(0, {repo!r}); sys.path.insert(0, {tests!r})
import jax, jax.numpy as jnp, flax.linen as nn
from jax.sharding import NamedSharding, PartitionSpec
from test_interventions import CFG, _params, _sharded_case
from transformer import sharding
from transformer.models.gpt import GPT
mesh, rules = sharding.make_mesh((2, 2, 2)), sharding.DEFAULT_RULES
with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
  boxed = jax.eval_shape(lambda: GPT(CFG).init(jax.random.key(0), jnp.zeros((1, 8), "int32"))["params"])
  params = jax.device_put(nn.unbox(_params()), sharding.logical_shardings(mesh, boxed, rules))
  assert len(params["h"]["layer_0"]["attn"]["qkv"]["kernel"].sharding.device_set) == 8
  tokens = jax.device_put(_sharded_case()[0], NamedSharding(mesh, PartitionSpec(("data", "fsdp"))))
  print(json.dumps({{k: jnp.asarray(v).tolist() for k, v in _sharded_case(params, tokens).items()}}))
"""


def _sharded_case(params=None, tokens=None):
  """A patched run (a head ablated, a position of the residual stream replaced) and a cached read on
  4 rows; with no arguments, the tokens alone."""
  if tokens is None:
    tokens = jnp.concatenate([TOKENS, TOKENS[::-1] + 1])
  if params is None:
    return (tokens,)
  model = GPT(CFG)
  _, cache = interventions.run_with_cache(model, params, tokens, names=("resid_pre", "pattern"))
  patches = {
    **interventions.ablating([(1, 0)], CFG.block.num_heads),
    ("resid_pre", 1): Patch.replace(cache["resid_pre"][1][::-1], where=(jnp.arange(8) == 3)[:, None]),
  }
  patched = interventions.run_with_patches(model, params, tokens, patches=patches)
  return {"patched": patched, "pattern": cache["pattern"]}


@pytest.mark.slow
def test_a_patched_run_on_8_devices_equals_one_on_1():
  """Parameters sharded as training shards them (data 2 x fsdp 2 x tensor 2), the batch split: the
  patched logits and the read pattern are those of one device."""
  code = _SHARDED.format(repo=str(REPO), tests=str(REPO / "tests"))
  env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8"}
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  sharded = json.loads(proc.stdout.strip().splitlines()[-1])
  [tokens] = _sharded_case()
  for name, x in _sharded_case(_params(), tokens).items():
    np.testing.assert_allclose(np.asarray(sharded[name]), x, atol=1e-5, err_msg=name)


def test_patches_replace_exactly_what_they_name():
  model, params = GPT(CFG), _params()
  plain, clean = interventions.run_with_cache(model, params, TOKENS)
  # A patch that replaces nothing and adds nothing: the plain logits (to rounding: another program).
  nothing = {("resid_pre", 0): Patch.replace(5.0, where=False), ("mlp_post", 1): Patch.steer(1.0, where=False)}
  np.testing.assert_allclose(interventions.run_with_patches(model, params, TOKENS, patches=nothing), plain, atol=1e-6)
  # Every position of resid_pre at layer 0 from the clean run, into a corrupted run: the clean logits.
  corrupt = _corrupted(TOKENS)
  everywhere = {("resid_pre", 0): Patch.replace(clean["resid_pre"][0])}
  np.testing.assert_allclose(
    interventions.run_with_patches(model, params, corrupt, patches=everywhere), plain, atol=1e-5
  )
  # Ablating a head at layer 1 leaves everything below it as it was, and changes the output.
  ablate = Patch.ablate(where=jnp.arange(2)[:, None] == 1)  # z is B x T x H x K: head 1
  collection = interventions.patches_collection(model, params, {("z", 1): ablate}, TOKENS)
  output, state = jax.jit(lambda p, c: model.apply({"params": p, "patches": c}, TOKENS, mutable=["activations"]))(
    params, collection
  )
  ablated = interventions.flatten(state["activations"])
  for name in ("resid_pre", "q", "pattern", "z"):
    np.testing.assert_allclose(ablated[name][0], clean[name][0], atol=1e-6, err_msg=name)
  np.testing.assert_array_equal(ablated["z"][1][:, :, 1], 0.0)
  np.testing.assert_array_equal(ablated["z"][1][:, :, 0], clean["z"][1][:, :, 0])
  assert np.abs(np.asarray(output - plain)).max() > 1e-6


def test_an_attention_only_gpt_has_no_mlp():
  cfg = CFG.replace(attention_only=True)
  params = _params(cfg)
  assert "mlp" not in params["h"]["layer_0"] and "ln_2" not in params["h"]["layer_0"]
  _, cache = interventions.run_with_cache(GPT(cfg), params, TOKENS)
  assert "mlp_post" not in cache and "mlp_out" not in cache
  np.testing.assert_array_equal(cache["resid_mid"], cache["resid_post"])


def test_an_encoder_decoder_names_its_points_by_stack():
  cfg = preset("cpu-tiny", vocab_size=30, dropout_rate=0.0)
  model = Transformer(cfg)
  source, target = jnp.array([[3, 4, 5, 6]]), jnp.array([[1, 7, 8]])
  params = compiled_init(model, source, target)
  _, cache = interventions.run_with_cache(model, params, source, target)
  L, H = cfg.num_layers, cfg.block.num_heads
  assert cache["encoder.pattern"].shape == (L, 1, H, 4, 4)
  assert cache["decoder.pattern"].shape == (L, 1, H, 3, 3)
  assert cache["decoder.cross_attn.pattern"].shape == (L, 1, H, 3, 4)
  assert {"decoder.cross_attn_out", "decoder.resid_mid_cross", "encoder.resid_post"} <= set(cache)


@pytest.mark.parametrize(
  "changes", [{}, {"norm": "rms_norm", "tie_embeddings": False, "positions": "rope", "use_bias": False}]
)
def test_the_logit_attribution_sums_to_the_logit(changes):
  cfg = CFG.replace(**changes)
  model, params = GPT(cfg), _params(cfg)
  target = (TOKENS * 3 + 1) % cfg.vocab_size
  parts = interventions.run_with_cache(model, params, TOKENS)[1].direct_logit_attribution(target)
  _, cache = interventions.run_with_cache(model, params, TOKENS, names=("logits",))
  want = jnp.take_along_axis(cache["logits"], target[..., None], -1)[..., 0]
  np.testing.assert_allclose(sum(parts.values()), want, atol=1e-4)
  assert {"L0.H0", "L1.H1", "L1.mlp", "embed"} <= set(parts)


def _planted(num_layers: int, a: float = 3.0):
  """An attention-only GPT whose weights are set by hand (Elhage et al. 2021's circuits, in a
  residual stream of 32 dims: 0-15 the position, one-hot; 16-23 the token, one-hot; 24-31 the
  token before it, copied there). Layer 0, head 0 attends to the previous token and copies its
  identity; layer 1, head 0 attends to where the token before was the current one (induction) and
  copies the token there into the output (the head reads token directions through the tied embedding).
  Every other head has zero queries and keys: it attends uniformly."""
  cfg = GPTConfig(vocab_size=8, max_len=16, num_layers=num_layers).replace(d_model=32, num_heads=2, attention_only=True)
  params = jax.tree.map(np.array, nn.unbox(_params(cfg)))
  params["wpe"][:] = np.eye(16, 32)
  params["wte"]["embedding"][:] = np.eye(8, 32, k=16)
  # `a`: the query and key scale (3: sharp attention)
  for i in range(num_layers):
    attn = params["h"][f"layer_{i}"]["attn"]
    attn["qkv"]["kernel"][:] = 0.0
    attn["out"]["kernel"][:] = 0.0
    qkv = attn["qkv"]["kernel"]  # D x (q, k, v) x H x K
    if i == 0:
      for p in range(1, 16):
        qkv[p, 0, 0, p - 1] = a  # query of position p: "position p - 1"
      for p in range(16):
        qkv[p, 1, 0, p] = a  # key of position p: "position p"
      for v in range(8):
        qkv[16 + v, 2, 0, v] = 1.0  # value: the token's identity
        attn["out"]["kernel"][0, v, 24 + v] = 0.25  # written where layer 1 reads "the token before"
    else:
      for v in range(8):
        qkv[16 + v, 0, 0, v] = a  # query: "my token is v"
        qkv[24 + v, 1, 0, v] = a  # key: "the token before me was v"
        qkv[16 + v, 2, 0, v] = 1.0  # value: the token's identity, copied where the (tied) head reads
        attn["out"]["kernel"][0, v, 16 + v] = 4.0  # tokens: the next token is predicted
  return GPT(cfg), params


@pytest.mark.parametrize("num_layers", [1, 2])
def test_the_head_detectors_name_exactly_the_planted_heads(num_layers):
  model, params = _planted(num_layers)
  permutations = np.stack([np.random.default_rng(i).permutation(8) for i in range(6)])
  tokens = jnp.asarray(np.concatenate([permutations, permutations], axis=1))  # no token twice in a copy
  scores = interventions.head_scores(model, params, tokens)
  found = {kind: {tuple(ix) for ix in np.argwhere(np.asarray(s) > 0.5)} for kind, s in scores.items()}
  assert found == {
    "previous_token": {(0, 0)},
    "duplicate_token": set(),
    "induction": {(1, 0)} if num_layers == 2 else set(),
  }, scores
  assert interventions.repeated_random_tokens(8, 5, 3).shape == (3, 10)


@pytest.mark.parametrize("over,name", [("positions", "resid_pre"), ("heads", "z")])
def test_a_patching_sweep_is_each_patch_run_alone(over, name):
  model, params = GPT(CFG), _params()
  corrupt = _corrupted(TOKENS)
  metric = lambda logits: logits[:, -1, 5].mean() - logits[:, -1, 7].mean()  # a logit difference
  sweep = patching.patching_sweep(model, params, TOKENS, corrupt, metric, over=over)
  _, clean = interventions.run_with_cache(model, params, TOKENS, names=(name,))
  pieces = clean[name].shape[2] if over == "positions" else clean[name].shape[3]
  assert sweep.shape == (CFG.num_layers, pieces)
  for layer, piece in [(0, 0), (1, pieces - 1), (0, 2 % pieces)]:
    where = jnp.arange(pieces) == piece
    where = where[None, :, None] if over == "positions" else where[:, None]
    alone = interventions.run_with_patches(
      model, params, corrupt, patches={(name, layer): Patch.replace(clean[name][layer], where=where)}
    )
    np.testing.assert_allclose(sweep[layer, piece], metric(alone), atol=1e-5)
  if over == "positions":  # the corrupted token's own position at layer 0 restores the clean run
    plain, _ = interventions.run_with_cache(model, params, TOKENS, names=())
    np.testing.assert_allclose(sweep[0, 2], metric(plain), atol=1e-5)


def test_a_sweep_runs_at_a_length_bucket_and_a_prompt_of_a_nearby_length_compiles_no_new_sweep(monkeypatch):
  """A sweep's runs go at the prompt's length bucket (9 tokens at 10), filler after the prompt: the same metrics
  as at the prompt's own length, or with the metric inside the sweep's program (where the streams it reads would
  be too large to return), over positions, heads and a pattern's queries with a value given at the prompt's
  length; a prompt of another length in the bucket reuses the program. Attribution patching's estimates too."""
  model, params = GPT(CFG), _params()
  last = lambda logits: logits[:, -1, 5].mean() - logits[:, -1, 7].mean()
  reads_two = lambda logits: logits[:, -3, 5].mean() - logits[:, -1, 7].mean()
  tokens = np.concatenate([TOKENS, TOKENS[:, :2]], axis=1)
  clean, corrupt = tokens[:, :9], _corrupted(tokens[:, :9])
  sweep = functools.partial(patching.patching_sweep, model, params, clean, corrupt)
  padded = sweep(last)
  estimate = patching.attribution_patching(model, params, clean, corrupt, last)
  compiled = patching._patched_runs._cache_size(), patching._attribution_effects._cache_size()
  patching.patching_sweep(model, params, tokens, _corrupted(tokens), last)  # 10: 9's bucket
  patching.attribution_patching(model, params, tokens, _corrupted(tokens), last)
  assert (patching._patched_runs._cache_size(), patching._attribution_effects._cache_size()) == compiled
  own = patching.attribution_patching(model, params, clean, corrupt, last, padded_length=9)
  assert estimate.shape == (2, 9)
  np.testing.assert_allclose(estimate, own, atol=1e-6)
  by_head = functools.partial(patching.attribution_patching, model, params, clean, corrupt, reads_two, over="heads")
  np.testing.assert_allclose(by_head(), by_head(padded_length=9), atol=1e-6)
  assert padded.shape == (2, 9)
  np.testing.assert_allclose(padded, sweep(last, padded_length=9), atol=1e-6)
  np.testing.assert_allclose(sweep(reads_two, over="heads"), sweep(reads_two, over="heads", padded_length=9), atol=1e-6)
  ablated = {"point": "pattern", "value_LxBx": jnp.zeros((2, 2, 2, 9, 9))}
  with monkeypatch.context() as m:
    m.setattr(patching, "_STREAMS_BYTES", 0)
    np.testing.assert_allclose(sweep(last), padded, atol=1e-6)
    inside = sweep(last, **ablated)
  np.testing.assert_allclose(sweep(last, **ablated), inside, atol=1e-6)
  with pytest.raises(UserError, match="padded_length=8: give one from the prompt's 9 tokens"):
    sweep(last, padded_length=8)


@pytest.mark.parametrize("over", ["positions", "heads"])
def test_attribution_patching_approximates_real_patching(over):
  model, params = GPT(CFG), _params()
  corrupt = _corrupted(TOKENS)
  metric = lambda logits: logits[:, -1, 5].mean() - logits[:, -1, 7].mean()
  corrupted, _ = interventions.run_with_cache(model, params, corrupt, names=())
  real = patching.patching_sweep(model, params, TOKENS, corrupt, metric, over=over) - metric(corrupted)
  approx = patching.attribution_patching(model, params, TOKENS, corrupt, metric, over=over)
  assert approx.shape == real.shape
  assert np.corrcoef(np.ravel(real), np.ravel(approx))[0, 1] > 0.9, (real, approx)


def test_the_in_context_score_is_late_loss_minus_early_loss():
  model, params = GPT(CFG), _params()
  tokens = interventions.repeated_random_tokens(CFG.vocab_size, 8, batch=3)  # 16 tokens: tenths of 1
  logits = np.asarray(compiled_apply(GPT(CFG), {"params": params}, tokens), np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp[:, :-1], np.asarray(tokens)[:, 1:, None], -1)[..., 0]
  want = nll[:, -1].mean() - nll[:, 0].mean()
  np.testing.assert_allclose(interventions.in_context_score(model, params, tokens), want, atol=1e-4)


@pytest.mark.slow
def test_a_run_logs_its_heads_scores_at_every_evaluation(tmp_path):
  from experiments import shakespeare
  from transformer import metrics, train

  config = shakespeare.get_config("tiny")
  config.data.root = str(tmp_path / "data")
  config.model.block.attention_only = True
  config.head_scores = True
  train.train_and_evaluate(config, tmp_path / "w")
  evaluations = [r for r in metrics.read_jsonl(tmp_path / "w" / "metrics.jsonl") if "val_loss" in r]
  assert [r["step"] for r in evaluations] == [20, 40]
  for record in evaluations:
    induction = [record[f"induction_L{l}H{h}"] for l in range(2) for h in range(2)]
    assert all(0.0 <= s <= 1.0 for s in induction) and np.isfinite(record["in_context_score"])
    assert {"previous_token_L1H0", "duplicate_token_L0H1"} <= set(record)
  nontrivial_png(tmp_path / "w" / "heads.png")


def test_ablating_zeroes_the_named_heads_and_losses_come_per_position():
  """`ablating` zeroes exactly the heads it names (layer 1's both, here), or sets them to their mean
  over a reference batch; `next_token_losses` gives one loss per predicting position, the same with
  no patches."""
  model, params = _planted(2)
  tokens = interventions.repeated_random_tokens(8, 8, batch=4)
  plain = interventions.next_token_losses(model, params, tokens)
  assert plain.shape == (15,)
  np.testing.assert_allclose(interventions.next_token_losses(model, params, tokens, {}), plain)
  patches = interventions.ablating([(1, 0), (1, 1)], 2)
  _, ablated = interventions.run_with_cache(model, params, tokens, names=("z",))
  collection = interventions.patches_collection(model, params, patches, tokens)
  _, state = compiled_apply(model, {"params": params, "patches": collection}, tokens, mutable=["activations"])
  np.testing.assert_array_equal(interventions.flatten(state["activations"])["z"][1], 0.0)
  # Mean ablation: head 1 of layer 0 writes its mean output over a reference batch, everywhere.
  reference = interventions.repeated_random_tokens(8, 8, batch=4, seed=1, ids=[2, 3, 5])
  assert set(np.unique(np.asarray(reference))) <= {2, 3, 5}
  _, ref = interventions.run_with_cache(model, params, reference, names=("z",))
  patches = interventions.ablating([(0, 1)], 2, "mean", ref["z"])
  collection = interventions.patches_collection(model, params, patches, tokens)
  _, state = compiled_apply(model, {"params": params, "patches": collection}, tokens, mutable=["activations"])
  z = interventions.flatten(state["activations"])["z"]
  np.testing.assert_allclose(
    z[0][:, :, 1], np.broadcast_to(ref["z"][0][:, :, 1].mean((0, 1)), z[0][:, :, 1].shape), atol=1e-6
  )
  np.testing.assert_array_equal(z[0][:, :, 0], ablated["z"][0][:, :, 0])
