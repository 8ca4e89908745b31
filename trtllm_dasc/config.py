"""HybridConfig: what the planner, the state store and the engine need to know about a hybrid model.

Built from a Hugging Face ``config.json`` of ``qwen3_next`` (Gated DeltaNet, "gdn") or ``kimi_linear``
(Kimi Delta Attention, "kda"), parsed by that family's parser (families/). It answers: which layers are
linear, the recurrent state shapes, how the heads split over tensor-parallel ranks, and how many bytes one
recurrent-state checkpoint takes per rank.

State conventions (the paper's, Eq. 1): the temporal state of one head is S in R^{d_v x d_k}.
  gdn: one *unit* is a whole value head, S[h] of shape [d_v, d_k]; value heads sharing one key head form
       a *bundle* (the TP-indivisible group: they read the same q/k projections).
  kda: one unit is a key channel (h, k), the column S[h, :, k] of length d_v; a bundle is one head.
Conv state: the last ``kernel - 1`` inputs of the short causal conv, ``conv_dim`` channels per layer.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from trtllm_dasc import families
from trtllm_dasc.checkpoint_files import read_json
from trtllm_dasc.families import SUPPORTED_MODEL_TYPES, ConfigError, Family, ModelSchema
from trtllm_dasc.families.schema import check_state
from trtllm_dasc.spec import CODECS, CODECS_BY_NAME, CONV_CODECS

# bytes per element; kept free of torch so the planner imports nothing heavy
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}

__all__ = ["CODECS", "CONV_CODECS", "DTYPE_BYTES", "SUPPORTED_MODEL_TYPES", "ConfigError", "HybridConfig", "TPShard",
           "conv_bytes", "unit_bytes", "unit_byte_parts"]


def unit_byte_parts(unit_elements: int, rows_per_unit: int, temporal_dtype_bytes: int, codec: str) -> tuple[int, int]:
    """(payload, scale) bytes of one stored temporal unit: native keeps the temporal dtype and no scales;
    a quantizing codec keeps its bits per element (rounded up to whole bytes per row) plus, with row scales,
    one scale per row of d_v in the temporal source dtype (paper Eq. 10, App. E.1). The one formula the
    planner (HybridConfig) and the state store (StateLayout) use; spec.CODECS says what each codec keeps."""
    c = CODECS_BY_NAME.get(codec) if isinstance(codec, str) else None
    if c is None:
        raise ConfigError(f"codec must be one of {'|'.join(CODECS)}, got {codec!r}")
    # bits -> whole bytes per row of d_v, rounded up (a 4-bit codec packs each row on its own: an odd row
    # still takes its last byte)
    row = unit_elements // rows_per_unit
    payload = (unit_elements * temporal_dtype_bytes if c.payload_bits is None
               else rows_per_unit * -(-row * c.payload_bits // 8))
    return payload, rows_per_unit * temporal_dtype_bytes if c.row_scales else 0


def unit_bytes(unit_elements: int, rows_per_unit: int, temporal_dtype_bytes: int, codec: str) -> int:
    """Stored bytes of one temporal unit (payload + scales)."""
    return sum(unit_byte_parts(unit_elements, rows_per_unit, temporal_dtype_bytes, codec))


def conv_bytes(layers: int, channels: int, width: int, conv_dtype_bytes: int, codec: str = "native") -> int:
    """Conv state of ``layers`` linear layers: channels x (kernel - 1) each, in the conv dtype (native) or
    int8 (codes padded to 4 bytes, then the layer's fp32 scale: state/conv8_naive.conv8_row_bytes)."""
    if codec == "int8":
        return layers * (-(-channels * width // 4) * 4 + 4) if channels * width else 0
    if codec != "native":
        raise ConfigError(f"conv codec must be one of {'|'.join(CONV_CODECS)}, got {codec!r}")
    return layers * channels * width * conv_dtype_bytes


@dataclass(slots=True)
class TPShard:
    """What one tensor-parallel rank holds of every linear layer (all ranks hold the same shapes)."""

    tp: int
    bundles: int            # head bundles per rank per layer
    units: int              # state units per rank per layer
    key_heads: int          # gdn: key heads; kda: heads
    value_heads: int        # gdn: value heads; kda: heads
    conv_dim: int           # conv channels per rank per layer


@dataclass(slots=True)
class HybridConfig:
    model_type: str
    arch: str                               # "gdn" | "kda"
    num_hidden_layers: int
    layer_types: list[str]                  # "linear_attention" | "full_attention", 0-indexed
    num_key_heads: int                      # kda: == num_value_heads
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    temporal_dtype: str = "float32"
    conv_dtype: str = "bfloat16"
    raw: dict = field(default_factory=dict, repr=False)  # the full config.json, for the model runtime
    # the parsed config.json (None when built from fields, e.g. a plan file): ModelSpec is built from it
    schema: ModelSchema | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        check_state(self.family, self.num_hidden_layers, self.layer_types, self.num_key_heads,
                    self.num_value_heads, self.key_head_dim, self.value_head_dim, self.conv_kernel)
        for name in ("temporal_dtype", "conv_dtype"):
            if getattr(self, name) not in DTYPE_BYTES or getattr(self, name) == "int8":
                raise ConfigError(f"{name} must be one of float32/float16/bfloat16, got {getattr(self, name)!r}")

    @property
    def family(self) -> Family:
        """What differs by model family (unit definition, module names, norm offset): families/."""
        return families.family_of_arch(self.arch)

    # ---- layers and units -------------------------------------------------------------------------
    @property
    def linear_layers(self) -> list[int]:
        """0-indexed model layer ids of the linear-attention layers, in model order."""
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]

    @property
    def full_attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    @property
    def num_linear_layers(self) -> int:
        return len(self.linear_layers)

    @property
    def units_per_layer(self) -> int:
        """n_l: gdn one per value head, kda one per (head, key channel)."""
        return self.num_value_heads * self.key_head_dim // self.scales_per_unit

    @property
    def num_bundles(self) -> int:
        """Head bundles per layer: gdn key heads (with their value heads), kda heads."""
        return self.num_key_heads

    @property
    def units_per_bundle(self) -> int:
        return self.units_per_layer // self.num_bundles

    @property
    def unit_elements(self) -> int:
        """Temporal-state elements in one unit: gdn d_v*d_k (a head), kda d_v (a channel column)."""
        return self.value_head_dim * self.scales_per_unit

    @property
    def scales_per_unit(self) -> int:
        """Rows of d_v in one unit, and INT8 codec scales per unit: one per (l, h, k), shared over d_v
        (paper Eq. 10). gdn: d_k (a unit spans the key dim); kda: 1."""
        return self.key_head_dim if self.family.unit_spans_key_dim else 1

    @property
    def temporal_state_shape(self) -> tuple[int, int, int]:
        """Per layer, whole model: [value heads, d_v, d_k] (kda: heads == value heads)."""
        return (self.num_value_heads, self.value_head_dim, self.key_head_dim)

    @property
    def conv_dim(self) -> int:
        """Channels of the short conv per layer: q and k (key heads x d_k) and v (value heads x d_v);
        kda's single head count and dim make this 3 * H * K."""
        return 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_dim, self.conv_kernel - 1)

    # ---- tensor parallelism -----------------------------------------------------------------------
    def shard(self, tp: int) -> TPShard:
        """Per-rank share of one linear layer. Heads split evenly; a gdn key head keeps its value heads."""
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ConfigError(f"TP degree must be a positive integer, got {tp!r}")
        if self.num_key_heads % tp:
            raise ConfigError(f"TP degree {tp} does not divide the {self.num_key_heads} linear-attention "
                              f"{self.family.tp_split_name}")
        return TPShard(tp=tp, bundles=self.num_bundles // tp, units=self.units_per_layer // tp,
                       key_heads=self.num_key_heads // tp, value_heads=self.num_value_heads // tp,
                       conv_dim=self.conv_dim // tp)

    # ---- bytes ------------------------------------------------------------------------------------
    def unit_bytes(self, codec: str = "native") -> int:
        """Stored bytes of one temporal unit: native = temporal dtype; int8 = payload + scales."""
        return unit_bytes(self.unit_elements, self.scales_per_unit, DTYPE_BYTES[self.temporal_dtype], codec)

    def conv_bytes_per_rank(self, tp: int, codec: str = "native") -> int:
        """Conv state of all linear layers on one rank, in the conv dtype (native) or 8-bit."""
        return conv_bytes(self.num_linear_layers, self.shard(tp).conv_dim, self.conv_kernel - 1,
                          DTYPE_BYTES[self.conv_dtype], codec)

    def dense_checkpoint_bytes_per_rank(self, tp: int) -> int:
        """A full (W=0, native) checkpoint on one rank: every unit of every linear layer + conv."""
        temporal = self.num_linear_layers * self.shard(tp).units * self.unit_bytes("native")
        return temporal + self.conv_bytes_per_rank(tp)

    def to_dict(self) -> dict:
        return {"model_type": self.model_type, "arch": self.arch, "num_hidden_layers": self.num_hidden_layers,
                "layer_types": list(self.layer_types), "num_key_heads": self.num_key_heads,
                "num_value_heads": self.num_value_heads, "key_head_dim": self.key_head_dim,
                "value_head_dim": self.value_head_dim, "conv_kernel": self.conv_kernel,
                "temporal_dtype": self.temporal_dtype, "conv_dtype": self.conv_dtype}

    # ---- construction -----------------------------------------------------------------------------
    @classmethod
    def from_schema(cls, schema: ModelSchema, raw: dict, temporal_dtype: str = "float32",
                    conv_dtype: str = "bfloat16") -> "HybridConfig":
        return cls(model_type=schema.model_type, arch=schema.arch, num_hidden_layers=schema.num_hidden_layers,
                   layer_types=list(schema.layer_types), num_key_heads=schema.num_key_heads,
                   num_value_heads=schema.num_value_heads, key_head_dim=schema.key_head_dim,
                   value_head_dim=schema.value_head_dim, conv_kernel=schema.conv_kernel,
                   temporal_dtype=temporal_dtype, conv_dtype=conv_dtype, raw=raw, schema=schema)

    @classmethod
    def from_dict(cls, raw: dict, temporal_dtype: str = "float32", conv_dtype: str = "bfloat16") -> "HybridConfig":
        """Parse with the registry's parser for raw's model_type (families/); every field is checked."""
        return cls.from_schema(families.parse(raw), raw, temporal_dtype, conv_dtype)

    @classmethod
    def from_path(cls, path: str, **dtypes) -> "HybridConfig":
        """``path`` is a checkpoint directory holding config.json, or a config.json file."""
        file = os.path.join(path, "config.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise ConfigError(f"no config.json at {path!r}")
        raw = read_json(file, ConfigError)
        if not isinstance(raw, dict):
            raise ConfigError(f"{file} must hold a JSON object")
        return cls.from_dict(raw, **dtypes)
