"""ModelSpec: everything the runtime needs from config.json beyond HybridConfig's recurrent-state view.

HybridConfig answers "which layers are linear and how big is their state"; ModelSpec adds the rest of the
network: hidden size, vocab, full attention (gated GQA for qwen3_next, MLA for kimi_linear), and the MLP
kind of every layer (dense or MoE). Both are built from the one ModelSchema that the family's parser
(families/) reads from config.json; ModelSpec reads no raw field itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_dasc import families
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.families import Family, NetworkSchema
from trtllm_dasc.families.schema import check_network


@dataclass(slots=True, kw_only=True)
class ModelSpec(NetworkSchema):
    """Shapes and options of the whole network (replicated parts; linear layers are sharded later): the
    schema's network fields (hidden size, vocab, attention, MLP/MoE; families/schema.py) plus these."""

    arch: str                        # "gdn" | "kda"
    layer_types: list[str]
    raw: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        check_network(self, self.family, len(self.layer_types))

    @property
    def family(self) -> Family:
        return families.family_of_arch(self.arch)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_token_shapes(self) -> list[tuple[int, ...]]:
        """Per-token shapes of what one full-attention layer caches: gqa k and v; mla [latent | k_rope]."""
        if self.family.attention == "gqa":
            return [(self.num_key_value_heads, self.head_dim), (self.num_key_value_heads, self.head_dim)]
        return [(1, self.kv_lora_rank + self.qk_rope_head_dim)]

    @classmethod
    def from_config(cls, cfg: HybridConfig) -> "ModelSpec":
        """From the schema cfg was parsed into (the registry parses cfg.raw when cfg was built field by
        field); a config that lacks a network field is refused naming it."""
        schema = cfg.schema if cfg.schema is not None else families.parse(cfg.raw)
        net = schema.require_network()
        return cls(arch=schema.arch, layer_types=list(schema.layer_types), raw=cfg.raw, **net.as_kwargs())
