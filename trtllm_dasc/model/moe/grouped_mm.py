"""The fused experts on torch's grouped GEMM (torch._grouped_mm: CUTLASS on sm90, bf16; the second fused
arm, the benchmark decides between them). Rows are sorted by expert (a stable sort, no padding: the GEMM
takes each group's end in `offs`, a device tensor), both products run as one grouped GEMM each, SiLU x up
in our SwiGLU kernel on a GPU, the routing weight multiplied and the rows put back in (token, slot) order
for the same sum over top_k as kernel.py. No host synchronisation."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def available(device: torch.device | str, dtype: torch.dtype) -> bool:
    """torch._grouped_mm exists and runs here: a GPU of compute capability 9.0 (its CUTLASS kernel), bf16."""
    device = torch.device(device)
    if not hasattr(torch, "_grouped_mm") or dtype != torch.bfloat16 or device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) == (9, 0)


def experts_grouped_mm(x, idx, weights, gate_up, down) -> torch.Tensor:
    """See moe.experts."""
    T, D = x.shape
    k = idx.shape[1]
    E, I2, _ = gate_up.shape
    inter = I2 // 2
    flat = idx.reshape(-1).long()
    counts = torch.zeros(E, dtype=torch.long, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
    offs = counts.cumsum(0).to(torch.int32)
    _, rows = torch.sort(flat, stable=True)
    xs = x[rows // k]
    # [E, D, 2I] and [E, I, D] as transposed views: the "B transposed" layout the kernel reads directly
    hs = torch._grouped_mm(xs, gate_up.transpose(1, 2), offs=offs)
    if hs.is_cuda:
        # lazy: triton loads only when a kernel runs (the torch reference needs none)
        from trtllm_dasc.model.kernels.swiglu import swiglu
        act = swiglu(hs[:, :inter], hs[:, inter:])
    else:
        act = F.silu(hs[:, :inter]) * hs[:, inter:]
    ys = torch._grouped_mm(act, down.transpose(1, 2), offs=offs)
    ys = (ys * weights.reshape(-1)[rows, None]).to(x.dtype)
    y = torch.empty_like(ys).index_copy_(0, rows, ys)
    return y.view(T, k, D).sum(1)
