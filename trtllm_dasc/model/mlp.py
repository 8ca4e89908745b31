"""Channel mixers: dense SwiGLU MLP, qwen3_next sparse MoE (softmax router + gated shared expert),
kimi_linear MoE (sigmoid router with grouped top-k and score-correction bias + shared experts).
Replicated on every TP rank. Routing follows transformers' modules, including where they upcast."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from trtllm_dasc.model.ops import linear
from trtllm_dasc.model.weights import load


def _swiglu(x, gate, up, down):
    return linear(F.silu(linear(x, gate)) * linear(x, up), down)


class DenseMLP:
    def __init__(self, gate, up, down):
        self.gate, self.up, self.down = gate, up, down

    @classmethod
    def load(cls, src, prefix: str, D: int, inter: int, dtype, device) -> "DenseMLP":
        return cls(load(src, prefix + "gate_proj.weight", (inter, D), dtype, device),
                   load(src, prefix + "up_proj.weight", (inter, D), dtype, device),
                   load(src, prefix + "down_proj.weight", (D, inter), dtype, device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _swiglu(x, self.gate, self.up, self.down)


def _experts(x, idx, weights, gate, up, down):
    """Sum over each token's chosen experts. idx/weights [T, k]; gate/up [E, I, D]; down [E, D, I]."""
    out = torch.zeros_like(x)
    for e in torch.unique(idx).tolist():
        tok, pos = torch.where(idx == e)
        y = _swiglu(x[tok], gate[e], up[e], down[e]) * weights[tok, pos, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out


def _load_experts(src, prefix, names, E, D, inter, dtype, device):
    """Stack per-expert weights: names = (gate, up, down) tensor names relative to experts.{e}."""
    g, u, d = ([load(src, f"{prefix}experts.{e}.{n}.weight", shape, dtype, device) for e in range(E)]
               for n, shape in zip(names, ((inter, D), (inter, D), (D, inter))))
    return torch.stack(g), torch.stack(u), torch.stack(d)


class QwenMoE:
    def __init__(self, w: dict, spec):
        self.w, self.spec = w, spec

    @classmethod
    def load(cls, src, prefix: str, spec, dtype, device) -> "QwenMoE":
        s, D, p = spec, spec.hidden_size, prefix + "mlp."
        gate, up, down = _load_experts(src, p, ("gate_proj", "up_proj", "down_proj"), s.num_experts, D,
                                       s.moe_intermediate_size, dtype, device)
        w = {"router": load(src, p + "gate.weight", (s.num_experts, D), dtype, device),
             "gate": gate, "up": up, "down": down,
             "shared": DenseMLP.load(src, p + "shared_expert.", D, s.shared_intermediate_size, dtype, device),
             "shared_gate": load(src, p + "shared_expert_gate.weight", (1, D), dtype, device)}
        return cls(w, spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w
        logits = linear(x, w["router"])
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        top, idx = torch.topk(probs, self.spec.top_k, dim=-1)
        if self.spec.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        out = _experts(x, idx, top.to(logits.dtype), w["gate"], w["up"], w["down"])
        return out + torch.sigmoid(linear(x, w["shared_gate"])) * w["shared"].forward(x)


class KimiMoE:
    def __init__(self, w: dict, spec):
        self.w, self.spec = w, spec

    @classmethod
    def load(cls, src, prefix: str, spec, dtype, device) -> "KimiMoE":
        s, D, p = spec, spec.hidden_size, prefix + "block_sparse_moe."
        gate, up, down = _load_experts(src, p, ("w1", "w3", "w2"), s.num_experts, D, s.moe_intermediate_size,
                                       dtype, device)
        w = {"router": load(src, p + "gate.weight", (s.num_experts, D), torch.float32, device),
             "bias": load(src, p + "gate.e_score_correction_bias", (s.num_experts,), torch.float32, device),
             "gate": gate, "up": up, "down": down, "shared": None}
        if s.shared_intermediate_size:
            w["shared"] = DenseMLP.load(src, p + "shared_experts.", D, s.shared_intermediate_size, dtype, device)
        return cls(w, spec)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights fp32 [T, k], expert ids [T, k]): sigmoid scores, best groups by their top-2 sum."""
        s, E = self.spec, self.spec.num_experts
        scores = linear(x.float(), self.w["router"]).sigmoid()
        choice = scores + self.w["bias"]
        groups = choice.view(-1, s.n_group, E // s.n_group).topk(min(2, E // s.n_group), dim=-1)[0].sum(-1)
        keep = torch.zeros_like(groups).scatter_(1, torch.topk(groups, s.topk_group, dim=-1)[1], 1.0)
        keep = keep[:, :, None].expand(-1, s.n_group, E // s.n_group).reshape(-1, E).bool()
        idx = torch.topk(choice.masked_fill(~keep, float("-inf")), s.top_k, dim=-1)[1]
        weights = scores.gather(1, idx)
        if s.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * s.routed_scaling_factor, idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, idx = self.route(x)
        out = _experts(x, idx, weights, self.w["gate"], self.w["up"], self.w["down"])
        return out if self.w["shared"] is None else out + self.w["shared"].forward(x)
