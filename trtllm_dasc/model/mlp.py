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
from trtllm_dasc.model.ops import linear, linear_fp32
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

    @classmethod
    def of(cls, gate_up: torch.Tensor, down: torch.Tensor, partial: bool = False) -> "DenseMLP":
        """A layer on the given [2I, D] / [D, I] tensors as they are (views, no copy): a shared expert
        stored as a MoE layer's last expert."""
        mlp = cls.__new__(cls)
        mlp.gate_up, mlp.down, mlp.partial, mlp.inter = gate_up, down, partial, gate_up.shape[0] // 2
        return mlp

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


def _load_experts(src, prefix, names, E, D, inter, dtype, device, ch=None, shared: str | None = None):
    """(gate_up [E, 2I, D], down [E, D, I]) from per-expert weights: names = (gate, up, down) tensor names
    relative to experts.{e}; ch: this rank's intermediate channels of every expert (None: all). gate and
    up land in one tensor (the fused kernels' one GEMM for both), filled expert by expert: no second copy.
    shared: the prefix of a shared expert of the experts' width (gate_proj / up_proj / down_proj), loaded
    as expert E (_MoE folds it: the tensors returned then hold E + 1 experts)."""
    g, u, d = names
    n = inter if ch is None else len(ch)
    gate_up = torch.empty(E + (shared is not None), 2 * n, D, dtype=dtype, device=device)
    down = torch.empty(E + (shared is not None), D, n, dtype=dtype, device=device)
    sources = [(f"{prefix}experts.{e}.", (g, u, d)) for e in range(E)]
    if shared is not None:
        sources.append((shared, ("gate_proj", "up_proj", "down_proj")))
    for e, (p, (gn, un, dn)) in enumerate(sources):
        gate_up[e, :n] = load(src, f"{p}{gn}.weight", (inter, D), dtype, device, rows=ch)
        gate_up[e, n:] = load(src, f"{p}{un}.weight", (inter, D), dtype, device, rows=ch)
        down[e] = load(src, f"{p}{dn}.weight", (D, inter), dtype, device, cols=ch)
    return gate_up, down


class _MoE:
    """What both MoE layers share: the expert weights (w["gate_up"] [E, 2I, D], with w["gate"] / w["up"]
    views of its halves, w["down"] [E, D, I]) and the backend of the routed experts (model/moe: None = the
    fused Triton kernels on a GPU, the per-expert loop on the CPU; benchmarks and tests set it).

    A shared expert as wide as the routed ones is stored as expert E (self.gate_up_all / self.down_all hold
    E + 1 experts; w["gate_up"], w["down"] and w["shared"] are views into them): on the fused path's
    decode (few tokens) the router kernel appends it to each token's choices and the two expert kernels
    run it with the routed ones, one launch each, its output summed in their fp32 accumulator. The torch
    route() stays the reference (transformers' ops); the fused forward routes with moe/route_kernel.py."""

    backend: str | None = None

    def __init__(self, w: dict, spec, partial: bool = False):
        if "gate_up" not in w:
            w["gate_up"] = torch.cat([w["gate"], w["up"]], dim=1)
        self.gate_up_all, self.down_all = self._fold_shared(w)
        n = w["gate_up"].shape[1] // 2
        w["gate"], w["up"] = w["gate_up"][:, :n], w["gate_up"][:, n:]
        self.w, self.spec, self.partial = w, spec, partial

    @staticmethod
    def _fold_shared(w: dict):
        """(gate_up, down) with the shared expert as their last expert where it is as wide as the routed
        ones (made here by one copy unless load() stored it there already), else None, None."""
        sh, E = w.get("shared"), w["gate_up"].shape[0]
        if sh is None or tuple(sh.gate_up.shape) != tuple(w["gate_up"].shape[1:]) \
                or tuple(sh.down.shape) != tuple(w["down"].shape[1:]):
            return None, None
        base_gu, base_dn = w["gate_up"]._base, w["down"]._base
        stored = (base_gu is not None and base_dn is not None and base_gu.shape[0] == E + 1
                  and sh.gate_up.data_ptr() == base_gu[E].data_ptr() and sh.down.data_ptr() == base_dn[E].data_ptr())
        if not stored:
            base_gu = torch.cat([w["gate_up"], sh.gate_up[None]])
            base_dn = torch.cat([w["down"], sh.down[None]])
            w["gate_up"], w["down"] = base_gu[:E], base_dn[:E]
            w["shared"] = DenseMLP.of(base_gu[E], base_dn[E], sh.partial)
        return base_gu, base_dn

    @property
    def capturable(self) -> bool:
        """Whether a forward on the weights' device reads nothing on the host (CUDA graphs)."""
        dev = self.w["gate_up"].device
        return dev.type == "cuda" and (self.backend or moe.default_backend(dev)) != "loop"

    def _experts(self, x, idx, weights, fused: bool):
        return moe.experts(x, idx, weights, self.w["gate_up"], self.w["down"], self.backend, fused)

    def _fused_backend(self, x: torch.Tensor) -> str | None:
        """The fused Triton backend this forward takes (None: the torch route and the loop)."""
        backend = self.backend or moe.default_backend(x.device)
        return backend if backend in ("triton", "triton_small", "triton_grouped") else None

    def _forward_fused(self, x: torch.Tensor, backend: str, router: torch.Tensor, route_kw: dict,
                       fused: bool) -> torch.Tensor:
        """The router's product, the selection in one kernel, then the routed experts with the shared one:
        folded into the small path's kernels where it is stored as expert E, else beside them (Qwen's scaled
        by its sigmoid gate). router: an fp32 weight gives fp32 logits of x upcast (Kimi's), a weight in x's
        dtype logits in x's dtype (Qwen's)."""
        from trtllm_dasc.model.moe import route_kernel
        from trtllm_dasc.model.moe.small import SMALL_PAIRS, experts_small
        k, sh = self.spec.top_k, self.w.get("shared")
        # two launches even for one token: product and selection in one launch (the product's last program
        # selecting, git show 1fbf5c3) measured slower on the H200, 8.9 us a layer against ~5.2 apart (its
        # selection waits for the product and runs with the product's four warps, not one):
        # `python -m benchmarks real_model --profile 1` at 1fbf5c3 against abacc93
        logits = linear_fp32(x, router) if router.dtype == torch.float32 else linear(x, router)
        idx, weights = route_kernel.route(logits, top_k=k, **route_kw)
        small = backend == "triton_small" or (backend == "triton" and x.shape[0] * k <= SMALL_PAIRS)
        if small and self.gate_up_all is not None:
            return experts_small(x, idx, weights, self.gate_up_all, self.down_all)
        if sh is None:
            return self._experts(x, idx, weights, fused)
        out = moe.experts(x, idx[:, :k].contiguous(), weights[:, :k].contiguous(), self.w["gate_up"],
                          self.w["down"], backend, fused)
        shared = sh.forward(x, fused)
        # Kimi's shared weight is 1 (added as it is, in x's dtype); Qwen's is its gate's sigmoid
        return out + (weights[:, k:] * shared if route_kw.get("shared") == 2 else shared)


class QwenMoE(_MoE):

    @classmethod
    def load(cls, src, prefix: str, spec, dtype, device, share: RankShare = RankShare()) -> "QwenMoE":
        s, D, p = spec, spec.hidden_size, prefix + "mlp."
        ch, shared_ch = _channels(share, s.moe_intermediate_size, s.shared_intermediate_size)
        fold = s.shared_intermediate_size == s.moe_intermediate_size
        gate_up, down = _load_experts(src, p, ("gate_proj", "up_proj", "down_proj"), s.num_experts, D,
                                      s.moe_intermediate_size, dtype, device, ch,
                                      shared=p + "shared_expert." if fold else None)
        E = s.num_experts
        shared = DenseMLP.of(gate_up[E], down[E], shared_ch is not None) if fold else \
            DenseMLP.load(src, p + "shared_expert.", D, s.shared_intermediate_size, dtype, device, channels=shared_ch)
        # the shared expert's sigmoid gate is one scalar per token: it scales each rank's partial alike
        w = {"router": load(src, p + "gate.weight", (E, D), dtype, device),
             "gate_up": gate_up[:E], "down": down[:E], "shared": shared,
             "shared_gate": load(src, p + "shared_expert_gate.weight", (1, D), dtype, device)}
        return cls(w, spec, ch is not None)

    def __init__(self, w: dict, spec, partial: bool = False):
        super().__init__(w, spec, partial)
        # the shared gate's row after the router's: one GEMV gives both (the route kernel reads it last)
        self.router_all = torch.cat([w["router"], w["shared_gate"]])
        E = w["router"].shape[0]
        w["router"], w["shared_gate"] = self.router_all[:E], self.router_all[E:]

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
        backend = self._fused_backend(x)
        if backend is not None:
            from trtllm_dasc.model.moe.route_kernel import QWEN
            return self._forward_fused(x, backend, self.router_all,
                                       dict(kind=QWEN, norm=self.spec.norm_topk_prob, shared=2,
                                            weight_dtype=x.dtype), fused)
        weights, idx = self.route(x)
        out = self._experts(x, idx, weights, fused)
        return out + torch.sigmoid(linear(x, w["shared_gate"])) * w["shared"].forward(x, fused)


class KimiMoE(_MoE):

    @classmethod
    def load(cls, src, prefix: str, spec, dtype, device, share: RankShare = RankShare()) -> "KimiMoE":
        s, D, p = spec, spec.hidden_size, prefix + "block_sparse_moe."
        ch, shared_ch = _channels(share, s.moe_intermediate_size, s.shared_intermediate_size or 0)
        fold = s.shared_intermediate_size == s.moe_intermediate_size
        E = s.num_experts
        gate_up, down = _load_experts(src, p, ("w1", "w3", "w2"), E, D, s.moe_intermediate_size, dtype, device,
                                      ch, shared=p + "shared_experts." if fold else None)
        w = {"router": load(src, p + "gate.weight", (E, D), torch.float32, device),
             "bias": load(src, p + "gate.e_score_correction_bias", (E,), torch.float32, device),
             "gate_up": gate_up[:E], "down": down[:E], "shared": None}
        if fold:
            w["shared"] = DenseMLP.of(gate_up[E], down[E], shared_ch is not None)
        elif s.shared_intermediate_size:
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
        backend = self._fused_backend(x)
        if backend is not None:
            from trtllm_dasc.model.moe.route_kernel import KIMI
            s = self.spec
            return self._forward_fused(x, backend, self.w["router"],
                                       dict(kind=KIMI, n_group=s.n_group, topk_group=s.topk_group,
                                            norm=s.norm_topk_prob, scale=s.routed_scaling_factor,
                                            bias=self.w["bias"], shared=int(self.w["shared"] is not None)), fused)
        weights, idx = self.route(x)
        out = self._experts(x, idx, weights, fused)
        return out if self.w["shared"] is None else out + self.w["shared"].forward(x, fused)
