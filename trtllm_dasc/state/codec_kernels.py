"""Triton kernels of the FP8 / INT4 codecs (issue 35); torch reference in ``codec_naive``, wrappers in
``codec_ops``. CODEC: 1 fp8 (e4m3fn bits in a uint8), 2 int4 (two values a byte, low nibble first).

Tiles are [BLOCK_R, BLOCK_B]: BLOCK_R rows of one request, BLOCK_B >= the payload bytes of a row (fp8 V,
int4 V // 2; an int4 tile moves its rows' 2 * BLOCK_B values with one contiguous load or store and packs or
interleaves the even and odd elements in registers: two stride-2 accesses have contiguity 1 along the row, so
Triton's coalescing put a warp's 32 lanes on 32 different rows, 32 sectors an instruction, ~10x slower on the
H200 at be51277). The fp8
encode / decode work on the bits (round to nearest even, like torch's cast) in the interpreter, where Triton's
own fp8 cast is not defined the same way; on a GPU the encode is the hardware's conversion (FAST_DIV), the same
rounding (tests/state/test_codecs_fp8_int4.py checks it near every e4m3fn midpoint there).
Quotients use div_rn (the IEEE quotient torch computes) in the interpreter; on a GPU the fma quotient
(kernels._div_rows, FAST_DIV), proven to give div_rn's int4 and fp8 codes (tests/state/fma_quotient.py). Addresses
are int64.
"""
from __future__ import annotations

import triton
import triton.language as tl

from trtllm_dasc.state.kernels import (_conv_part, _div_rows, _round_half_even, _round_to_int, _row_amax,
                                       _row_scale)
from trtllm_dasc.state.ragged_index import listed_unit_rows, request_rows


@triton.jit
def _fp8_encode(y):
    """fp32 y, finite, |y| <= 448 -> e4m3fn bits (uint8), round to nearest even."""
    bits = y.to(tl.uint32, bitcast=True)
    sign = (bits >> 31) << 7
    a = tl.abs(y)
    # below 2^-6 the format is subnormal with a fixed quantum of 2^-9: code = round(a * 2^9), 8 = 2^-6
    sub = _round_half_even(a * 512.0).to(tl.uint32)
    ab = a.to(tl.uint32, bitcast=True)
    # 3 of 23 mantissa bits kept, rounded to nearest even on the bits (a carry bumps the exponent)
    nb = (ab + (((ab >> 20) & 1) + 0x7FFFF)) >> 20
    # rebias the exponent from 127 to 7: (127 - 7) << 3
    norm = nb - tl.where(a < 0.015625, 0, 960).to(tl.uint32)
    code = tl.where(a < 0.015625, sub, norm)
    return (code | sign).to(tl.uint8)


@triton.jit
def _fp8_decode(c):
    """e4m3fn bits (uint8, never NaN) -> fp32, exact."""
    c = c.to(tl.uint32)
    e = (c >> 3) & 15
    m = c & 7
    sub = m.to(tl.float32) * 0.001953125
    norm = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    v = tl.where(e == 0, sub, norm)
    # the sign goes in as a bit: the interpreter's negation turns 0x80 into +0.0, torch gives -0.0
    return (v.to(tl.uint32, bitcast=True) | ((c >> 7) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _int4_code(y, GPU: tl.constexpr = False):
    return _round_to_int(tl.minimum(tl.maximum(y, -7.0), 7.0), GPU) & 15


@triton.jit
def _nibble(b):
    q = b.to(tl.int32)
    return tl.where(q >= 8, q - 16, q).to(tl.float32)


@triton.jit
def _encode_rows(src, row, rmask, V: tl.constexpr, BLOCK_B: tl.constexpr, CODEC: tl.constexpr,
                 FAST_DIV: tl.constexpr = False):
    """Rows at src + row[i] (V contiguous values each) -> (bytes [BLOCK_R, BLOCK_B] uint8, s [BLOCK_R]).
    FAST_DIV (GPU only: the interpreter's fma rounds twice): the quotients by kernels._div_rows' fma sequence,
    whose int4 and fp8 codes equal div_rn's for every fp32 scale and every x near a code
    boundary (int4's k + 1/2, every e4m3fn midpoint: `python tests/state/fma_quotient.py`)."""
    b = tl.arange(0, BLOCK_B)
    if CODEC == 1:
        mask = rmask[:, None] & (b < V)[None, :]
        x = tl.load(src + row[:, None] + b[None, :], mask=mask, other=0.0).to(tl.float32)
        s = _row_scale(_row_amax(x), 448.0)
        y = tl.minimum(tl.maximum(_div_rows(x, s, FAST_DIV, True), -448.0), 448.0)
        if FAST_DIV:
            # on a GPU the hardware's conversion (sm90: cvt.rn.satfinite.e4m3x2.f32, round to nearest even like
            # _fp8_encode and torch's cast; y is finite and within +-448): one instruction for two values where
            # the bit arithmetic takes about fifteen an element
            out = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        else:
            out = _fp8_encode(y)
    else:
        # one contiguous load of the whole row (V even): two stride-2 loads made the coalescer map a warp across
        # rows (module docstring). The codes are packed where they are: each shifted by 4 x its element's
        # parity, then summed over (even, odd) pairs, a reduction inside a thread's contiguous values; a
        # tl.split of the fp32 tile into even / odd halves went through shared memory (sm90 ptx: 11 bar.sync,
        # 3 here; test_kernels_compile guards it)
        e = tl.arange(0, 2 * BLOCK_B)
        mask = rmask[:, None] & (e < V)[None, :]
        x = tl.load(src + row[:, None] + e[None, :], mask=mask, other=0.0).to(tl.float32)
        s = _row_scale(_row_amax(x), 7.0)
        y = _div_rows(x, s, FAST_DIV)
        c = _int4_code(y, FAST_DIV)
        c = c << ((e & 1) * 4)[None, :]
        out = tl.sum(tl.reshape(c, (x.shape[0], BLOCK_B, 2)), axis=2).to(tl.uint8)
    return out, s


@triton.jit
def _decode_rows(src, row, s, keep, dst, drow, wmask, V: tl.constexpr, BLOCK_B: tl.constexpr,
                 CODEC: tl.constexpr):
    """Bytes at src + row[i] with scales s -> values written at dst + drow[i] (rows where wmask; rows
    without keep read as zero, so zero-fill writes zeros)."""
    b = tl.arange(0, BLOCK_B)
    if CODEC == 1:
        vm = (b < V)[None, :]
        c = tl.load(src + row[:, None] + b[None, :], mask=keep[:, None] & vm, other=0)
        y = _fp8_decode(c) * s[:, None]
        tl.store(dst + drow[:, None] + b[None, :], y.to(dst.dtype.element_ty), mask=wmask[:, None] & vm)
    else:
        vm = (b < V // 2)[None, :]
        c = tl.load(src + row[:, None] + b[None, :], mask=keep[:, None] & vm, other=0).to(tl.int32)
        lo = _nibble(c & 15) * s[:, None]
        hi = _nibble(c >> 4) * s[:, None]
        # interleave in registers (join's new last axis, row-major reshape: lo0, hi0, lo1, hi1, ...) and write
        # the row with one contiguous store: two stride-2 stores made the coalescer map a warp across 32 rows
        # (module docstring); speed unmeasured until the next GPU run of `benchmarks state_bandwidth`
        y = tl.reshape(tl.join(lo, hi), (c.shape[0], 2 * BLOCK_B))
        e = tl.arange(0, 2 * BLOCK_B)
        m = wmask[:, None] & (e < V)[None, :]
        tl.store(dst + drow[:, None] + e[None, :], y.to(dst.dtype.element_ty), mask=m)


@triton.jit
def quantize_rows_kernel(x, q, s, n_rows, V: tl.constexpr, VB: tl.constexpr, BLOCK_R: tl.constexpr,
                         BLOCK_B: tl.constexpr, CODEC: tl.constexpr, FAST_DIV: tl.constexpr = False):
    """x [n_rows, V] contiguous -> q uint8 [n_rows, VB], s [n_rows]."""
    ri = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    rmask = ri < n_rows
    out, sv = _encode_rows(x, ri * V, rmask, V, BLOCK_B, CODEC, FAST_DIV)
    b = tl.arange(0, BLOCK_B)
    tl.store(q + ri[:, None] * VB + b[None, :], out, mask=rmask[:, None] & (b < VB)[None, :])
    tl.store(s + ri, sv.to(s.dtype.element_ty), mask=rmask)


@triton.jit
def dequantize_rows_kernel(q, s, x, n_rows, V: tl.constexpr, VB: tl.constexpr, BLOCK_R: tl.constexpr,
                           BLOCK_B: tl.constexpr, CODEC: tl.constexpr):
    """q uint8 [n_rows, VB], s [n_rows] -> x [n_rows, V]."""
    ri = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    rmask = ri < n_rows
    sv = tl.load(s + ri, mask=rmask, other=0.0).to(tl.float32)
    _decode_rows(q, ri * VB, sv, rmask, x, ri * V, rmask, V, BLOCK_B, CODEC)


@triton.jit
def store_units_kernel(src, dst, dst_scale, src_idx, dst_idx, unit_layer, unit_src, unit_dst, n_rows,
                       stride_src_l, stride_src_n, stride_dst_b, stride_scale_b,
                       conv_src, conv_dst, conv_cw, stride_csrc_b, stride_csrc_l, stride_cdst_b, stride_cdst_l,
                       conv_scale, conv_row4,
                       R: tl.constexpr, V: tl.constexpr, VB: tl.constexpr, BLOCK_R: tl.constexpr,
                       BLOCK_B: tl.constexpr, CODEC: tl.constexpr, CONV_BLOCK: tl.constexpr = 16,
                       TO_BF16: tl.constexpr = False, CONV8: tl.constexpr = 0, FAST_DIV: tl.constexpr = False):
    """Listed unit j (n_rows = J * R rows) of active row src_idx[b]: src[layer_j, n, unit_src[j]] is
    encoded into slot dst_idx[b] at position unit_dst[j]: dst [S, width, R * VB] uint8 (slot stride
    stride_dst_b), dst_scale [S, width, R] (slot stride stride_scale_b). Programs past the row blocks
    store the conv state in the same launch (kernels._conv_part: copied, or 8-bit encoded when CONV8)."""
    pid = tl.program_id(0)
    n_src, n_dst = request_rows(src_idx, dst_idx)
    n_tb = tl.cdiv(n_rows, BLOCK_R)
    if pid < n_tb:
        rmask, r, layer, u_src, u_dst = listed_unit_rows(pid, n_rows, unit_layer, unit_src, unit_dst, R, BLOCK_R)
        src_row = layer * stride_src_l + n_src * stride_src_n + u_src * (R * V) + r * V
        out, s = _encode_rows(src, src_row, rmask, V, BLOCK_B, CODEC, FAST_DIV)
        bb = tl.arange(0, BLOCK_B)
        dst_row = n_dst * stride_dst_b + u_dst * (R * VB) + r * VB
        tl.store(dst + dst_row[:, None] + bb[None, :], out, mask=rmask[:, None] & (bb < VB)[None, :])
        tl.store(dst_scale + n_dst * stride_scale_b + u_dst * R + r, s.to(dst_scale.dtype.element_ty), mask=rmask)
    else:
        _conv_part(conv_src, conv_dst, conv_scale, n_src, n_dst, pid - n_tb, conv_cw, conv_row4, stride_csrc_b,
                   stride_csrc_l, stride_cdst_b, stride_cdst_l, CONV_BLOCK, TO_BF16, CONV8)


@triton.jit
def load_units_kernel(src, src_scale, dst, src_idx, dst_idx, unit_layer, unit_pos, unit_local, n_rows,
                      stride_src_b, stride_scale_b, stride_dst_l, stride_dst_n,
                      conv_src, conv_dst, conv_cw, stride_csrc_b, stride_csrc_l, stride_cdst_b, stride_cdst_l,
                      conv_scale, conv_row4,
                      R: tl.constexpr, V: tl.constexpr, VB: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_B: tl.constexpr, CODEC: tl.constexpr, CONV_BLOCK: tl.constexpr = 16,
                      TO_BF16: tl.constexpr = False, CONV8: tl.constexpr = 0):
    """Listed unit j (n_rows = J * R rows) of active request dst[:, dst_idx[b]]: unit unit_local[j] of layer
    unit_layer[j] is decoded from position unit_pos[j] of slot src_idx[b], or written as zero where
    unit_pos[j] is -1. The host lists only the units this codec group writes (kernels.scatter_units_kernel
    says why: walking every unit made a mixed load visit all its segments' rows in each launch). Programs
    past the row blocks load the conv state in the same launch (kernels._conv_part)."""
    pid = tl.program_id(0)
    slot, n_dst = request_rows(src_idx, dst_idx)
    n_tb = tl.cdiv(n_rows, BLOCK_R)
    if pid < n_tb:
        rmask, r, layer, pos, u = listed_unit_rows(pid, n_rows, unit_layer, unit_pos, unit_local, R, BLOCK_R)
        keep = rmask & (pos >= 0)
        pos = tl.where(keep, pos, 0)
        s = tl.load(src_scale + slot * stride_scale_b + pos * R + r, mask=keep, other=0.0).to(tl.float32)
        src_row = slot * stride_src_b + pos * (R * VB) + r * VB
        dst_row = layer * stride_dst_l + n_dst * stride_dst_n + u * (R * V) + r * V
        _decode_rows(src, src_row, s, keep, dst, dst_row, rmask, V, BLOCK_B, CODEC)
    else:
        _conv_part(conv_src, conv_dst, conv_scale, slot, n_dst, pid - n_tb, conv_cw, conv_row4, stride_csrc_b,
                   stride_csrc_l, stride_cdst_b, stride_cdst_l, CONV_BLOCK, TO_BF16, CONV8)
