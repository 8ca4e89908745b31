"""The prefill FLOPs cost-aware eviction values a checkpoint by (model/prefill_flops.py), against a count made
from transformers' own modules: 2 per parameter a token multiplies (all but the embedding, the LM head and
the routed experts a token does not pick: top_k of num_experts), the recurrence's 6 K V per value head and
linear layer, and the attention's 2 H (d_qk + d_v) per full-attention layer for each (query, key) pair, on
the tiny MoE hybrids of both families (MoE layers beside dense ones, MLA and GQA)."""
from __future__ import annotations

import pytest

from hybrid_tiny import build
from trtllm_dasc.model import HybridModel
from trtllm_dasc.model.prefill_flops import prefill_flops


def _reference(hf) -> tuple[float, float]:
    c = hf.config
    active = 0.0
    E, k = getattr(c, "num_local_experts", None) or c.num_experts, c.num_experts_per_tok
    for name, p in hf.named_parameters():
        if "embed_tokens" in name or name.startswith("lm_head"):
            continue
        routed = ".mlp.experts." in name
        active += p.numel() * (k / E if routed else 1.0)
    if c.model_type == "kimi_linear":
        K = V = c.linear_attn_config["head_dim"] if hasattr(c, "linear_attn_config") and c.linear_attn_config \
            else c.linear_head_dim
        HV = c.linear_num_heads
        d_qk, d_v = c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim
    else:
        K, V, HV = c.linear_key_head_dim, c.linear_value_head_dim, c.linear_num_value_heads
        d_qk = d_v = c.head_dim
    linear_layers = sum(t == "linear_attention" for t in c.layer_types)
    attention_layers = len(c.layer_types) - linear_layers
    per_token = 2 * active + 6 * K * V * HV * linear_layers
    per_pair = 2 * c.num_attention_heads * (d_qk + d_v) * attention_layers
    return per_token, per_pair


@pytest.mark.parametrize("arch", ["kda", "gdn"])
def test_prefill_flops_count_what_a_token_runs(arch, tmp_path):
    hf = build(tmp_path, arch, seed=1)
    flops = prefill_flops(HybridModel.from_pretrained(str(tmp_path)), tp_size=1)
    per_token, per_pair = _reference(hf)
    # Kimi's correction bias is a buffer in transformers and a weight here: E elements a MoE layer
    assert flops.per_token == pytest.approx(per_token, rel=1e-3)
    assert flops.per_pair == per_pair
    p = 1000
    assert flops.of_prefix(p) == pytest.approx(p * per_token + per_pair * p * (p + 1) / 2, rel=1e-3)
