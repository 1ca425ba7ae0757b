"""The layers both model families are built from, one concern a module:

  config      BlockConfig (config.model.block) and every check of a model's blocks; the activations
  params      dtypes, initialisers, Projection (every block's matrices), the norms
  positions   sinusoidal and rotary positions, positions within packed segments, the masks
  mechanisms  how self-attention makes its scores: dot products, the Synthesizer's; register_mechanism
  attention   softmax(scores) V (mix, attend), SelfAttention and CrossAttention
  heads       queries, keys and values per head (fused, or grouped-query) and each head's output
  kv_cache    decoding's cache: the new tokens' positions and mask, the keys' and values' layouts
  points      the named points where transformer.interp.interventions reads and patches a run
  block       MLP, Block, Stack (unrolled or scanned, remat), stack_layers/unstack_layers

Conventions (nanodo's): tensors carry their shapes in their names, with
  B batch, T query length, S key/value length, D model width, H heads, K head width (D = H*K),
  F MLP width, V vocabulary (and, beyond the layers: L layers, N rows, Z a dictionary's latents).
Every parameter is created with logical axis names (`nn.with_logical_partitioning`) and the main
activations carry logical constraints, so that sharding is a matter of rules and a mesh
(`transformer.sharding`), never of model edits. Logical names used:
  vocab, embed, heads, kv, mlp, position, layers (params); batch, length, embed, heads, kv, mlp,
  vocab (activations).

Each layer is the reference form, as the papers write it; where `forms` (the model's
`transformer.kernels.resolve` of config.model.kernels) names a faster form of an op, the layer asks
`transformer.kernels.form` for it, the one table of which op runs which form. Everything is
importable from here: `layers.Block`, `layers.MECHANISMS`, ...
"""

from transformer.layers.attention import CrossAttention, SelfAttention, attend, attend_cached, mix
from transformer.layers.block import MLP, Block, Stack, stack_layers, unstack_layers
from transformer.layers.config import (
  ACTIVATIONS,
  ATTENTION_IMPLEMENTATIONS,
  BRANCH_NORMS,
  GATED,
  KERNEL_INITS,
  NORMS,
  REMAT_POLICIES,
  ROTARY_LAYOUTS,
  ROTARY_SCALINGS,
  BlockConfig,
  RotaryConfig,
  check_block_config,
  check_model_config,
  check_remat_policy,
  dtype,
  replace_model,
)
from transformer.layers.kv_cache import CACHE_LAYOUTS, CachePositions
from transformer.layers.mechanisms import (
  MECHANISMS,
  Mechanism,
  dot_product_scores,
  register_mechanism,
  synthesizer_dense_scores,
  synthesizer_random_scores,
)
from transformer.layers.params import Projection, norm, projections
from transformer.layers.points import point
from transformer.layers.positions import (
  SINUSOID_LAYOUTS,
  causal_mask,
  rotary,
  rotary_frequencies,
  segment_positions,
  self_attention_mask,
  sinusoidal_positions,
  window_mask,
)

__all__ = [
  "ACTIVATIONS",
  "ATTENTION_IMPLEMENTATIONS",
  "BRANCH_NORMS",
  "GATED",
  "CACHE_LAYOUTS",
  "KERNEL_INITS",
  "MECHANISMS",
  "MLP",
  "NORMS",
  "REMAT_POLICIES",
  "ROTARY_LAYOUTS",
  "ROTARY_SCALINGS",
  "RotaryConfig",
  "SINUSOID_LAYOUTS",
  "Block",
  "BlockConfig",
  "CachePositions",
  "CrossAttention",
  "Mechanism",
  "Projection",
  "SelfAttention",
  "Stack",
  "attend",
  "attend_cached",
  "causal_mask",
  "check_block_config",
  "check_model_config",
  "check_remat_policy",
  "dot_product_scores",
  "dtype",
  "mix",
  "norm",
  "point",
  "projections",
  "register_mechanism",
  "replace_model",
  "rotary",
  "rotary_frequencies",
  "segment_positions",
  "self_attention_mask",
  "sinusoidal_positions",
  "stack_layers",
  "synthesizer_dense_scores",
  "synthesizer_random_scores",
  "unstack_layers",
  "window_mask",
]
