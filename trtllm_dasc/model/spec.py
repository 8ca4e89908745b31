"""ModelSpec: everything the runtime needs from config.json beyond HybridConfig's recurrent-state view.

HybridConfig answers "which layers are linear and how big is their state"; ModelSpec adds the rest of the
network: hidden size, vocab, full attention (gated GQA for qwen3_next, MLA for kimi_linear), and the MLP
kind of every layer (dense or MoE). Field names follow transformers' configs; kimi_linear configs also
come with the original checkpoint's names (num_experts_per_token, moe_renormalize, ...), read as aliases.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_dasc.config import ConfigError, HybridConfig


def _get(raw: dict, *names, default=None):
    for name in names:
        if raw.get(name) is not None:
            return raw[name]
    return default


def _pos_int(raw: dict, name: str, *aliases, default=None) -> int:
    value = _get(raw, name, *aliases, default=default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"config field '{name}' must be a positive integer, got {value!r}")
    return value


@dataclass(slots=True)
class ModelSpec:
    """Shapes and options of the whole network (replicated parts; linear layers are sharded later)."""

    arch: str                        # "gdn" | "kda"
    hidden_size: int
    vocab_size: int
    layer_types: list[str]
    mlp_types: list[str]             # per layer: "dense" | "moe"
    rms_norm_eps: float
    tie_word_embeddings: bool
    intermediate_size: int           # dense MLP width
    # full attention: qwen3_next gated GQA; kimi_linear MLA (no RoPE, as in transformers)
    num_attention_heads: int
    num_key_value_heads: int = 0     # gqa only
    head_dim: int = 0                # gqa only
    rotary_dim: int = 0              # gqa only: partial RoPE on the first rotary_dim channels
    rope_theta: float = 10000.0
    attention_bias: bool = False
    q_lora_rank: int | None = None   # mla only
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # mixture of experts
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    norm_topk_prob: bool = True
    n_group: int = 1                 # kimi grouped top-k
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    raw: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if len(self.mlp_types) != len(self.layer_types):
            raise ConfigError(f"{len(self.mlp_types)} MLP types for {len(self.layer_types)} layers")
        if any(t not in ("dense", "moe") for t in self.mlp_types):
            raise ConfigError(f"MLP types must be 'dense' or 'moe', got {sorted(set(self.mlp_types))}")
        if "moe" in self.mlp_types:
            if not 0 < self.top_k <= self.num_experts:
                raise ConfigError(f"experts per token ({self.top_k}) must be in 1..num_experts ({self.num_experts})")
            if self.num_experts % self.n_group or not 0 < self.topk_group <= self.n_group:
                raise ConfigError(f"expert groups: {self.num_experts} experts, n_group {self.n_group}, "
                                  f"topk_group {self.topk_group} do not fit")
        if self.arch == "gdn":
            if self.num_attention_heads % self.num_key_value_heads:
                raise ConfigError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                                  f"num_key_value_heads ({self.num_key_value_heads})")
            if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
                raise ConfigError(f"rotary dim {self.rotary_dim} must be even and <= head_dim {self.head_dim}")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_token_shapes(self) -> list[tuple[int, ...]]:
        """Per-token shapes of what one full-attention layer caches: gqa k and v; mla [latent | k_rope]."""
        if self.arch == "gdn":
            return [(self.num_key_value_heads, self.head_dim), (self.num_key_value_heads, self.head_dim)]
        return [(1, self.kv_lora_rank + self.qk_rope_head_dim)]

    @classmethod
    def from_config(cls, cfg: HybridConfig) -> "ModelSpec":
        raw = cfg.raw
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"hidden_act {act!r} is not supported (only 'silu')")
        common = dict(arch=cfg.arch, hidden_size=_pos_int(raw, "hidden_size"), vocab_size=_pos_int(raw, "vocab_size"),
                      layer_types=list(cfg.layer_types), tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                      intermediate_size=_pos_int(raw, "intermediate_size"),
                      num_attention_heads=_pos_int(raw, "num_attention_heads"),
                      attention_bias=bool(raw.get("attention_bias", False)), raw=raw)
        if cfg.arch == "gdn":
            return cls._qwen3_next(raw, cfg.num_hidden_layers, common)
        return cls._kimi_linear(raw, cfg.num_hidden_layers, common)

    @classmethod
    def _qwen3_next(cls, raw, layers, common):
        heads = common["num_attention_heads"]
        head_dim = _pos_int(raw, "head_dim", default=common["hidden_size"] // heads)
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"qwen3_next rope_type {rope_type!r} is not supported (only 'default')")
        theta = float(_get(rope, "rope_theta", default=_get(raw, "rope_theta", default=10000.0)))
        factor = float(_get(rope, "partial_rotary_factor", default=_get(raw, "partial_rotary_factor", default=0.25)))
        experts = int(raw.get("num_experts", 0) or 0)
        step = int(raw.get("decoder_sparse_step", 1) or 1)
        only = set(raw.get("mlp_only_layers") or [])
        mlp = ["moe" if (i not in only and experts > 0 and (i + 1) % step == 0) else "dense" for i in range(layers)]
        moe = {}
        if "moe" in mlp:
            moe = dict(num_experts=experts, top_k=_pos_int(raw, "num_experts_per_tok"),
                       moe_intermediate_size=_pos_int(raw, "moe_intermediate_size"),
                       shared_intermediate_size=_pos_int(raw, "shared_expert_intermediate_size"),
                       norm_topk_prob=bool(raw.get("norm_topk_prob", True)))
        return cls(mlp_types=mlp, rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                   num_key_value_heads=_pos_int(raw, "num_key_value_heads"), head_dim=head_dim,
                   rotary_dim=int(head_dim * factor), rope_theta=theta, **moe, **common)

    @classmethod
    def _kimi_linear(cls, raw, layers, common):
        if raw.get("mla_use_nope") is False:
            raise ConfigError("kimi_linear with mla_use_nope=false (RoPE in MLA) is not supported")
        types = raw.get("mlp_layer_types")
        if types is None:
            first_dense = int(raw.get("first_k_dense_replace", 1))
            types = ["dense" if i < first_dense else "sparse" for i in range(layers)]
        mlp = ["moe" if t == "sparse" else "dense" for t in types]
        moe = {}
        if "moe" in mlp:
            inter = _pos_int(raw, "moe_intermediate_size")
            moe = dict(num_experts=_pos_int(raw, "num_local_experts", "num_experts"),
                       top_k=_pos_int(raw, "num_experts_per_tok", "num_experts_per_token"),
                       moe_intermediate_size=inter,
                       shared_intermediate_size=inter * int(_get(raw, "n_shared_experts", "num_shared_experts",
                                                                 default=1)),
                       norm_topk_prob=bool(_get(raw, "norm_topk_prob", "moe_renormalize", default=True)),
                       n_group=_pos_int(raw, "n_group", "num_expert_group", default=1),
                       topk_group=_pos_int(raw, "topk_group", default=1),
                       routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)))
        q_lora = raw.get("q_lora_rank")
        return cls(mlp_types=mlp, rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)), q_lora_rank=q_lora,
                   kv_lora_rank=_pos_int(raw, "kv_lora_rank"), qk_nope_head_dim=_pos_int(raw, "qk_nope_head_dim"),
                   qk_rope_head_dim=_pos_int(raw, "qk_rope_head_dim"),
                   v_head_dim=_pos_int(raw, "v_head_dim"), **moe, **common)
