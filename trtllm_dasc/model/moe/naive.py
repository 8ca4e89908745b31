"""The torch reference of the routed experts: a loop over the experts the batch chose (the CPU path, and
what the fused kernels are tested against). It reads the chosen experts on the host (torch.unique), so it
synchronises and launches several kernels per active expert: never the GPU path (see __init__.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from trtllm_dasc.model.ops import linear
from trtllm_dasc.model.fused_ops import swiglu


def experts_naive(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                  down: torch.Tensor, fused_act: bool = False) -> torch.Tensor:
    """sum_j weights[t, j] * down[e] @ (silu(gate[e] @ x[t]) * (up[e] @ x[t])), e = idx[t, j].

    x [T, D]; idx [T, k] int; weights [T, k] (any float dtype: the product is taken in the promoted dtype
    and rounded to x's); gate_up [E, 2I, D] (gate rows first); down [E, D, I]. Returns [T, D] in x's dtype.
    fused_act: silu(g) * u in our SwiGLU kernel (a GPU's fla backend; model/fused_ops.py)."""
    inter = gate_up.shape[1] // 2
    out = torch.zeros_like(x)
    for e in torch.unique(idx).tolist():
        tok, pos = torch.where(idx == e)
        xe = x[tok]
        g, u = linear(xe, gate_up[e, :inter]), linear(xe, gate_up[e, inter:])
        if fused_act:
            h = swiglu(g, u)
        else:
            h = F.silu(g) * u
        y = linear(h, down[e]) * weights[tok, pos, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out
