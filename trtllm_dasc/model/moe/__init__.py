"""The routed experts of a MoE layer: sum over each token's top_k chosen experts of the routing weight times
the expert's SwiGLU MLP. Backends (`experts(..., backend=)`):

- "loop": naive.py, a loop over the chosen experts (the torch reference; the CPU default). It reads the
  routing on the host: a synchronisation and several launches per active expert.
- "triton" (the GPU default): by the number of (token, slot) pairs, small.py's two GEMVs over the pairs
  (T * top_k <= small.SMALL_PAIRS: decode; no sort, no alignment) or kernel.py's grouped GEMMs after
  align.py's device-side sort by expert. Both: no host synchronisation, grids fixed by the shapes
  (CUDA-graph capturable; T is fixed per captured graph, so is the path).
- "triton_small" / "triton_grouped": one of the two at any T (benchmarks and tests).
- "grouped_mm": grouped_mm.py, torch._grouped_mm (sm90, bf16 only; grouped_mm.available).
"""
from __future__ import annotations

import torch

from trtllm_dasc.model.moe.naive import experts_naive
from trtllm_dasc.model.moe.grouped_mm import experts_grouped_mm

BACKENDS = ("loop", "triton", "grouped_mm", "triton_small", "triton_grouped")


def default_backend(device: torch.device | str) -> str:
    """The fused Triton kernels on a GPU, the per-expert loop elsewhere (Triton needs a GPU, or its
    interpreter, which only tests ask for)."""
    return "triton" if torch.device(device).type == "cuda" else "loop"


def experts(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
            down: torch.Tensor, backend: str | None = None, fused_act: bool = False) -> torch.Tensor:
    """Routed experts of T tokens.

    x [T, D]; idx [T, top_k] expert ids (any int dtype); weights [T, top_k] routing weights (fp32 or x's
    dtype); gate_up [E, 2I, D], each expert's gate rows then its up rows (at TP this rank's I channels of
    each); down [E, D, I]. Returns [T, D] in x's dtype (at TP a partial sum over the rank's channels).
    backend: one of BACKENDS, None for default_backend(x.device). fused_act: the loop's SwiGLU in our
    kernel (the fused backends always fuse it)."""
    backend = backend or default_backend(x.device)
    if x.shape[0] == 0:
        return torch.zeros_like(x)
    if backend == "loop":
        return experts_naive(x, idx, weights, gate_up, down, fused_act)
    if backend == "triton":
        # lazy: triton loads only when a kernel runs (the torch reference needs none)
        from trtllm_dasc.model.moe.small import SMALL_PAIRS
        backend = "triton_small" if x.shape[0] * idx.shape[1] <= SMALL_PAIRS else "triton_grouped"
    if backend == "triton_small":
        # lazy: triton loads only when a kernel runs (the torch reference needs none)
        from trtllm_dasc.model.moe.small import experts_small
        return experts_small(x, idx, weights, gate_up, down)
    if backend == "triton_grouped":
        # lazy: triton loads only when a kernel runs (the torch reference needs none)
        from trtllm_dasc.model.moe.kernel import experts_triton
        return experts_triton(x, idx, weights, gate_up, down)
    if backend == "grouped_mm":
        return experts_grouped_mm(x, idx, weights, gate_up, down)
    raise ValueError(f"MoE backend {backend!r}: expected one of {', '.join(BACKENDS)}")
