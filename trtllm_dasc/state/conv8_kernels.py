"""Triton kernels of the 8-bit conv-state codec (conv8_naive.py is the reference and says why per layer).

One program per (layer, request): the layer's conv_dim * width values are contiguous in the active state,
so two passes of BLOCK-wide vector loads (amax, then quantize) or one (decode). Host wrappers: conv8_ops.
The per-layer code lives in kernels.py (_conv8_*), which the checkpoint store / load kernels also run in
their own launch (kernels._conv_part); these standalone kernels serve conv8_ops' direct callers.
"""
from __future__ import annotations

import triton
import triton.language as tl

from trtllm_dasc.state.kernels import _conv8_decode_block, _conv8_encode_layer
from trtllm_dasc.state.ragged_index import request_rows


@triton.jit
def conv8_encode_kernel(src, dst, dst_scale, rows, slots, n, stride_src_l, stride_src_n, stride_dst_b,
                        stride_dst_l, ROW4: tl.constexpr, BLOCK: tl.constexpr, FAST_DIV: tl.constexpr = False):
    """src [L, N, n] (rows contiguous) rows[b] -> dst int8 [S, L, row] slots[b]: codes at [0, n), the fp32
    scale at float index ROW4 - 1 of dst_scale (the same bytes viewed as fp32). FAST_DIV: the fma quotient
    (kernels._div_fma; GPU and bf16 src only)."""
    layer = tl.program_id(0).to(tl.int64)
    i_src, slot = request_rows(rows, slots)
    _conv8_encode_layer(src, dst, dst_scale, i_src, slot, layer, n, stride_src_n, stride_src_l, stride_dst_b,
                        stride_dst_l, ROW4, BLOCK, FAST_DIV)


@triton.jit
def conv8_decode_kernel(src, src_scale, dst, slots, rows, n, stride_src_b, stride_src_l, stride_dst_l,
                        stride_dst_n, ROW4: tl.constexpr, BLOCK: tl.constexpr, TO_BF16: tl.constexpr):
    """src int8 [S, L, row] slots[b] -> dst [L, N, n] rows[b] = codes * scale (fp32), cast to dst's dtype."""
    layer = tl.program_id(0).to(tl.int64)
    slot, i_dst = request_rows(slots, rows)
    for start in range(0, n, BLOCK):
        e = start + tl.arange(0, BLOCK)
        _conv8_decode_block(src, src_scale, dst, slot, i_dst, layer, e, n, stride_src_b, stride_src_l,
                            stride_dst_n, stride_dst_l, ROW4, TO_BF16)
