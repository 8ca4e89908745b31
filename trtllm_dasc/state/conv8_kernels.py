"""Triton kernels of the 8-bit conv-state codec (conv8_naive.py is the reference and says why per layer).

One program per (layer, request): the layer's conv_dim * width values are contiguous in the active state,
so two passes of BLOCK-wide vector loads (amax, then quantize) or one (decode). Host wrappers: conv8_ops.
"""
from __future__ import annotations

import triton
import triton.language as tl

from trtllm_dasc.state.kernels import _round_half_even, _to_bf16_rtne
from trtllm_dasc.state.ragged_index import request_rows


@triton.jit
def conv8_encode_kernel(src, dst, dst_scale, rows, slots, n, stride_src_l, stride_src_n, stride_dst_b,
                        stride_dst_l, ROW4: tl.constexpr, BLOCK: tl.constexpr):
    """src [L, N, n] (rows contiguous) rows[b] -> dst int8 [S, L, row] slots[b]: codes at [0, n), the fp32
    scale at float index ROW4 - 1 of dst_scale (the same bytes viewed as fp32)."""
    layer = tl.program_id(0).to(tl.int64)
    i_src, slot = request_rows(rows, slots)
    base = src + layer * stride_src_l + i_src * stride_src_n
    amax = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n, BLOCK):
        e = start + tl.arange(0, BLOCK)
        amax = tl.maximum(amax, tl.abs(tl.load(base + e, mask=e < n, other=0.0).to(tl.float32)))
    # ieee division, so the scale and the quotients equal torch's bit for bit (paper Eq. 10)
    s = tl.math.div_rn(tl.maximum(tl.max(amax, axis=0), 1e-8), 127.0)
    out = dst + slot * stride_dst_b + layer * stride_dst_l
    # the padding up to the scale is written too (zeros, as the reference writes): a slot is all defined bytes
    n_pad = ROW4 * 4 - 4
    for start in range(0, n_pad, BLOCK):
        e = start + tl.arange(0, BLOCK)
        x = tl.load(base + e, mask=e < n, other=0.0).to(tl.float32)
        y = tl.minimum(tl.maximum(tl.math.div_rn(x, tl.zeros((BLOCK,), tl.float32) + s), -127.0), 127.0)
        tl.store(out + e, _round_half_even(y).to(tl.int8), mask=e < n_pad)
    # stride_dst_* are in int8 elements; the fp32 view's are a quarter of them
    tl.store(dst_scale + slot * (stride_dst_b // 4) + layer * (stride_dst_l // 4) + ROW4 - 1, s)


@triton.jit
def conv8_decode_kernel(src, src_scale, dst, slots, rows, n, stride_src_b, stride_src_l, stride_dst_l,
                        stride_dst_n, ROW4: tl.constexpr, BLOCK: tl.constexpr, TO_BF16: tl.constexpr):
    """src int8 [S, L, row] slots[b] -> dst [L, N, n] rows[b] = codes * scale (fp32), cast to dst's dtype."""
    layer = tl.program_id(0).to(tl.int64)
    slot, i_dst = request_rows(slots, rows)
    s = tl.load(src_scale + slot * (stride_src_b // 4) + layer * (stride_src_l // 4) + ROW4 - 1)
    inp = src + slot * stride_src_b + layer * stride_src_l
    out = dst + layer * stride_dst_l + i_dst * stride_dst_n
    for start in range(0, n, BLOCK):
        e = start + tl.arange(0, BLOCK)
        x = tl.load(inp + e, mask=e < n, other=0).to(tl.float32) * s
        if TO_BF16:
            y = _to_bf16_rtne(x)
        else:
            y = x.to(dst.dtype.element_ty)
        tl.store(out + e, y, mask=e < n)
