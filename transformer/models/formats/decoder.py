"""What the open families' config.json files share, read into the one GPT's options: the stored dtype, the
rotary positions (transformers 5's rope_parameters or the Hub's older rope_theta with rope_scaling),
sliding windows, and a `DecoderFormat` whose fields say what a family does differently (its norms, biases,
activation, embedding scale, ...): each family's module (llama.py, gemma.py, olmo2.py, gpt_neox.py) is its
DecoderFormats and its layout."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator

from transformer import layers
from transformer.errors import CheckpointError
from transformer.models.formats.base import Format, Tensor
from transformer.models.gpt import GPTConfig

_ROPE_TYPES = {"default": "none", "linear": "linear", "llama3": "llama3", "yarn": "yarn"}
_ROPE_NAMES = {ours: theirs for theirs, ours in _ROPE_TYPES.items()}
# Buffers older checkpoints carry (causal masks, rotary tables), not parameters.
IGNORED = re.compile(r"(\.attention\.(bias|masked_bias)|\.rotary_emb\.inv_freq)$")
# The keys every decoder family's config.json may carry that config_from_hf reads.
HANDLED = frozenset(
  {
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "layer_norm_eps",
    "hidden_act",
    "hidden_activation",
    "tie_word_embeddings",
    "dtype",
    "torch_dtype",
    "rope_parameters",
    "rope_theta",
    "rope_scaling",
    "partial_rotary_factor",
    "sliding_window",
    "layer_types",
    "use_sliding_window",  # Qwen's window rule; every export writes it with layer_types, which decide
    "max_window_layers",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    # read to be refused where they are on (`DecoderFormat.refused`)
    "attention_bias",
    "mlp_bias",
    "use_bidirectional_attention",
  }
)
# A gated MLP: silu(gate) (Llama's SwiGLU) or gelu(gate) (Gemma's GeGLU).
GATED = {"silu": "swiglu", "swish": "swiglu", "gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"}


def all_full(hf: dict) -> list[str]:
  """Every layer's attention windowed when config.json gives a sliding_window (Mistral's rule), else full."""
  return ["sliding_attention" if hf.get("sliding_window") else "full_attention"] * hf["num_hidden_layers"]


def no_attention_bias(hf: dict) -> list[str]:
  """What refuses a config.json with biases on the attention's projections (every family but Qwen2, NeoX)."""
  return ["attention_bias=true (biases on q, k, v and the output)"] if hf.get("attention_bias") else []


@dataclasses.dataclass(frozen=True)
class DecoderFormat(Format):
  """One model type of a decoder family: what its config.json means in our options, and its layout."""

  model_type: str
  architecture: str
  layout_of: Callable[[DecoderFormat, GPTConfig], Iterator[Tensor]]
  norms: tuple[tuple[str, str], ...] = ()  # our norm -> the Hugging Face module's name (the layout's)
  extra_keys: frozenset[str] = frozenset()  # the family's keys beyond HANDLED
  activations: tuple[tuple[str, str], ...] = tuple(GATED.items())  # hidden_act -> our block.activation
  default_activation: str = "silu"
  writes_hidden_activation: bool = False  # an export names the activation under Gemma's key too
  norm: str = "rms_norm"
  norm_offset: float = 0.0  # Gemma's (1 + w)
  use_bias: bool = False
  qkv_bias: bool = False
  qk_norm: bool = False
  qk_norm_over: str = "head"
  branch_norms: str = "pre"
  parallel_key: bool = False  # use_parallel_residual read (GPT-NeoX)
  scale_embeddings: bool = False
  query_pre_attn_scalar: bool = False  # the attention's scale from query_pre_attn_scalar (Gemma 2, 3)
  tied_by_default: bool = False
  rotary_fraction: float = 1.0
  local_rope: bool = False  # a second rotary base for the sliding layers (Gemma 3)
  layer_types: Callable[[dict], list[str]] = all_full  # when config.json lists no layer_types
  refused: Callable[[dict], list[str]] = lambda hf: []
  tied_copies: tuple[str, ...] = ("lm_head.weight", "embed_out.weight")
  ignored: re.Pattern = IGNORED

  @property
  def handled(self) -> frozenset[str]:
    return HANDLED | self.extra_keys

  def layout(self, cfg: GPTConfig) -> Iterator[Tensor]:
    return self.layout_of(self, cfg)

  def config_from_hf(self, hf: dict, where: str) -> GPTConfig:
    self.check_keys(hf, where)
    H = hf["num_attention_heads"]
    window, global_layers = _windows(hf, self.layer_types)
    stored = stored_dtype(hf, where)
    block = layers.BlockConfig(
      d_model=hf["hidden_size"],
      num_heads=H,
      # 0 where the family's value is our default (as many kv heads as heads, heads d_model/H wide)
      num_kv_heads=0 if hf.get("num_key_value_heads", H) in (H, None) else hf["num_key_value_heads"],
      d_head=0 if hf.get("head_dim", 0) in (0, None, hf["hidden_size"] // H) else hf["head_dim"],
      d_mlp=hf["intermediate_size"],
      layer_norm_epsilon=hf.get("rms_norm_eps", hf.get("layer_norm_eps", 1e-6)),
      norm=self.norm,
      norm_offset=self.norm_offset,
      use_bias=self.use_bias,
      qkv_bias=self.qkv_bias,
      activation=self._activation(hf, where),
      qk_norm=self.qk_norm,
      qk_norm_over=self.qk_norm_over,
      attention_scale=hf["query_pre_attn_scalar"] ** -0.5 if self.query_pre_attn_scalar else 0.0,
      attention_softcap=hf.get("attn_logit_softcapping") or 0.0,
      sliding_window=window,
      parallel=self.parallel_key and hf.get("use_parallel_residual", True),
      branch_norms=self.branch_norms,
      rotary=self._rotary(hf, where),
      attention="einsum" if hf.get("attn_logit_softcapping") else "xla",
      dtype=stored,
      param_dtype=stored,
    )
    refused = self.refused(hf)
    if hf.get("mlp_bias"):
      refused.append("mlp_bias=true")
    if hf.get("use_bidirectional_attention"):
      refused.append("use_bidirectional_attention=true")
    if refused:
      raise CheckpointError(f"{where}: a {self.model_type} with {', '.join(refused)} is not one we run")
    return GPTConfig(
      vocab_size=hf["vocab_size"],
      max_len=hf.get("max_position_embeddings", 2048),
      num_layers=hf["num_hidden_layers"],
      block=block,
      positions="rope",
      tie_embeddings=hf.get("tie_word_embeddings", self.tied_by_default),
      logits_softcap=hf.get("final_logit_softcapping") or 0.0,
      global_layers=global_layers,
      scale_embeddings=self.scale_embeddings,
    )

  def _activation(self, hf: dict, where: str) -> str:
    """Our block.activation for the family's hidden_act (hidden_activation: Gemma's)."""
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    if hf.get("hidden_activation") is None and self.default_activation != "silu":
      act = self.default_activation  # what transformers runs for Gemma 1 configs that say "gelu"
    table = dict(self.activations)
    if act not in table:
      raise CheckpointError(
        f"{where}: hidden_act {act!r} of a {self.model_type} is not one we run; supported: {', '.join(table)}"
      )
    return table[act]

  def _rotary(self, hf: dict, where: str) -> layers.RotaryConfig:
    p = _rope_parameters(hf, "full_attention" if self.local_rope else None)
    kind = p.get("rope_type") or p.get("type") or "default"
    if kind not in _ROPE_TYPES:
      raise CheckpointError(
        f"{where}: rope type {kind!r} is not one we compute; supported: {', '.join(_ROPE_TYPES)} "
        f"(rope_parameters / rope_scaling)"
      )
    fraction = p.get("partial_rotary_factor") or hf.get("partial_rotary_factor") or hf.get("rotary_pct")
    if fraction is None:
      fraction = self.rotary_fraction
    original = p.get("original_max_position_embeddings") or 0
    if kind == "yarn" and not original:
      original = hf.get("max_position_embeddings", 0)
    return layers.RotaryConfig(
      theta=float(p.get("rope_theta", 10000.0)),
      fraction=float(fraction),
      scaling=_ROPE_TYPES[kind],
      factor=float(p.get("factor") or 1.0),
      original_max_len=int(original),
      low_freq_factor=float(p.get("low_freq_factor", 1.0)),
      high_freq_factor=float(p.get("high_freq_factor", 4.0)),
      beta_fast=float(p.get("beta_fast") or 32.0),
      beta_slow=float(p.get("beta_slow") or 1.0),
      attention_factor=float(p.get("attention_factor") or 0.0),
      local_theta=float(_rope_parameters(hf, "sliding_attention")["rope_theta"]) if self.local_rope else 0.0,
    )

  def config_to_hf(self, cfg: GPTConfig, tokenizer=None) -> dict:
    """The config.json transformers reads (its 5.x form, rope_parameters) for `cfg` as this model type,
    its weights stored in the params' dtype (block.param_dtype)."""
    b = cfg.block
    hf = {
      "architectures": [self.architecture],
      "model_type": self.model_type,
      "vocab_size": cfg.vocab_size,
      "hidden_size": b.d_model,
      "intermediate_size": b.mlp_width,
      "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": b.num_heads,
      "num_key_value_heads": b.kv_heads,
      "head_dim": b.head_dim,
      "max_position_embeddings": cfg.max_len,
      "tie_word_embeddings": cfg.tie_embeddings,
      "attention_dropout": b.attention_dropout_rate,
      "dtype": b.param_dtype,
    }
    if self.norm == "layer_norm":
      hf.update(layer_norm_eps=b.layer_norm_epsilon, use_parallel_residual=b.parallel, attention_bias=True)
    else:
      hf.update(rms_norm_eps=b.layer_norm_epsilon, attention_bias=False)
    theirs = {ours: act for act, ours in reversed(self.activations)}  # each activation's first name
    hf["hidden_act"] = theirs.get(b.activation, b.activation)
    if self.writes_hidden_activation:
      hf["hidden_activation"] = hf["hidden_act"]
    if self.query_pre_attn_scalar:
      scalar = b.attention_scale**-2 if b.attention_scale else b.head_dim
      hf["query_pre_attn_scalar"] = round(scalar) if abs(scalar - round(scalar)) < 1e-6 else scalar  # an int there
      hf["attn_logit_softcapping"] = b.attention_softcap or None
      hf["final_logit_softcapping"] = cfg.logits_softcap or None
    if b.sliding_window:
      hf["sliding_window"] = b.sliding_window
      hf["layer_types"] = [
        "full_attention" if i in cfg.global_layers else "sliding_attention" for i in range(cfg.num_layers)
      ]
      hf["use_sliding_window"] = True
      hf["max_window_layers"] = 0
    if self.local_rope:
      local = {"rope_type": "default", "rope_theta": b.rotary.local_theta}
      hf["rope_parameters"] = {"full_attention": _rope_export(b.rotary), "sliding_attention": local}
    else:
      hf["rope_parameters"] = _rope_export(b.rotary)
    return hf


def stored_dtype(hf: dict, where: str) -> str:
  """The dtype the checkpoint's weights are stored in (config.json's dtype, torch_dtype before
  transformers 5): the params' and the computation's, as transformers runs it."""
  stored = hf.get("dtype") or hf.get("torch_dtype") or "float32"
  if stored not in ("float32", "bfloat16", "float16"):
    raise CheckpointError(f"{where}: dtype {stored!r} is not one we load; supported: float32, bfloat16, float16")
  return stored


def _rope_parameters(hf: dict, layer_type: str | None = None) -> dict:
  """The rotary parameters of config.json, in either of its forms: transformers 5's rope_parameters
  (per layer type for Gemma 3), or rope_theta with rope_scaling (the Hub's older files)."""
  params = hf.get("rope_parameters")
  if params and layer_type and layer_type in params:
    return params[layer_type]
  if params and "full_attention" not in params:
    return params
  scaling = dict(hf.get("rope_scaling") or {})
  theta = hf.get("rope_theta", hf.get("rotary_emb_base", 10000.0))
  if layer_type == "sliding_attention":
    return {"rope_theta": hf.get("rope_local_base_freq", 10000.0), "rope_type": "default"}
  return {"rope_theta": theta, **scaling}


def _windows(hf: dict, rule: Callable[[dict], list[str]]) -> tuple[int, tuple[int, ...]]:
  """(block.sliding_window, global_layers): layer_types when config.json lists them, else the family's
  `rule` (Gemma 2: the even layers local; Gemma 3: all but every sixth; Mistral: all; Qwen2: from
  max_window_layers on, when use_sliding_window)."""
  types = hf.get("layer_types") or rule(hf)
  if "sliding_attention" not in types or not hf.get("sliding_window"):
    return 0, ()
  full = tuple(i for i, kind in enumerate(types) if kind == "full_attention")
  return int(hf["sliding_window"]), full


def _rope_export(r: layers.RotaryConfig) -> dict:
  out = {"rope_type": _ROPE_NAMES[r.scaling], "rope_theta": r.theta}
  if r.fraction != 1.0:
    out["partial_rotary_factor"] = r.fraction
  if r.scaling != "none":
    out["factor"] = r.factor
  if r.scaling in ("llama3", "yarn"):
    out["original_max_position_embeddings"] = r.original_max_len
  if r.scaling == "llama3":
    out.update(low_freq_factor=r.low_freq_factor, high_freq_factor=r.high_freq_factor)
  if r.scaling == "yarn":
    out.update(beta_fast=r.beta_fast, beta_slow=r.beta_slow)
    if r.attention_factor:
      out["attention_factor"] = r.attention_factor
  return out
