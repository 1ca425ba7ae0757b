"""The block (self-attention, optional cross-attention, MLP, each a residual branch) and the stack of
them, unrolled or scanned, with rematerialisation; params converted between the two layouts."""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.layers.attention import CrossAttention, SelfAttention
from transformer.layers.config import ACTIVATIONS, GATED, REMAT_POLICIES, BlockConfig, check_remat_policy
from transformer.layers.params import norm, projections
from transformer.layers.points import point


class MLP(nn.Module):
  cfg: BlockConfig
  residual_std: float = 0.02
  forms: str = "reference"

  @nn.compact
  def __call__(self, x_BxTxD):
    cfg, projection = self.cfg, projections(self.cfg, self.forms)
    # What the MLP itself reads, after the norm before it (its weight and bias applied): circuit-tracer's
    # mlp.hook_in, where its published transcoders read (`mlp_in` is the stream before that norm).
    x_BxTxD = point(self, "mlp_input", x_BxTxD)
    h_BxTxF = projection((cfg.mlp_width,), ("embed", "mlp"), name="fc")(x_BxTxD)
    if cfg.activation in GATED:  # gated: silu (gelu) of a second projection of x scales each hidden unit
      gate_BxTxF = point(self, "mlp_pre", projection((cfg.mlp_width,), ("embed", "mlp"), name="gate")(x_BxTxD))
      h_BxTxF = ACTIVATIONS[cfg.activation](gate_BxTxF) * point(self, "mlp_pre_linear", h_BxTxF)
    else:
      # The activation's backward pass recomputes it from its saved input (jax.checkpoint). Autodiff
      # would save the tanh GELU's tanh instead and rebuild the input from the product's output and
      # the bias, so that its backward pass would read three B x T x F tensors, not two. The same
      # losses and gradients; without a gradient it is the plain activation.
      h_BxTxF = jax.checkpoint(ACTIVATIONS[cfg.activation])(point(self, "mlp_pre", h_BxTxF))
    h_BxTxF = nn.with_logical_constraint(point(self, "mlp_post", h_BxTxF), ("batch", "length", "mlp"))
    # What it writes, before a norm after it (Gemma 2's post-feedforward norm; `mlp_out` is after that norm,
    # what the block adds): circuit-tracer's mlp.hook_out
    out_BxTxD = projection((cfg.d_model,), ("mlp", "embed"), std=self.residual_std, name="proj")(h_BxTxF)
    return point(self, "mlp_output", out_BxTxD)


class Block(nn.Module):
  """Self-attention, optional cross-attention, MLP; each a residual branch with LayerNorm before
  it (pre-LN, GPT-2) or after the sum (post-LN, the 2017 paper). `forms`, `max_len` and `rope` are
  the model's (see SelfAttention)."""

  cfg: BlockConfig
  cross_attention: bool = False
  residual_std: float = 0.02
  deterministic: bool = True  # no dropout; an attribute, not an argument, so scan/remat see no bool
  decode: bool = False  # self-attention through a KV cache
  forms: str = "reference"
  max_len: int = 0
  rope: bool = False
  # The output at the last position only (B x 1 x D): keys and values at every position, the query,
  # the attention's output and the MLP at the last (GPT's `last_only`: the last block of a model whose
  # loss reads that position alone).
  last_only: bool = False
  local: bool = True  # a sliding-window layer (block.sliding_window), not one of the model's global_layers

  @nn.compact
  def __call__(self, x_BxTxD, mask_BxTxT, context_BxSxD=None, context_mask_BxTxS=None, positions=None, local=None):
    """`local`: this layer's kind as a traced bool, in a scanned mix of local and global layers (else
    the `local` attribute)."""
    cfg, deterministic = self.cfg, self.deterministic
    drop = nn.Dropout(cfg.dropout_rate)

    def residual(x, branch, normalise, out: str, into: str | None = None, after=None):
      """x + the branch's output (the named point `out`); `into`: a named point of the branch's own
      copy of its input (before the norm), which a patch changes for this branch alone. Pre-LN:
      `normalise` (None: none) before the branch and `after` on its output (block.branch_norms)."""
      branch_input = point(self, into, x) if into else x
      if cfg.pre_layer_norm:
        y = branch(normalise(branch_input) if normalise is not None else branch_input)
        y = point(self, out, after(y) if after is not None else y)
        return x[:, -y.shape[1] :] + drop(y, deterministic=deterministic)  # (the last position: last_only)
      return normalise(x + drop(point(self, out, branch(branch_input)), deterministic=deterministic))

    common = dict(forms=self.forms, residual_std=self.residual_std, decode=self.decode)
    attn = SelfAttention(cfg, max_len=self.max_len, rope=self.rope, local=self.local, name="attn", **common)
    x_BxTxD = point(self, "resid_pre", x_BxTxD)
    if self.last_only and (self.cross_attention or not cfg.pre_layer_norm):
      raise ValueError("last_only is for pre-LN blocks without cross-attention (a GPT's)")
    ln_1, ln_attn_out = self._branch_norms("ln_1", "ln_attn_out")
    per_head_inputs = self._per_head_inputs(x_BxTxD)

    def self_attention(h):
      if per_head_inputs is not None:  # each head's queries, keys and values from their own streams
        h = tuple(ln_1(x, points=False) if cfg.pre_layer_norm and ln_1 is not None else x for x in per_head_inputs)
      return attn(
        h, mask_BxTxT, positions=positions, deterministic=deterministic, last_query=self.last_only, local=local
      )

    if cfg.parallel:  # GPT-NeoX: x + attn(ln_1(x)) + mlp(ln_2(x)), no stream between them
      return self._parallel(x_BxTxD, self_attention, ln_1, drop)
    x_BxTxD = residual(x_BxTxD, self_attention, ln_1, "attn_out", after=ln_attn_out)
    x_BxTxD = point(self, "resid_mid", x_BxTxD)
    if self.cross_attention:
      cross = CrossAttention(cfg, name="cross_attn", **common)
      x_BxTxD = residual(
        x_BxTxD,
        lambda h: cross(h, context_mask_BxTxS, context_BxSxD=context_BxSxD, deterministic=deterministic),
        norm(cfg, "ln_cross"),
        "cross_attn_out",
      )
      x_BxTxD = point(self, "resid_mid_cross", x_BxTxD)
    if not cfg.attention_only:
      mlp = MLP(cfg, residual_std=self.residual_std, forms=self.forms, name="mlp")
      # `mlp_in` (TransformerLens's hook_mlp_in): a patch there reaches the MLP and nothing else
      # (path patching's receivers).
      ln_2, ln_mlp_out = self._branch_norms("ln_2", "ln_mlp_out")
      x_BxTxD = residual(x_BxTxD, mlp, ln_2, "mlp_out", into="mlp_in", after=ln_mlp_out)
    x_BxTxD = point(self, "resid_post", x_BxTxD)
    return nn.with_logical_constraint(x_BxTxD, ("batch", "length", "embed"))

  def _branch_norms(self, before: str, after: str):
    """(the norm before a branch, the norm of its output), either None where block.branch_norms has none."""
    kind = self.cfg.branch_norms
    return (
      norm(self.cfg, before) if kind != "post" or not self.cfg.pre_layer_norm else None,
      norm(self.cfg, after) if kind != "pre" else None,
    )

  def _parallel(self, x_BxTxD, self_attention, ln_1, drop):
    """Attention and MLP from the same stream, both added to it (GPT-NeoX/Pythia's use_parallel_residual).
    As TransformerLens names it: no `resid_mid`; `mlp_in` is a copy of `resid_pre`."""
    deterministic = self.deterministic
    attn_BxTxD = point(self, "attn_out", self_attention(ln_1(x_BxTxD)))
    x_BxTxD = x_BxTxD[:, -attn_BxTxD.shape[1] :]  # (the last position: last_only)
    out_BxTxD = x_BxTxD + drop(attn_BxTxD, deterministic=deterministic)
    if not self.cfg.attention_only:
      mlp = MLP(self.cfg, residual_std=self.residual_std, forms=self.forms, name="mlp")
      mlp_BxTxD = point(self, "mlp_out", mlp(norm(self.cfg, "ln_2")(point(self, "mlp_in", x_BxTxD))))
      out_BxTxD = out_BxTxD + drop(mlp_BxTxD, deterministic=deterministic)
    out_BxTxD = point(self, "resid_post", out_BxTxD)
    return nn.with_logical_constraint(out_BxTxD, ("batch", "length", "embed"))

  def _per_head_inputs(self, x_BxTxD):
    """The residual stream as each head's queries', keys' and values' input (`q_input`, `k_input`,
    `v_input`: B x T x H x D copies, TransformerLens's split qkv inputs), when a run patches one of
    them: then they replace the shared input of attention (None otherwise). A run that only reads
    records the copies (they are the stream itself) and computes attention as always."""
    names = ("q_input", "k_input", "v_input")
    patched = any(self.has_variable("patches", name) for name in names)
    if not patched and not self.is_mutable_collection("activations"):
      return None
    D = x_BxTxD.shape[-1]
    heads = (self.cfg.num_heads, self.cfg.kv_heads, self.cfg.kv_heads)  # keys' and values' at the kv heads
    copies = tuple(
      point(self, name, jnp.broadcast_to(x_BxTxD[:, :, None], (*x_BxTxD.shape[:2], n, D)))
      for name, n in zip(names, heads)
    )
    return copies if patched else None


class Stack(nn.Module):
  """`num_layers` blocks, unrolled (`layer_0`, `layer_1`, ...) or scanned (`layers`, with a leading
  `layers` axis on every parameter: one compiled block, faster compiles for deep models).
  `deterministic` and `decode` are call arguments, as for every model (see transformer.models);
  `forms`, `max_len` and `rope` are the model's (see SelfAttention)."""

  cfg: BlockConfig
  num_layers: int
  scan: bool = False
  remat_policy: str = "none"
  cross_attention: bool = False
  forms: str = "reference"
  max_len: int = 0
  rope: bool = False
  global_layers: tuple[int, ...] = ()  # with block.sliding_window: the layers that see every key

  @nn.compact
  def __call__(
    self,
    x_BxTxD,
    mask_BxTxT,
    context_BxSxD=None,
    context_mask_BxTxS=None,
    *,
    positions=None,
    deterministic: bool = True,
    decode: bool = False,
    last_only: bool = False,
  ):
    """`positions`: (of the queries, of the keys) of self-attention (SelfAttention). `last_only`: the
    last block computes the last position alone (Block.last_only); the output is B x 1 x D."""
    check_remat_policy(self.remat_policy)
    block = self.block(deterministic, decode)
    inputs = (x_BxTxD, mask_BxTxT, context_BxSxD, context_mask_BxTxS, positions)
    if not self.scan:
      for i in range(self.num_layers):
        last = last_only and i == self.num_layers - 1
        x_BxTxD = block(name=f"layer_{i}", last_only=last, local=i not in self.global_layers)(x_BxTxD, *inputs[1:])
      return x_BxTxD
    if last_only:
      raise ValueError("last_only needs unrolled layers (scan_layers=False): the last block has other shapes")
    mixed = 0 < len(set(self.global_layers)) < self.num_layers
    scanned = nn.scan(
      lambda mdl, x, *args: (mdl(x, *args), None),
      variable_axes={"params": 0, "cache": 0, "activations": 0, "patches": 0},
      split_rngs={"params": True, "dropout": True},
      length=self.num_layers,
      in_axes=(nn.broadcast,) * 4 + ((0,) if mixed else ()),
      metadata_params={nn.PARTITION_NAME: "layers"},
    )
    if mixed:  # each layer's kind, scanned with its params: local (windowed) or global
      return scanned(block(name="layers"), *inputs, self.layer_kinds())[0]
    return scanned(block(name="layers", local=not self.global_layers), *inputs)[0]

  def layer_kinds(self) -> jax.Array:
    """L bools: which layers are local (block.sliding_window, rotary.local_theta), not global_layers."""
    return jnp.asarray([i not in self.global_layers for i in range(self.num_layers)])

  def block(self, deterministic: bool = True, decode: bool = False):
    """The kind of block this stack is made of (Block with this stack's settings): each block one of
    them, under the name `layer_<i>` (or scanned, `layers`)."""
    block = Block
    if self.remat_policy != "none" and not decode:  # no backward pass when decoding
      block = nn.remat(Block, policy=REMAT_POLICIES[self.remat_policy], prevent_cse=not self.scan)
    return functools.partial(
      block,
      self.cfg,
      cross_attention=self.cross_attention,
      residual_std=0.02 / math.sqrt(2 * self.num_layers),  # GPT-2's init of the projections into the residual stream
      deterministic=deterministic,
      decode=decode,
      forms=self.forms,
      max_len=self.max_len,
      rope=self.rope,
    )


@functools.partial(jax.jit, static_argnums=1)  # one program, not a stack (or a slice) a leaf and layer
def stack_layers(params: dict, num_layers: int) -> dict:
  """Unrolled params (`layer_0` ... `layer_{n-1}`) -> scanned params (`layers`, leading axis n)."""
  layers = [params[f"layer_{i}"] for i in range(num_layers)]
  rest = {k: v for k, v in params.items() if not k.startswith("layer_")}
  return {**rest, "layers": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}


@functools.partial(jax.jit, static_argnums=1)
def unstack_layers(params: dict, num_layers: int) -> dict:
  """The inverse of `stack_layers`."""
  rest = {k: v for k, v in params.items() if k != "layers"}
  return {**rest, **{f"layer_{i}": jax.tree.map(lambda x: x[i], params["layers"]) for i in range(num_layers)}}
