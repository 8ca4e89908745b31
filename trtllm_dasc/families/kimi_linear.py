"""kimi_linear (Kimi-Linear): Kimi Delta Attention linear attention + MLA (NoPE) full attention, MoE.

The released checkpoints nest the linear-attention shape in ``linear_attn_config`` with 1-indexed
``kda_layers`` / ``full_attn_layers``; transformers also writes flat copies (``linear_head_dim``, ...) and
its own names for the router (``num_experts_per_token``, ``moe_renormalize``, ``num_expert_group``, ...).
Every spelling is read; two spellings of one fact must agree.
"""
from __future__ import annotations

from trtllm_dasc.families.common import common_network, moe_fields
from trtllm_dasc.families.fields import (MAX_CONV_KERNEL, MAX_EXPERTS, MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN,
                                         MAX_LAYERS, ConfigError, Fields, MissingField)
from trtllm_dasc.families.schema import LAYER_TYPES, Family, ModelSchema, NetworkSchema, with_network

FAMILY = Family(model_type="kimi_linear", arch="kda", unit_spans_key_dim=False, unit_name="(head, key channel)",
                tp_split_name="heads", linear_prefix="self_attn.", attn_prefix="self_attn.",
                dense_mlp_prefix="block_sparse_moe.", moe_prefix="block_sparse_moe.", norm_offset=False,
                attention="mla", a_log_view=(1, 1, -1, 1))


def parse(raw: dict) -> ModelSchema:
    f = Fields(raw, "kimi_linear config.json")
    layers = f.int("num_hidden_layers", hi=MAX_LAYERS)
    lac = f.obj("linear_attn_config") or Fields({}, f.where + " linear_attn_config")
    head_dim = _nested_or_flat(f, lac, "head_dim", "linear_head_dim", MAX_HEAD_DIM)
    heads = _nested_or_flat(f, lac, "num_heads", "linear_num_heads", MAX_HEADS)
    kernel = _nested_or_flat(f, lac, "short_conv_kernel_size", "linear_conv_kernel_dim", MAX_CONV_KERNEL)
    return ModelSchema(FAMILY, layers, _layer_types(f, lac, layers), num_key_heads=heads, num_value_heads=heads,
                       key_head_dim=head_dim, value_head_dim=head_dim, conv_kernel=kernel,
                       **with_network(lambda: _network(f, layers)))


def _nested_or_flat(f: Fields, lac: Fields, nested: str, flat: str, hi: int) -> int:
    a, b = lac.int(nested, hi=hi, default=None), f.int(flat, hi=hi, default=None)
    if a is not None and b is not None and a != b:
        raise ConfigError(f"{lac.where}.{nested} ({a}) and {f.where} field '{flat}' ({b}) disagree")
    if a is None and b is None:
        raise MissingField(f"{f.where} lacks required field 'linear_attn_config.{nested}' (or '{flat}')")
    return a if a is not None else b


def _layer_types(f: Fields, lac: Fields, layers: int) -> list[str]:
    from_lists = None
    if lac.present("kda_layers") or lac.present("full_attn_layers"):
        from_lists = [None] * layers
        for name, kind in (("kda_layers", "linear_attention"), ("full_attn_layers", "full_attention")):
            try:
                ids = lac.int_list(name, lo=1, hi=layers, default=[])
            except ConfigError as e:
                raise ConfigError(f"{e} (kda_layers/full_attn_layers are 1-indexed)") from None
            for one_based in ids:
                if from_lists[one_based - 1] is not None:
                    raise ConfigError(f"layer {one_based} is listed twice in kda_layers/full_attn_layers")
                from_lists[one_based - 1] = kind
        missing = [i + 1 for i, t in enumerate(from_lists) if t is None]
        if missing:
            raise ConfigError(f"layers {missing} are in neither kda_layers nor full_attn_layers")
    explicit = f.choice_list("layer_types", choices=LAYER_TYPES, length=layers, default=None)
    if from_lists is not None and explicit is not None and explicit != from_lists:
        raise ConfigError("layer_types disagrees with linear_attn_config kda_layers/full_attn_layers")
    if from_lists is not None or explicit is not None:
        return from_lists or explicit
    # transformers' default for kimi_linear: every 4th layer (0-indexed, not 0) is full attention
    return ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(layers)]


def _network(f: Fields, layers: int) -> NetworkSchema:
    if not f.bool("mla_use_nope", default=True):
        raise ConfigError("kimi_linear with mla_use_nope=false (RoPE in MLA) is not supported")
    common = common_network(f, default_eps=1e-5)
    # transformers' KimiLinearForCausalLM declares no tied weights (_tied_weights_keys = {}): its lm_head is
    # always its own weight, whatever tie_word_embeddings says, so ours is too (tying it gave other logits)
    common["tie_word_embeddings"] = False
    if f.present("mlp_layer_types"):
        kinds = f.choice_list("mlp_layer_types", choices=("dense", "sparse"), length=layers)
    else:
        first_dense = f.int("first_k_dense_replace", lo=0, hi=layers, default=1)
        kinds = ["dense" if i < first_dense else "sparse" for i in range(layers)]
    mlp = ["moe" if t == "sparse" else "dense" for t in kinds]
    moe = "moe" in mlp
    router = moe_fields(f, moe, experts=("num_local_experts", "num_experts"),
                        top_k=("num_experts_per_tok", "num_experts_per_token"),
                        norm=("norm_topk_prob", "moe_renormalize"))
    f.choice("moe_router_activation_func", choices=("sigmoid",), default="sigmoid")
    shared = f.int("n_shared_experts", "num_shared_experts", lo=0, hi=MAX_EXPERTS, default=1)
    return NetworkSchema(
        mlp_types=mlp, shared_intermediate_size=router["moe_intermediate_size"] * shared,
        n_group=f.int("n_group", "num_expert_group", hi=MAX_EXPERTS, default=1),
        topk_group=f.int("topk_group", hi=MAX_EXPERTS, default=1),
        # transformers' KimiLinearConfig default, so a config without it means what it means there
        routed_scaling_factor=f.float("routed_scaling_factor", lo=0.0, hi=1e6, default=2.446),
        q_lora_rank=f.int("q_lora_rank", hi=MAX_HIDDEN, default=None),
        kv_lora_rank=f.int("kv_lora_rank", hi=MAX_HIDDEN), qk_nope_head_dim=f.int("qk_nope_head_dim", hi=MAX_HEAD_DIM),
        qk_rope_head_dim=f.int("qk_rope_head_dim", hi=MAX_HEAD_DIM), v_head_dim=f.int("v_head_dim", hi=MAX_HEAD_DIM),
        **router, **common)
