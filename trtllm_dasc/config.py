"""HybridConfig: what the planner, the state store and the engine need to know about a hybrid model.

Built from a Hugging Face ``config.json`` of ``qwen3_next`` (Gated DeltaNet, "gdn") or ``kimi_linear``
(Kimi Delta Attention, "kda"). It answers: which layers are linear, the recurrent state shapes, how the
heads split over tensor-parallel ranks, and how many bytes one recurrent-state checkpoint takes per rank.

State conventions (the paper's, Eq. 1): the temporal state of one head is S in R^{d_v x d_k}.
  gdn: one *unit* is a whole value head, S[h] of shape [d_v, d_k]; value heads sharing one key head form
       a *bundle* (the TP-indivisible group: they read the same q/k projections).
  kda: one unit is a key channel (h, k), the column S[h, :, k] of length d_v; a bundle is one head.
Conv state: the last ``kernel - 1`` inputs of the short causal conv, ``conv_dim`` channels per layer.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from trtllm_dasc.errors import UserError

# bytes per element; kept free of torch so the planner imports nothing heavy
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}

SUPPORTED_MODEL_TYPES = ("qwen3_next", "kimi_linear")


class ConfigError(UserError):
    """A config.json that cannot describe a supported hybrid model (message names the field)."""


def _require(raw: dict, key: str, model_type: str):
    if raw.get(key) is None:
        raise ConfigError(f"{model_type} config.json lacks required field '{key}'")
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{model_type} config field '{key}' must be a positive integer, got {value!r}")
    return value


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

    def __post_init__(self):
        if self.arch not in ("gdn", "kda"):
            raise ConfigError(f"arch must be 'gdn' or 'kda', got {self.arch!r}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"layer_types has {len(self.layer_types)} entries but num_hidden_layers is {self.num_hidden_layers}")
        bad = sorted(set(self.layer_types) - {"linear_attention", "full_attention"})
        if bad:
            raise ConfigError(f"unknown layer type(s) {bad}; expected 'linear_attention' or 'full_attention'")
        if not self.linear_layers:
            raise ConfigError("the model has no linear-attention layer: nothing to checkpoint")
        if self.num_value_heads % self.num_key_heads:
            raise ConfigError(f"value heads ({self.num_value_heads}) must be a multiple of key heads "
                              f"({self.num_key_heads})")
        if self.arch == "kda" and (self.num_key_heads != self.num_value_heads
                                   or self.key_head_dim != self.value_head_dim):
            raise ConfigError("kda uses one head count and one head dim for keys and values")
        if self.conv_kernel < 1:
            raise ConfigError(f"conv kernel must be >= 1, got {self.conv_kernel}")
        for name in ("temporal_dtype", "conv_dtype"):
            if getattr(self, name) not in DTYPE_BYTES or getattr(self, name) == "int8":
                raise ConfigError(f"{name} must be one of float32/float16/bfloat16, got {getattr(self, name)!r}")

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
        return self.num_value_heads if self.arch == "gdn" else self.num_key_heads * self.key_head_dim

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
        return self.value_head_dim * (self.key_head_dim if self.arch == "gdn" else 1)

    @property
    def scales_per_unit(self) -> int:
        """INT8 codec scales per unit: one per (l, h, k), shared over d_v (paper Eq. 10)."""
        return self.key_head_dim if self.arch == "gdn" else 1

    @property
    def temporal_state_shape(self) -> tuple[int, int, int]:
        """Per layer, whole model: [value heads, d_v, d_k] (kda: heads == value heads)."""
        return (self.num_value_heads, self.value_head_dim, self.key_head_dim)

    @property
    def conv_dim(self) -> int:
        """Channels of the short conv per layer: gdn q,k (key heads) and v; kda q, k, v."""
        if self.arch == "gdn":
            return 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim
        return 3 * self.num_key_heads * self.key_head_dim

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_dim, self.conv_kernel - 1)

    # ---- tensor parallelism -----------------------------------------------------------------------
    def shard(self, tp: int) -> TPShard:
        """Per-rank share of one linear layer. Heads split evenly; a gdn key head keeps its value heads."""
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ConfigError(f"TP degree must be a positive integer, got {tp!r}")
        if self.num_key_heads % tp:
            what = "key heads" if self.arch == "gdn" else "heads"
            raise ConfigError(f"TP degree {tp} does not divide the {self.num_key_heads} linear-attention {what}")
        return TPShard(tp=tp, bundles=self.num_bundles // tp, units=self.units_per_layer // tp,
                       key_heads=self.num_key_heads // tp, value_heads=self.num_value_heads // tp,
                       conv_dim=self.conv_dim // tp)

    # ---- bytes ------------------------------------------------------------------------------------
    def unit_bytes(self, codec: str = "native") -> int:
        """Stored bytes of one temporal unit: native = temporal dtype; int8 = payload + scales."""
        if codec == "native":
            return self.unit_elements * DTYPE_BYTES[self.temporal_dtype]
        if codec == "int8":
            # scales are kept in the temporal source dtype (paper App. E.1)
            return self.unit_elements + self.scales_per_unit * DTYPE_BYTES[self.temporal_dtype]
        raise ConfigError(f"codec must be 'native' or 'int8', got {codec!r}")

    def conv_bytes_per_rank(self, tp: int) -> int:
        """Conv state of all linear layers on one rank, stored uncompressed in the conv dtype."""
        return (self.num_linear_layers * self.shard(tp).conv_dim * (self.conv_kernel - 1)
                * DTYPE_BYTES[self.conv_dtype])

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
    def from_dict(cls, raw: dict, temporal_dtype: str = "float32", conv_dtype: str = "bfloat16") -> "HybridConfig":
        if not isinstance(raw, dict):
            raise ConfigError("config.json must hold a JSON object")
        model_type = raw.get("model_type")
        if model_type == "qwen3_next":
            return cls._from_qwen3_next(raw, temporal_dtype, conv_dtype)
        if model_type == "kimi_linear":
            return cls._from_kimi_linear(raw, temporal_dtype, conv_dtype)
        raise ConfigError(f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")

    @classmethod
    def from_path(cls, path: str, **dtypes) -> "HybridConfig":
        """``path`` is a checkpoint directory holding config.json, or a config.json file."""
        file = os.path.join(path, "config.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise ConfigError(f"no config.json at {path!r}")
        try:
            with open(file) as f:
                raw = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{file} is not valid JSON: {e}") from None
        return cls.from_dict(raw, **dtypes)

    @classmethod
    def _from_qwen3_next(cls, raw, temporal_dtype, conv_dtype):
        mt = "qwen3_next"
        layers = _require(raw, "num_hidden_layers", mt)
        types = raw.get("layer_types")
        if types is None:
            # transformers' default: every full_attention_interval-th layer is full attention
            interval = raw.get("full_attention_interval", 4)
            types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
        return cls(model_type=mt, arch="gdn", num_hidden_layers=layers, layer_types=list(types),
                   num_key_heads=_require(raw, "linear_num_key_heads", mt),
                   num_value_heads=_require(raw, "linear_num_value_heads", mt),
                   key_head_dim=_require(raw, "linear_key_head_dim", mt),
                   value_head_dim=_require(raw, "linear_value_head_dim", mt),
                   conv_kernel=_require(raw, "linear_conv_kernel_dim", mt),
                   temporal_dtype=temporal_dtype, conv_dtype=conv_dtype, raw=raw)

    @classmethod
    def _from_kimi_linear(cls, raw, temporal_dtype, conv_dtype):
        mt = "kimi_linear"
        layers = _require(raw, "num_hidden_layers", mt)
        lac = raw.get("linear_attn_config") or {}
        if not isinstance(lac, dict):
            raise ConfigError("kimi_linear field 'linear_attn_config' must be an object")
        # the released checkpoints nest these in linear_attn_config; transformers also writes flat copies
        merged = {"head_dim": lac.get("head_dim", raw.get("linear_head_dim")),
                  "num_heads": lac.get("num_heads", raw.get("linear_num_heads")),
                  "short_conv_kernel_size": lac.get("short_conv_kernel_size", raw.get("linear_conv_kernel_dim"))}
        head_dim = _require(merged, "head_dim", mt + " linear_attn_config")
        heads = _require(merged, "num_heads", mt + " linear_attn_config")
        kernel = _require(merged, "short_conv_kernel_size", mt + " linear_attn_config")
        types = cls._kimi_layer_types(raw, lac, layers)
        return cls(model_type=mt, arch="kda", num_hidden_layers=layers, layer_types=types,
                   num_key_heads=heads, num_value_heads=heads, key_head_dim=head_dim, value_head_dim=head_dim,
                   conv_kernel=kernel, temporal_dtype=temporal_dtype, conv_dtype=conv_dtype, raw=raw)

    @staticmethod
    def _kimi_layer_types(raw: dict, lac: dict, layers: int) -> list[str]:
        from_lists = None
        if "kda_layers" in lac or "full_attn_layers" in lac:
            kda, full = lac.get("kda_layers", []), lac.get("full_attn_layers", [])
            from_lists = [None] * layers
            # 1-indexed in the checkpoint
            for ids, kind in ((kda, "linear_attention"), (full, "full_attention")):
                for one_based in ids:
                    if not isinstance(one_based, int) or not 1 <= one_based <= layers:
                        raise ConfigError(f"linear_attn_config layer id {one_based!r} is outside 1..{layers} "
                                          "(kda_layers/full_attn_layers are 1-indexed)")
                    if from_lists[one_based - 1] is not None:
                        raise ConfigError(f"layer {one_based} is listed twice in kda_layers/full_attn_layers")
                    from_lists[one_based - 1] = kind
            missing = [i + 1 for i, t in enumerate(from_lists) if t is None]
            if missing:
                raise ConfigError(f"layers {missing} are in neither kda_layers nor full_attn_layers")
        explicit = raw.get("layer_types")
        if from_lists is not None and explicit is not None and list(explicit) != from_lists:
            raise ConfigError("layer_types disagrees with linear_attn_config kda_layers/full_attn_layers")
        if from_lists is not None:
            return from_lists
        if explicit is not None:
            return list(explicit)
        # transformers' default for kimi_linear: every 4th layer (0-indexed, not 0) is full attention
        return ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(layers)]
