"""Helpers of the MoE tests (a uniquely named module): transformers' MoE blocks on tiny configs with many
experts, our layers holding the same weights, and random routings for the kernel tests."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from state_helpers import assert_close  # noqa: E402,F401  (fla-style, shared with the state tests)


def hf_block(arch: str, seed: int = 0, E: int = 64, top_k: int = 8, D: int = 32, inter: int = 16,
             n_group: int = 4, topk_group: int = 2, qwen_shared: int = 2):
    """transformers' MoE block (fp32, eval), weights large enough that routing and outputs are not flat:
    Qwen3NextSparseMoeBlock (softmax top-k, gated shared expert) or KimiLinearMoE (sigmoid, grouped top-k,
    correction bias, scaled, shared expert). qwen_shared: Qwen's shared expert width in routed experts' widths
    (Kimi's is one: as wide as a routed expert)."""
    torch.manual_seed(seed)
    if arch == "gdn":
        from transformers import Qwen3NextConfig
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextSparseMoeBlock
        cfg = Qwen3NextConfig(hidden_size=D, moe_intermediate_size=inter, shared_expert_intermediate_size=qwen_shared * inter,
                              num_experts=E, num_experts_per_tok=top_k, norm_topk_prob=True)
        block = Qwen3NextSparseMoeBlock(cfg)
    else:
        from transformers import KimiLinearConfig
        from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearMoE
        cfg = KimiLinearConfig(hidden_size=D, moe_intermediate_size=inter, num_local_experts=E,
                               num_experts_per_tok=top_k, n_group=n_group, topk_group=topk_group, n_shared_experts=1,
                               routed_scaling_factor=2.446)
        block = KimiLinearMoE(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        if arch == "kda":
            block.gate.e_score_correction_bias.copy_(torch.randn(E, generator=g) * 0.1)
    return block.float().eval(), cfg


def ours(arch: str, block, cfg, dtype=torch.float32):
    """Our layer (QwenMoE / KimiMoE) holding the block's weights (in dtype; Kimi's router stays fp32)."""
    from trtllm_dasc.model.mlp import DenseMLP, KimiMoE, QwenMoE
    c = lambda t: t.detach().to(dtype).clone()  # noqa: E731
    ex = block.experts
    if arch == "gdn":
        spec = SimpleNamespace(num_experts=cfg.num_experts, top_k=cfg.num_experts_per_tok,
                               norm_topk_prob=cfg.norm_topk_prob)
        sh = block.shared_expert
        w = {"router": c(block.gate.weight), "gate_up": c(ex.gate_up_proj), "down": c(ex.down_proj),
             "shared": DenseMLP(c(sh.gate_proj.weight), c(sh.up_proj.weight), c(sh.down_proj.weight)),
             "shared_gate": c(block.shared_expert_gate.weight)}
        return QwenMoE(w, spec)
    spec = SimpleNamespace(num_experts=cfg.num_local_experts, top_k=cfg.num_experts_per_tok,
                           norm_topk_prob=cfg.norm_topk_prob, n_group=cfg.n_group, topk_group=cfg.topk_group,
                           routed_scaling_factor=cfg.routed_scaling_factor)
    sh = block.shared_experts
    w = {"router": block.gate.weight.detach().float().clone(),
         "bias": block.gate.e_score_correction_bias.detach().float().clone(),
         "gate_up": c(ex.gate_up_proj), "down": c(ex.down_proj),
         "shared": DenseMLP(c(sh.gate_proj.weight), c(sh.up_proj.weight), c(sh.down_proj.weight))}
    return KimiMoE(w, spec)


def random_routing(T: int, k: int, E: int, seed: int, used: int | None = None, dtype=torch.float32):
    """(idx [T, k] distinct experts per row drawn from the first `used` experts (the rest stay empty),
    weights [T, k] in (0.1, 1.1))."""
    g = torch.Generator().manual_seed(seed)
    used = used or E
    idx = torch.stack([torch.randperm(used, generator=g)[:k] for _ in range(T)]) if T else torch.zeros(0, k).long()
    return idx, (torch.rand(T, k, generator=g) + 0.1).to(dtype)


def random_experts(E: int, D: int, inter: int, seed: int, dtype=torch.float32, device="cpu"):
    """(gate_up [E, 2I, D], down [E, D, I]) scaled so outputs stay O(1)."""
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(E, 2 * inter, D, generator=g) / D ** 0.5
    down = torch.randn(E, D, inter, generator=g) / inter ** 0.5
    return gate_up.to(device, dtype), down.to(device, dtype)
