"""The released models' router fields, for a config.json that describes their shapes but lacks them.

The reference configs (../shared/reference) keep the attention and state shapes; the Kimi-Linear one
leaves out the mixture of experts. Full-size dummy weights (dasc-build --load-format dummy) need the whole
network, so a config whose shapes are those of a released model gets the released router fields it lacks:
only absent fields are added (a field the config gives is never changed), and the caller records which.
"""
from __future__ import annotations

# (model_type, hidden_size, num_hidden_layers, vocab_size) -> the released model's MoE fields
RELEASED_MOE = {
    # Kimi-Linear-48B-A3B: 256 routed experts of width 1024, top-8 by sigmoid scores with the correction
    # bias (one group), one shared expert, the first layer dense
    ("kimi_linear", 2304, 27, 163840): {
        "name": "Kimi-Linear-48B-A3B",
        "fields": {"num_experts": 256, "num_experts_per_token": 8, "moe_intermediate_size": 1024,
                   "num_shared_experts": 1, "first_k_dense_replace": 1, "moe_renormalize": True,
                   "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.446,
                   "num_expert_group": 1, "topk_group": 1, "tie_word_embeddings": False},
        # spellings of the same field: one present means the field is given
        "aliases": {"num_experts": ("num_local_experts",), "num_experts_per_token": ("num_experts_per_tok",),
                    "num_shared_experts": ("n_shared_experts",), "moe_renormalize": ("norm_topk_prob",),
                    "num_expert_group": ("n_group",), "first_k_dense_replace": ("mlp_layer_types",)},
    },
    # Qwen3-Next-80B-A3B: 512 experts of width 512, top-10 softmax with renormalised weights, a gated shared
    # expert of width 512 (its reference config already lists them: nothing to add there)
    ("qwen3_next", 2048, 48, 151936): {
        "name": "Qwen3-Next-80B-A3B",
        "fields": {"num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
                   "shared_expert_intermediate_size": 512, "norm_topk_prob": True, "decoder_sparse_step": 1,
                   "mlp_only_layers": [], "tie_word_embeddings": False},
        "aliases": {},
    },
}


def released_name(raw: dict) -> str | None:
    """The released model whose shapes raw has, or None."""
    entry = RELEASED_MOE.get(_key(raw))
    return entry["name"] if entry else None


def complete_released(raw: dict) -> tuple[dict, list[str]]:
    """(a copy of raw with the released router fields it lacks, the names added). A config that is not
    shaped like a released model comes back unchanged."""
    entry = RELEASED_MOE.get(_key(raw))
    out = dict(raw)
    if entry is None:
        return out, []
    added = []
    for name, value in entry["fields"].items():
        spellings = (name, *entry["aliases"].get(name, ()))
        if all(out.get(s) is None for s in spellings):
            out[name] = value
            added.append(name)
    return out, added


def _key(raw: dict):
    return (raw.get("model_type"), raw.get("hidden_size"), raw.get("num_hidden_layers"), raw.get("vocab_size"))
