"""qwen3_next (Qwen3-Next): Gated DeltaNet linear attention + gated GQA full attention, sparse MoE.

Field names are transformers' Qwen3NextConfig. RoPE options come from ``rope_parameters`` (transformers
5), else ``rope_scaling``, else the top level (the released config.json).
"""
from __future__ import annotations

from trtllm_dasc.families.common import common_network, moe_fields
from trtllm_dasc.families.fields import (MAX_CONV_KERNEL, MAX_EXPERTS, MAX_HEAD_DIM, MAX_HEADS, MAX_INTERMEDIATE,
                                         MAX_LAYERS, ConfigError, Fields)
from trtllm_dasc.families.schema import LAYER_TYPES, Family, ModelSchema, NetworkSchema, with_network

FAMILY = Family(model_type="qwen3_next", arch="gdn", unit_spans_key_dim=True, unit_name="value head",
                tp_split_name="key heads", linear_prefix="linear_attn.", attn_prefix="self_attn.",
                dense_mlp_prefix="mlp.", moe_prefix="mlp.", norm_offset=True, attention="gqa", a_log_view=(-1,))


def parse(raw: dict) -> ModelSchema:
    f = Fields(raw, "qwen3_next config.json")
    layers = f.int("num_hidden_layers", hi=MAX_LAYERS)
    if f.present("layer_types"):
        types = f.choice_list("layer_types", choices=LAYER_TYPES, length=layers)
    else:
        # transformers' default: every full_attention_interval-th layer is full attention
        interval = f.int("full_attention_interval", hi=MAX_LAYERS, default=4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    return ModelSchema(FAMILY, layers, types, num_key_heads=f.int("linear_num_key_heads", hi=MAX_HEADS),
                       num_value_heads=f.int("linear_num_value_heads", hi=MAX_HEADS),
                       key_head_dim=f.int("linear_key_head_dim", hi=MAX_HEAD_DIM),
                       value_head_dim=f.int("linear_value_head_dim", hi=MAX_HEAD_DIM),
                       conv_kernel=f.int("linear_conv_kernel_dim", hi=MAX_CONV_KERNEL),
                       **with_network(lambda: _network(f, layers)))


def _rope(f: Fields, head_dim: int) -> tuple[int, float]:
    """(rotary dim, theta). A value given in more than one place (rope_parameters, rope_scaling, the top
    level) must agree."""
    # transformers merges a legacy rope_scaling into rope_parameters (a YaRN rope_scaling beside a default
    # rope_parameters runs YaRN there): both are read, never one in place of the other
    ropes = [r for r in (f.obj("rope_parameters"), f.obj("rope_scaling")) if r is not None and r.raw]
    for rope in ropes:
        rope.choice("rope_type", "type", choices=("default",), default="default")
    out = []
    for name, default, hi in (("rope_theta", 10000.0, float("inf")), ("partial_rotary_factor", 0.25, 1.0)):
        given = [(f"{r.where}.{name}", r.float(name, lo=0.0, hi=hi, default=None)) for r in ropes]
        given = [(w, v) for w, v in [*given, (f"{f.where} field '{name}'", f.float(name, lo=0.0, hi=hi, default=None))]
                 if v is not None]
        for where, value in given[1:]:
            if value != given[0][1]:
                raise ConfigError(f"{where} ({value:g}) disagrees with {given[0][0]} ({given[0][1]:g})")
        out.append(given[0][1] if given else default)
    theta, factor = out
    return int(head_dim * factor), theta


def _network(f: Fields, layers: int) -> NetworkSchema:
    common = common_network(f, default_eps=1e-6)
    # transformers' Qwen3NextConfig: head_dim 256 when config.json has none (not hidden_size // heads, which
    # gave half-width attention on the released 80B config trimmed of it)
    head_dim = f.int("head_dim", hi=MAX_HEAD_DIM, default=256)
    rotary_dim, theta = _rope(f, head_dim)
    experts = f.int("num_experts", lo=0, hi=MAX_EXPERTS, default=0)
    step = f.int("decoder_sparse_step", hi=MAX_LAYERS, default=1)
    only = set(f.int_list("mlp_only_layers", lo=0, hi=layers - 1, default=[]))
    # transformers' Qwen3NextDecoderLayer: MoE unless listed dense, on every decoder_sparse_step-th layer
    mlp = ["moe" if (i not in only and experts > 0 and (i + 1) % step == 0) else "dense" for i in range(layers)]
    moe = "moe" in mlp
    router = moe_fields(f, moe, experts=("num_experts",), top_k=("num_experts_per_tok",), norm=("norm_topk_prob",))
    shared = f.int("shared_expert_intermediate_size", hi=MAX_INTERMEDIATE, **({} if moe else dict(lo=0, default=0)))
    return NetworkSchema(mlp_types=mlp, num_key_value_heads=f.int("num_key_value_heads", hi=MAX_HEADS),
                         head_dim=head_dim, rotary_dim=rotary_dim, rope_theta=theta,
                         shared_intermediate_size=shared, **router, **common)
