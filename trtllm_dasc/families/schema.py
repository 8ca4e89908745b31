"""The typed result of parsing one config.json: a Family (what differs by model family) and a ModelSchema.

A family parser (qwen3_next.py, kimi_linear.py) reads the raw dict once, strictly (fields.py), into a
ModelSchema; HybridConfig (recurrent-state view) and ModelSpec (whole network) are both built from it.
The network part is optional: a config that only describes the linear-attention state (what the planner
and the state store need) parses, and ModelSpec refuses it naming the first missing field.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from trtllm_dasc.families.fields import (MAX_CONV_KERNEL, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, ConfigError,
                                         MissingField, short_repr)

LAYER_TYPES = ("linear_attention", "full_attention")
# the released models have 81,920 (Kimi-Linear-48B) and 1,152 units, 524,288 state elements per layer
MAX_STATE_UNITS = 1 << 24
MAX_STATE_ELEMENTS = 1 << 30


@dataclass(frozen=True, slots=True)
class Family:
    """Facts that differ by model family, so code asks the family instead of branching on arch."""

    model_type: str                  # config.json model_type
    arch: str                        # "gdn" | "kda": the linear-attention kind
    unit_spans_key_dim: bool         # gdn: a state unit is a whole value head [d_v, d_k]; kda: one key channel
    unit_name: str                   # what one unit is, for people
    tp_split_name: str               # what tensor parallelism splits
    linear_prefix: str               # module of a layer holding the linear-attention weights
    attn_prefix: str                 # module of a layer holding the full-attention weights
    dense_mlp_prefix: str            # module of a dense MLP layer
    moe_prefix: str                  # module of a MoE layer
    norm_offset: bool                # RMSNorm scales by (1 + w) (qwen3_next) instead of w
    attention: str                   # full attention: "gqa" (gated GQA) | "mla"
    a_log_view: tuple[int, ...]      # stored shape of A_log: gdn [HV], kda [1, 1, H, 1]


@dataclass(slots=True)
class NetworkSchema:
    """Everything of the network beyond the linear-attention state (ModelSpec's fields)."""

    hidden_size: int
    vocab_size: int
    mlp_types: list[str]             # per layer: "dense" | "moe"
    rms_norm_eps: float
    tie_word_embeddings: bool
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int = 0     # gqa only
    head_dim: int = 0                # gqa only
    rotary_dim: int = 0              # gqa only
    rope_theta: float = 10000.0
    attention_bias: bool = False
    q_lora_rank: int | None = None   # mla only
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    norm_topk_prob: bool = True
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0

    def as_kwargs(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class ModelSchema:
    family: Family
    num_hidden_layers: int
    layer_types: list[str]           # 0-indexed
    num_key_heads: int               # kda: == num_value_heads
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    network: NetworkSchema | None = None
    network_missing: str = ""        # why network is None: the missing-field message

    def __post_init__(self):
        check_state(self.family, self.num_hidden_layers, self.layer_types, self.num_key_heads,
                    self.num_value_heads, self.key_head_dim, self.value_head_dim, self.conv_kernel)
        if self.network is not None:
            check_network(self.network, self.family, self.num_hidden_layers)

    @property
    def model_type(self) -> str:
        return self.family.model_type

    @property
    def arch(self) -> str:
        return self.family.arch

    def require_network(self) -> NetworkSchema:
        if self.network is None:
            raise ConfigError(self.network_missing or f"{self.model_type} config.json does not describe the network")
        return self.network


def with_network(build) -> dict:
    """ModelSchema kwargs for the network part: ``build()``'s result, or none with the reason when a
    required network field is absent (every field present is still checked by ``build`` up to there)."""
    try:
        return {"network": build()}
    except MissingField as e:
        return {"network": None, "network_missing": str(e)}


def _check_int(name: str, value, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{name} must be an integer in {lo}..{hi}, got {short_repr(value)}")


def check_state(family: Family, layers, layer_types, key_heads, value_heads, key_dim, value_dim, conv_kernel):
    """The recurrent-state fields (ModelSchema and HybridConfig, which may also come from a plan file)."""
    _check_int("num_hidden_layers", layers, 1, MAX_LAYERS)
    for name, value in (("linear key heads", key_heads), ("linear value heads", value_heads)):
        _check_int(name, value, 1, MAX_HEADS)
    for name, value in (("linear key head dim", key_dim), ("linear value head dim", value_dim)):
        _check_int(name, value, 1, MAX_HEAD_DIM)
    _check_int("conv kernel", conv_kernel, 1, MAX_CONV_KERNEL)
    if not isinstance(layer_types, list) or len(layer_types) != layers:
        count = len(layer_types) if isinstance(layer_types, list) else short_repr(layer_types)
        raise ConfigError(f"layer_types has {count} entries but num_hidden_layers is {layers}")
    bad = sorted({short_repr(t) for t in layer_types if t not in LAYER_TYPES})
    if bad:
        raise ConfigError(f"unknown layer type(s) {', '.join(bad)}; expected 'linear_attention' or 'full_attention'")
    if "linear_attention" not in layer_types:
        raise ConfigError("the model has no linear-attention layer: nothing to checkpoint")
    if value_heads % key_heads:
        raise ConfigError(f"value heads ({value_heads}) must be a multiple of key heads ({key_heads})")
    if not family.unit_spans_key_dim and (key_heads != value_heads or key_dim != value_dim):
        raise ConfigError(f"{family.arch} uses one head count and one head dim for keys and values")
    # each field may be in range and their product still absurd: the planner lists every unit
    units = layer_types.count("linear_attention") * value_heads * (1 if family.unit_spans_key_dim else key_dim)
    elements = value_heads * key_dim * value_dim
    if units > MAX_STATE_UNITS or elements > MAX_STATE_ELEMENTS:
        raise ConfigError(f"the recurrent state is too large to be real: {units:,} units over the linear layers "
                          f"(limit {MAX_STATE_UNITS:,}), {elements:,} elements per layer (limit "
                          f"{MAX_STATE_ELEMENTS:,}); check num_hidden_layers and the linear head counts/dims")


def check_network(net, family: Family, layers: int) -> None:
    """Cross-field rules of the network part (NetworkSchema, and ModelSpec built from it)."""
    if len(net.mlp_types) != layers:
        raise ConfigError(f"{len(net.mlp_types)} MLP types for {layers} layers")
    if any(t not in ("dense", "moe") for t in net.mlp_types):
        raise ConfigError(f"MLP types must be 'dense' or 'moe', got {sorted(set(map(str, net.mlp_types)))}")
    if "moe" in net.mlp_types:
        if not 0 < net.top_k <= net.num_experts:
            raise ConfigError(f"experts per token ({net.top_k}) must be in 1..num_experts ({net.num_experts})")
        if net.num_experts % net.n_group or not 0 < net.topk_group <= net.n_group:
            raise ConfigError(f"expert groups: {net.num_experts} experts, n_group {net.n_group}, "
                              f"topk_group {net.topk_group} do not fit")
        # the router picks top_k experts among the topk_group best groups: fewer there and it would pick
        # experts its group mask excluded
        if net.topk_group * (net.num_experts // net.n_group) < net.top_k:
            raise ConfigError(f"expert groups: topk_group {net.topk_group} of {net.n_group} groups hold "
                              f"{net.topk_group * (net.num_experts // net.n_group)} experts, fewer than the "
                              f"{net.top_k} experts per token")
    if family.attention == "gqa":
        if net.head_dim < 1:
            raise ConfigError(f"head_dim must be >= 1 (hidden_size // num_attention_heads when absent), "
                              f"got {net.head_dim}")
        if net.num_attention_heads % net.num_key_value_heads:
            raise ConfigError(f"num_attention_heads ({net.num_attention_heads}) must be a multiple of "
                              f"num_key_value_heads ({net.num_key_value_heads})")
        if net.rotary_dim % 2 or not 0 <= net.rotary_dim <= net.head_dim:
            raise ConfigError(f"rotary dim {net.rotary_dim} (head_dim x partial_rotary_factor) must be even "
                              f"and <= head_dim {net.head_dim}")
