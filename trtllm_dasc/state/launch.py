"""Host-side helpers every checkpoint kernel's launch shares (triton_ops, codec_ops, conv8_ops): grid sizes
and the request index tensors the kernels read.
"""
from __future__ import annotations

import torch

# grid axis 1 and 2 limits on CUDA
MAX_BATCH = 65535


# plain-python twins of triton.cdiv / next_power_of_2: those go through triton's constexpr-function
# machinery, which costs microseconds per call on the launch path
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _idx(x, device) -> torch.Tensor:
    """Request indices as a contiguous 1-D integer tensor on device (an int32 / int64 one already there is
    used as it is; the kernels widen to int64), at most MAX_BATCH of them (one grid axis)."""
    if isinstance(x, torch.Tensor) and x.dtype in (torch.int32, torch.int64) and x.dim() == 1 and x.is_contiguous():
        t = x if x.device == device else x.to(device)
    else:
        t = torch.as_tensor(x, device=device).flatten().to(torch.int64).contiguous()
    assert t.numel() <= MAX_BATCH, f"batch of {t.numel()} exceeds the grid limit {MAX_BATCH}"
    return t
