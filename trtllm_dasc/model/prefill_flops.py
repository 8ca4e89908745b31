"""What a prefill of p tokens costs in FLOPs, for cost-aware eviction (cache/radix.py, Marconi's rule): the
value of a cached checkpoint is the prefill a hit on it saves, per byte it holds.

    flops(p) = p * per_token + per_pair * p (p + 1) / 2

per_token: 2 FLOPs per weight a token multiplies (the routed experts at top_k / num_experts of their weights:
each token runs k of them; the embedding is a lookup and the LM head runs for sampled positions only, so
neither counts) plus the linear-attention recurrence's state update and readout (6 K V per value head and
layer). per_pair: each query's attention over each earlier key in the full-attention layers, 2 H (d_qk + d_v)
per layer (MLA: d_qk = nope + rope dims, d_v its value dim; GQA: the head dim for both). The quadratic
term is why a long prefix is worth more than its length: on Kimi-Linear-48B it is 5% of a 4k-token prefill
and 17% of a 16k one (benchmarks/results/real_model_kda_h200.json's count), and it keeps growing with the
prefix. The whole model's FLOPs: a rank counts its shard times tp_size.
"""
from __future__ import annotations

from dataclasses import dataclass

from trtllm_dasc.model.footprint import tensor_bytes


@dataclass(frozen=True)
class PrefillFlops:
    per_token: float
    per_pair: float

    def of_prefix(self, p: int) -> float:
        return p * self.per_token + self.per_pair * p * (p + 1) / 2


def _numel(root) -> int:
    return tensor_bytes(root, elements=True)


def prefill_flops(model, tp_size: int) -> PrefillFlops:
    """From a loaded HybridModel (this rank's shard of a tp_size-way model)."""
    spec, cfg = model.spec, model.cfg
    weights = _numel([model.w, model.layers]) - _numel([model.w["embed"], model.w["lm_head"]])
    # a token multiplies top_k of the num_experts routed experts of a MoE layer
    routed = 0
    for _, mlp, *_ in model.layers:
        w = getattr(mlp, "w", None)
        if isinstance(w, dict) and "gate_up" in w and "down" in w and spec.num_experts:
            # the views' own elements: their base may hold the shared expert beside them (gate_up_all)
            routed += w["gate_up"].numel() + w["down"].numel()
    active = weights - routed * (1 - spec.top_k / spec.num_experts) if spec.num_experts else weights
    recurrence = 6 * cfg.key_head_dim * cfg.value_head_dim * cfg.num_value_heads * cfg.num_linear_layers
    per_token = 2.0 * active * tp_size + recurrence
    if spec.kv_lora_rank:       # MLA
        d_qk, d_v = spec.qk_nope_head_dim + spec.qk_rope_head_dim, spec.v_head_dim
    else:
        d_qk = d_v = spec.head_dim
    per_pair = 2.0 * spec.num_attention_heads * (d_qk + d_v) * len(cfg.full_attention_layers)
    return PrefillFlops(per_token, per_pair)
