"""Channel mixers: dense SwiGLU MLP, qwen3_next sparse MoE (softmax router + gated shared expert),
kimi_linear MoE (sigmoid router with grouped top-k and score-correction bias + shared experts).
At TP the intermediate channels are split (RankShare): gate/up column-parallel, down row-parallel, every
expert and shared expert alike, the router replicated (so every rank routes each token the same way);
``partial`` tells the model to all-reduce the output. Routing follows transformers' modules, including
where they upcast, and stays on the device (no host read: a CUDA graph can hold it). The routed experts run
in model/moe: the fused Triton kernels on a GPU, the per-expert loop (their reference) on the CPU."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from trtllm_dasc.model import moe
from trtllm_dasc.model.ops import linear
from trtllm_dasc.model.tp import RankShare
from trtllm_dasc.model.weights import load


def _act(g, u, fused: bool):
    """silu(g) * u; fused: fla's one-kernel SwiGLU (the fla backend on a GPU; model/fused_ops.py)."""
    if fused:
        from trtllm_dasc.model.fused_ops import swiglu
        return swiglu(g, u)
    return F.silu(g) * u


def _channels(share: RankShare, *sizes: int):
    """This rank's intermediate channels of each size, or None for all (when any size stays whole, all
    do: one layer's parts are summed together or not at all)."""
    parts = [share.part(n) for n in sizes if n]
    if not parts or any(p is None for p in parts):
        return [None] * len(sizes)
    return [torch.tensor(share.part(n)) if n else None for n in sizes]


class DenseMLP:
    """gate and up are kept as one [2I, D] matrix: one GEMM (and at decode one launch) for both."""

    def __init__(self, gate, up, down, partial: bool = False):
        self.gate_up, self.down, self.partial = torch.cat([gate, up]), down, partial
        self.inter = gate.shape[0]

    @property
    def gate(self) -> torch.Tensor:
        return self.gate_up[:self.inter]

    @property
    def up(self) -> torch.Tensor:
        return self.gate_up[self.inter:]

    @classmethod
    def load(cls, src, prefix: str, D: int, inter: int, dtype, device, share: RankShare = RankShare(),
             channels="by share") -> "DenseMLP":
        """channels: this rank's intermediate channels as decided by a MoE layer (None: all of them);
        by default the share decides (all of them when the degree does not divide ``inter``)."""
        ch = _channels(share, inter)[0] if isinstance(channels, str) else channels
        return cls(load(src, prefix + "gate_proj.weight", (inter, D), dtype, device, ch),
                   load(src, prefix + "up_proj.weight", (inter, D), dtype, device, ch),
                   load(src, prefix + "down_proj.weight", (D, inter), dtype, device, cols=ch), ch is not None)

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        gu = linear(x, self.gate_up)
        return linear(_act(gu[..., :self.inter], gu[..., self.inter:], fused), self.down)


def _load_experts(src, prefix, names, E, D, inter, dtype, device, ch=None):
    """(gate_up [E, 2I, D], down [E, D, I]) from per-expert weights: names = (gate, up, down) tensor names
    relative to experts.{e}; ch: this rank's intermediate channels of every expert (None: all). gate and
    up land in one tensor (the fused kernels' one GEMM for both), filled expert by expert: no second copy."""
    g, u, d = names
    n = inter if ch is None else len(ch)
    gate_up = torch.empty(E, 2 * n, D, dtype=dtype, device=device)
    down = torch.empty(E, D, n, dtype=dtype, device=device)
    for e in range(E):
        gate_up[e, :n] = load(src, f"{prefix}experts.{e}.{g}.weight", (inter, D), dtype, device, rows=ch)
        gate_up[e, n:] = load(src, f"{prefix}experts.{e}.{u}.weight", (inter, D), dtype, device, rows=ch)
        down[e] = load(src, f"{prefix}experts.{e}.{d}.weight", (D, inter), dtype, device, cols=ch)
    return gate_up, down


class _MoE:
    """What both MoE layers share: the expert weights (w["gate_up"] [E, 2I, D], with w["gate"] / w["up"]
    views of its halves, w["down"] [E, D, I]) and the backend of the routed experts (model/moe: None = the
    fused Triton kernels on a GPU, the per-expert loop on the CPU; benchmarks and tests set it)."""

    backend: str | None = None

    def __init__(self, w: dict, spec, partial: bool = False):
        if "gate_up" not in w:
            w["gate_up"] = torch.cat([w["gate"], w["up"]], dim=1)
        n = w["gate_up"].shape[1] // 2
        w["gate"], w["up"] = w["gate_up"][:, :n], w["gate_up"][:, n:]
        self.w, self.spec, self.partial = w, spec, partial

    @property
    def capturable(self) -> bool:
        """Whether a forward on the weights' device reads nothing on the host (CUDA graphs)."""
        dev = self.w["gate_up"].device
        return dev.type == "cuda" and (self.backend or moe.default_backend(dev)) != "loop"

    def _experts(self, x, idx, weights, fused: bool):
        return moe.experts(x, idx, weights, self.w["gate_up"], self.w["down"], self.backend, fused)


class QwenMoE(_MoE):

    @classmethod
    def load(cls, src, prefix: str, spec, dtype, device, share: RankShare = RankShare()) -> "QwenMoE":
        s, D, p = spec, spec.hidden_size, prefix + "mlp."
        ch, shared_ch = _channels(share, s.moe_intermediate_size, s.shared_intermediate_size)
        gate_up, down = _load_experts(src, p, ("gate_proj", "up_proj", "down_proj"), s.num_experts, D,
                                      s.moe_intermediate_size, dtype, device, ch)
        # the shared expert's sigmoid gate is one scalar per token: it scales each rank's partial alike
        w = {"router": load(src, p + "gate.weight", (s.num_experts, D), dtype, device),
             "gate_up": gate_up, "down": down,
             "shared": DenseMLP.load(src, p + "shared_expert.", D, s.shared_intermediate_size, dtype, device,
                                     channels=shared_ch),
             "shared_gate": load(src, p + "shared_expert_gate.weight", (1, D), dtype, device)}
        return cls(w, spec, ch is not None)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] in x's dtype, expert ids [T, k]): softmax in fp32, top-k, renormalised."""
        logits = linear(x, self.w["router"])
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        top, idx = torch.topk(probs, self.spec.top_k, dim=-1)
        if self.spec.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return top.to(logits.dtype), idx

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        w = self.w
        weights, idx = self.route(x)
        out = self._experts(x, idx, weights, fused)
        return out + torch.sigmoid(linear(x, w["shared_gate"])) * w["shared"].forward(x, fused)


class KimiMoE(_MoE):

    @classmethod
    def load(cls, src, prefix: str, spec, dtype, device, share: RankShare = RankShare()) -> "KimiMoE":
        s, D, p = spec, spec.hidden_size, prefix + "block_sparse_moe."
        ch, shared_ch = _channels(share, s.moe_intermediate_size, s.shared_intermediate_size or 0)
        gate_up, down = _load_experts(src, p, ("w1", "w3", "w2"), s.num_experts, D, s.moe_intermediate_size,
                                      dtype, device, ch)
        w = {"router": load(src, p + "gate.weight", (s.num_experts, D), torch.float32, device),
             "bias": load(src, p + "gate.e_score_correction_bias", (s.num_experts,), torch.float32, device),
             "gate_up": gate_up, "down": down, "shared": None}
        if s.shared_intermediate_size:
            w["shared"] = DenseMLP.load(src, p + "shared_experts.", D, s.shared_intermediate_size, dtype, device,
                                        channels=shared_ch)
        return cls(w, spec, ch is not None)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights fp32 [T, k], expert ids [T, k]): sigmoid scores, best groups by their top-2 sum."""
        s, E = self.spec, self.spec.num_experts
        scores = linear(x.float(), self.w["router"]).sigmoid()
        choice = scores + self.w["bias"]
        groups = choice.view(-1, s.n_group, E // s.n_group).topk(min(2, E // s.n_group), dim=-1)[0].sum(-1)
        keep = torch.zeros_like(groups).scatter_(1, torch.topk(groups, s.topk_group, dim=-1)[1], 1.0)
        keep = keep[:, :, None].expand(-1, s.n_group, E // s.n_group).reshape(-1, E).bool()
        # unsorted like transformers: the weights are then summed in its order, to the bit
        idx = torch.topk(choice.masked_fill(~keep, float("-inf")), s.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, idx)
        if s.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * s.routed_scaling_factor, idx

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        weights, idx = self.route(x)
        out = self._experts(x, idx, weights, fused)
        return out if self.w["shared"] is None else out + self.w["shared"].forward(x, fused)
