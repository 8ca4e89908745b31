"""Triton kernels of the state ops. Host wrappers (stride checks, grids) live in ``triton_ops``.

Every unit is R rows of V contiguous elements (gdn: R = K, kda: R = 1), so one kernel shape serves both
granularities: a program owns BLOCK_R rows of one request and moves them as a [BLOCK_R, BLOCK_V] tile,
each row a vectorised V-contiguous load. Grids are (row blocks [+ conv blocks], requests): store and load
copy the conv state in the same launch. Addresses are int64.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from trtllm_dasc.state.ragged_index import listed_unit_rows, request_rows


@triton.jit
def _round_half_even(x):
    # 1.5 * 2**23: the sum leaves no fraction bits, so the fpu's round-to-nearest-even does the rounding
    # (exact for |x| < 2**22; callers clip first: 127, int4 7, fp8 subnormal codes < 8). libdevice.rint has no
    # interpreter twin.
    return (x + 12582912.0) - 12582912.0


@triton.jit
def _round_to_int(y, GPU: tl.constexpr):
    """fp32 y (clipped by the caller) -> int32, round to nearest even. GPU: cvt.rni, one instruction for
    _round_half_even's two adds and the truncating cvt.rzi that follows them (libdevice: no interpreter twin)."""
    if GPU:
        return libdevice.float2int_rn(y)
    return _round_half_even(y).to(tl.int32)


@triton.jit
def _row_scale(a, QMAX: tl.constexpr):
    """Per-row scale of paper Eq. 10 from the row max |x| a: max(a, 1e-8) / QMAX (127 int8, 448 fp8, 7 int4).
    div_rn: the ieee quotient, so the scales equal torch's bit for bit. A row max that is NaN or inf (_row_amax
    keeps a NaN; a row holding one or an infinity) gives a NaN scale, as codec_naive.row_amax does."""
    s = tl.math.div_rn(tl.maximum(a, 1e-8), tl.full(a.shape, QMAX, tl.float32))
    return tl.where(a <= 3.4028234663852886e38, s, float("nan"))


@triton.jit
def _max_keep_nan(a, b):
    # max.NaN.f32: one instruction, as the plain max
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _row_amax(x):
    """max |x| of each row of a [BLOCK_R, C] tile, NaN where the row holds a NaN. tl.max drops NaN (torch's amax
    keeps it), so a diverged state quantised to plausible finite codes on this path only and a cached
    checkpoint of it read back as a sane state; now its scale is NaN on both paths and it decodes to NaN, as
    the native codec keeps it. The same one reduction as tl.max: a second one (a finiteness flag) added
    barriers to the stores (tests/model/test_kernels_compile.py)."""
    return tl.reduce(tl.abs(x), 1, _max_keep_nan)


@triton.jit
def _div_fma(x, s, r):
    """x / s from r = RN(1 / s) (div_rn, once per scale): q0 = RN(x r), then RN(q0 + RN(x - s q0) r), two fmas
    (Markstein's correction). Three flops an element where div_rn's slow-path-guarded sequence takes about
    ten. GPU only: the interpreter's fma rounds twice. Equal to the ieee quotient wherever the residual
    x - s q0 does not underflow (below that |x / s| < 1e-26, code 0 either way): tests/state/fma_quotient.py
    is its numpy twin; its __main__ checks it against ieee division on every bf16 (x, amax) pair."""
    q0 = x * r
    return tl.math.fma(tl.math.fma(-q0, s, x), r, q0)


@triton.jit
def _div_rows(x, s, FAST_DIV: tl.constexpr, SIGNED_ZERO: tl.constexpr = False):
    """x [R, C] / s [R] row by row, the IEEE quotient either way: div_rn, or on a GPU (FAST_DIV) _div_fma from
    one div_rn reciprocal a row. SIGNED_ZERO (fp8 only): a zero x keeps its sign, as div_rn's: the fma
    sequence gives +0 for -0 (fma(+0, s, -0) = +0), which the fp8 code would carry (0x00 for torch's 0x80).
    The integer codecs (INT8, INT4) leave it off: -0 and +0 round to the same code 0, and the select costs a
    compare and a select an element (32 + 32 a thread in the INT8 store), which the Kimi-Linear stores,
    short on bytes, may not hide (H200: INT4's Kimi store at 85.2% of a same-size copy at b437fc4, before the
    select, 77.4% at 3b91433 with it); tests/model/test_kernels_compile.py keeps it out of INT8 and INT4."""
    sb = tl.broadcast_to(s[:, None], x.shape)
    if FAST_DIV:
        rb = tl.broadcast_to(tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)[:, None], x.shape)
        if SIGNED_ZERO:
            return tl.where(x == 0.0, x, _div_fma(x, sb, rb))
        return _div_fma(x, sb, rb)
    return tl.math.div_rn(x, sb)


@triton.jit
def _quantize_rows(x, FAST_DIV: tl.constexpr):
    """[BLOCK_R, BLOCK_V] fp32 tile (masked lanes 0) -> (q int32 in [-127, 127], s [BLOCK_R]); paper Eq. 10.
    The quotients x / s are IEEE-rounded either way, so they equal torch's bit for bit. FAST_DIV (on a GPU):
    _div_fma, by Markstein's correction the correctly rounded quotient (a = |x| <= 127 s, all normal): the
    INT8 store, short on bytes, could not hide div_rn's ten flops an element (`python -m benchmarks
    state_bandwidth`, Kimi W=128 at batch 64, measured on an H200: 62.0% of copy bandwidth with div_rn, 68.4%
    with this). Without FAST_DIV (Triton's interpreter, whose fma rounds twice) div_rn."""
    s = _row_scale(_row_amax(x), 127.0)
    y = tl.minimum(tl.maximum(_div_rows(x, s, FAST_DIV), -127.0), 127.0)
    return _round_to_int(y, FAST_DIV), s


@triton.jit
def _to_bf16_rtne(x):
    # fp32 -> bf16 round-to-nearest-even on the bits: the interpreter's own cast does not round like
    # torch, and this costs a few integer ops on a copy that is tiny next to the temporal state
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + (((bits >> 16) & 1) + 0x7FFF)
    y = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return tl.where(x == x, y, x.to(tl.bfloat16))


@triton.jit
def _conv_block(src, dst, i_src, i_dst, blk, cw, s_src_b, s_src_l, s_dst_b, s_dst_l,
                BLOCK: tl.constexpr, TO_BF16: tl.constexpr):
    """Block blk of one request's conv state, L layers of cw = conv_dim * width contiguous elements (src at
    i_src * s_src_b + l * s_src_l, dst likewise), cdiv(cw, BLOCK) blocks per layer; cast to dst's dtype
    (TO_BF16: rounded to nearest even like torch). The layer comes from one scalar division per program:
    a 64-bit division per element (the flat indexing this replaced) cost the INT8 stores, where the conv
    copy is a quarter of the bytes, a third of their bandwidth."""
    per_layer = tl.cdiv(cw, BLOCK)
    layer = (blk // per_layer).to(tl.int64)
    e = (blk - layer * per_layer) * BLOCK + tl.arange(0, BLOCK)
    mask = e < cw
    x = tl.load(src + i_src * s_src_b + layer * s_src_l + e, mask=mask, other=0)
    if TO_BF16:
        y = _to_bf16_rtne(x.to(tl.float32))
    else:
        y = x.to(dst.dtype.element_ty)
    tl.store(dst + i_dst * s_dst_b + layer * s_dst_l + e, y, mask=mask)


@triton.jit
def _conv8_encode_layer(src, dst, dst_scale, i_src, slot, layer, n, s_src_b, s_src_l, s_dst_b, s_dst_l, row4,
                        BLOCK: tl.constexpr, FAST_DIV: tl.constexpr = False):
    """8-bit conv encode of one (layer, request) (conv8_naive): src's n contiguous values at i_src * s_src_b +
    layer * s_src_l -> int8 codes at slot * s_dst_b + layer * s_dst_l of dst, the fp32 scale at float index
    row4 - 1 of that row (dst_scale: the same bytes viewed as fp32). Two passes of BLOCK-wide loads (amax,
    then quantize); the second reads the layer's few KiB from the cache. FAST_DIV (GPU, bf16 src): the
    quotients by _div_fma, equal to div_rn's codes for every bf16 x and amax (exhaustive: `python
    tests/state/fma_quotient.py`; a subset in test_fast_quotient.py); div_rn's per-element sequence made
    every +c8 store of a quantizing codec 10 us slower than without conv8 on the H200 (Kimi batch 64, issue
    35), while native+c8 hid it."""
    base = src + layer * s_src_l + i_src * s_src_b
    amax = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n, BLOCK):
        e = start + tl.arange(0, BLOCK)
        x = tl.load(base + e, mask=e < n, other=0.0).to(tl.float32)
        # NaN kept (tl.maximum drops it): a NaN or an infinity makes the layer's scale NaN, as in conv8_naive
        amax = _max_keep_nan(amax, tl.abs(x))
    # ieee division, so the scale and the quotients equal torch's bit for bit (paper Eq. 10)
    s = _row_scale(tl.reduce(amax, 0, _max_keep_nan), 127.0)
    # the correctly rounded reciprocal _div_fma needs (one division a layer)
    r = tl.math.div_rn(1.0, s)
    out = dst + slot * s_dst_b + layer * s_dst_l
    # the padding up to the scale is written too (zeros, as the reference writes): a slot is all defined bytes
    n_pad = row4 * 4 - 4
    for start in range(0, n_pad, BLOCK):
        e = start + tl.arange(0, BLOCK)
        x = tl.load(base + e, mask=e < n, other=0.0).to(tl.float32)
        sb = tl.zeros((BLOCK,), tl.float32) + s
        if FAST_DIV:
            y = _div_fma(x, sb, tl.zeros((BLOCK,), tl.float32) + r)
        else:
            y = tl.math.div_rn(x, sb)
        y = tl.minimum(tl.maximum(y, -127.0), 127.0)
        tl.store(out + e, _round_to_int(y, FAST_DIV).to(tl.int8), mask=e < n_pad)
    # s_dst_* are in int8 elements; the fp32 view's are a quarter of them
    tl.store(dst_scale + slot * (s_dst_b // 4) + layer * (s_dst_l // 4) + row4 - 1, s)


@triton.jit
def _conv8_decode_block(src, src_scale, dst, slot, i_dst, layer, e, n, s_src_b, s_src_l, s_dst_b, s_dst_l, row4,
                        TO_BF16: tl.constexpr):
    """8-bit conv decode of elements e of one (layer, slot) row into dst's (layer, request i_dst):
    codes * scale in fp32, cast to dst's dtype (TO_BF16: rounded to nearest even like torch)."""
    s = tl.load(src_scale + slot * (s_src_b // 4) + layer * (s_src_l // 4) + row4 - 1)
    x = tl.load(src + slot * s_src_b + layer * s_src_l + e, mask=e < n, other=0).to(tl.float32) * s
    if TO_BF16:
        y = _to_bf16_rtne(x)
    else:
        y = x.to(dst.dtype.element_ty)
    tl.store(dst + layer * s_dst_l + i_dst * s_dst_b + e, y, mask=e < n)


@triton.jit
def _conv_part(src, dst, scale, i_src, i_dst, blk, cw, row4, s_src_b, s_src_l, s_dst_b, s_dst_l,
               BLOCK: tl.constexpr, TO_BF16: tl.constexpr, CONV8: tl.constexpr):
    """Program blk (past the row blocks) of a store / load's conv state, fused into its launch. CONV8: 0 the
    conv copied in its dtype (cdiv(cw, BLOCK) programs a layer), 1 the 8-bit encode (one program a layer:
    its scale needs the layer's amax; quotients by div_rn), 3 the same with the fma quotient (GPU, bf16
    src: _conv8_encode_layer FAST_DIV), 2 the 8-bit decode (cdiv(cw, BLOCK) programs a layer). A separate
    launch for the conv state cost the +c8 / fp8 / int4 stores 7-13 us at batch 64 on the H200 (issue 35)."""
    if CONV8 == 1 or CONV8 == 3:
        _conv8_encode_layer(src, dst, scale, i_src, i_dst, blk.to(tl.int64), cw, s_src_b, s_src_l, s_dst_b,
                            s_dst_l, row4, BLOCK, CONV8 == 3)
    elif CONV8 == 2:
        per_layer = tl.cdiv(cw, BLOCK)
        layer = (blk // per_layer).to(tl.int64)
        e = (blk - layer * per_layer) * BLOCK + tl.arange(0, BLOCK)
        _conv8_decode_block(src, scale, dst, i_src, i_dst, layer, e, cw, s_src_b, s_src_l, s_dst_b, s_dst_l,
                            row4, TO_BF16)
    else:
        _conv_block(src, dst, i_src, i_dst, blk, cw, s_src_b, s_src_l, s_dst_b, s_dst_l, BLOCK, TO_BF16)


@triton.jit
def _gather_rows(src, dst, dst_scale, n_src, n_dst, blk, unit_layer, unit_src, unit_dst, n_rows,
                 stride_src_l, stride_src_n, stride_dst_b, stride_dst_l, stride_scale_b,
                 R: tl.constexpr, V: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
                 QUANT: tl.constexpr):
    E: tl.constexpr = R * V
    rmask, r, layer, u_src, u_dst = listed_unit_rows(blk, n_rows, unit_layer, unit_src, unit_dst, R, BLOCK_R)
    v = tl.arange(0, BLOCK_V)
    mask = rmask[:, None] & (v < V)[None, :]
    src_row = layer * stride_src_l + n_src * stride_src_n + u_src * E + r * V
    x = tl.load(src + src_row[:, None] + v[None, :], mask=mask, other=0.0)
    dst_row = n_dst * stride_dst_b + layer * stride_dst_l + u_dst * E + r * V
    if QUANT:
        q, s = _quantize_rows(x.to(tl.float32), QUANT == 2)
        tl.store(dst + dst_row[:, None] + v[None, :], q.to(tl.int8), mask=mask)
        tl.store(dst_scale + n_dst * stride_scale_b + u_dst * R + r, s.to(dst_scale.dtype.element_ty), mask=rmask)
    else:
        tl.store(dst + dst_row[:, None] + v[None, :], x.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def gather_units_kernel(src, dst, dst_scale, src_idx, dst_idx, unit_layer, unit_src, unit_dst, n_rows,
                        stride_src_l, stride_src_n, stride_dst_b, stride_dst_l, stride_scale_b,
                        conv_src, conv_dst, conv_cw, stride_csrc_b, stride_csrc_l,
                        stride_cdst_b, stride_cdst_l, conv_scale, conv_row4,
                        R: tl.constexpr, V: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
                        QUANT: tl.constexpr, CONV_BLOCK: tl.constexpr, TO_BF16: tl.constexpr,
                        CONV8: tl.constexpr = 0):
    """For each listed unit j (n_rows = J * R rows): read src[layer_j, src_idx[b], unit_src[j]] and write
    it at dst + dst_idx[b] * stride_dst_b + layer_j * stride_dst_l + unit_dst[j] * E. Pack/store use
    stride_dst_l = 0 (dst = slots), replay-merge dst = the active state. QUANT: int8 + one scale per row.
    Programs past the row blocks store the conv state (_conv_part: copied, or 8-bit encoded when CONV8)."""
    pid = tl.program_id(0)
    n_src, n_dst = request_rows(src_idx, dst_idx)
    n_tb = tl.cdiv(n_rows, BLOCK_R)
    if pid < n_tb:
        _gather_rows(src, dst, dst_scale, n_src, n_dst, pid, unit_layer, unit_src, unit_dst, n_rows,
                     stride_src_l, stride_src_n, stride_dst_b, stride_dst_l, stride_scale_b, R, V, BLOCK_R,
                     BLOCK_V, QUANT)
    else:
        _conv_part(conv_src, conv_dst, conv_scale, n_src, n_dst, pid - n_tb, conv_cw, conv_row4, stride_csrc_b,
                   stride_csrc_l, stride_cdst_b, stride_cdst_l, CONV_BLOCK, TO_BF16, CONV8)


@triton.jit
def _scatter_rows(src, src_scale, dst, slot, n_dst, blk, unit_layer, unit_pos, unit_local, n_rows,
                  stride_src_b, stride_scale_b, stride_dst_l, stride_dst_n,
                  R: tl.constexpr, V: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
                  DEQUANT: tl.constexpr):
    E: tl.constexpr = R * V
    rmask, r, layer, pos_raw, u = listed_unit_rows(blk, n_rows, unit_layer, unit_pos, unit_local, R, BLOCK_R)
    keep = rmask & (pos_raw >= 0)
    pos = tl.where(keep, pos_raw, 0)
    v = tl.arange(0, BLOCK_V)
    vmask = (v < V)[None, :]
    src_row = slot * stride_src_b + pos * E + r * V
    x = tl.load(src + src_row[:, None] + v[None, :], mask=keep[:, None] & vmask, other=0)
    if DEQUANT:
        s = tl.load(src_scale + slot * stride_scale_b + pos * R + r, mask=keep, other=0.0)
        x = x.to(tl.float32) * s.to(tl.float32)[:, None]
    dst_row = layer * stride_dst_l + n_dst * stride_dst_n + u * E + r * V
    # every listed row is written: a kept unit decoded, an omitted one (pos -1, listed for zero fill) as zero
    tl.store(dst + dst_row[:, None] + v[None, :], x.to(dst.dtype.element_ty), mask=rmask[:, None] & vmask)


@triton.jit
def scatter_units_kernel(src, src_scale, dst, src_idx, dst_idx, unit_layer, unit_pos, unit_local, n_rows,
                         stride_src_b, stride_scale_b, stride_dst_l, stride_dst_n,
                         conv_src, conv_dst, conv_cw, stride_csrc_b, stride_csrc_l,
                         stride_cdst_b, stride_cdst_l, conv_scale, conv_row4,
                         R: tl.constexpr, V: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
                         DEQUANT: tl.constexpr, CONV_BLOCK: tl.constexpr, TO_BF16: tl.constexpr,
                         CONV8: tl.constexpr = 0):
    """For each listed unit j (n_rows = J * R rows) of the active request dst[:, dst_idx[b]]: unit
    unit_local[j] of layer unit_layer[j] reads slot position unit_pos[j] of src[src_idx[b]] (dequantized
    when DEQUANT), or is written as zero where unit_pos[j] is -1. The host lists what the load writes
    (LayoutIndex.fill_*: every unit the layout owns, for zero fill; unit_*/slot_pos: the retained ones),
    so another codec segment's units are never visited: walking the whole state, a mixed checkpoint's load
    ran one program per block of every segment's rows in each segment's launch (Qwen3-Next at batch 64:
    331 us against a 185 us copy on the H200, issue 35). Programs past the row blocks load the conv state
    (_conv_part: copied, or 8-bit decoded when CONV8)."""
    pid = tl.program_id(0)
    slot, n_dst = request_rows(src_idx, dst_idx)
    n_tb = tl.cdiv(n_rows, BLOCK_R)
    if pid < n_tb:
        _scatter_rows(src, src_scale, dst, slot, n_dst, pid, unit_layer, unit_pos, unit_local, n_rows, stride_src_b,
                      stride_scale_b, stride_dst_l, stride_dst_n, R, V, BLOCK_R, BLOCK_V, DEQUANT)
    else:
        _conv_part(conv_src, conv_dst, conv_scale, slot, n_dst, pid - n_tb, conv_cw, conv_row4, stride_csrc_b,
                   stride_csrc_l, stride_cdst_b, stride_cdst_l, CONV_BLOCK, TO_BF16, CONV8)


@triton.jit
def quantize_kernel(x, q, s, n_rows, V: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
                    FAST_DIV: tl.constexpr):
    """x [n_rows, V] contiguous -> q int8 [n_rows, V], s [n_rows]."""
    ri = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    v = tl.arange(0, BLOCK_V)
    mask = (ri < n_rows)[:, None] & (v < V)[None, :]
    off = ri[:, None] * V + v[None, :]
    qv, sv = _quantize_rows(tl.load(x + off, mask=mask, other=0.0).to(tl.float32), FAST_DIV)
    tl.store(q + off, qv.to(tl.int8), mask=mask)
    tl.store(s + ri, sv.to(s.dtype.element_ty), mask=ri < n_rows)


@triton.jit
def dequantize_kernel(q, s, x, n_rows, V: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """q int8 [n_rows, V], s [n_rows] -> x [n_rows, V] = q * s (fp32 product, cast to x's dtype)."""
    ri = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    v = tl.arange(0, BLOCK_V)
    rmask = ri < n_rows
    mask = rmask[:, None] & (v < V)[None, :]
    off = ri[:, None] * V + v[None, :]
    sv = tl.load(s + ri, mask=rmask, other=0.0).to(tl.float32)
    y = tl.load(q + off, mask=mask, other=0).to(tl.float32) * sv[:, None]
    tl.store(x + off, y.to(x.dtype.element_ty), mask=mask)

