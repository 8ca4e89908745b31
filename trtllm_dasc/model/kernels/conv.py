"""The prefill's short convolution in Triton: depthwise causal conv + SiLU over varlen tokens from the carried
state, q and k l2-normalised per head, and each part (q, k, v) written to an output of its own.
`conv_parts_reference` below is the torch reference with the same signature (ops.causal_conv + ops.l2norm).

Why: on the H200 at 16k tokens the Kimi-Linear-shaped stack spent 0.45 ms per KDA layer in fla's conv
(three calls, one per part, so the chunk kernels get contiguous q / k / v; about 1.8 TB/s) and another
0.13 ms in the l2norm passes fla's chunk kernels make over q and k (measured on an H200 by
`python -m benchmarks model_prefill --arch kda --profile`); at 4k tokens its eight launches per layer
counted more than their bytes. Here one pass reads the inputs once and writes the parts once, already
normalised (a second, small one redoes each sequence's first W-1 rows, see below), and the chunk kernels are
told not to normalise again (recurrence/fla.py, qk_normalized).

Two main kernels, the same results: with the stacks' window W = 4 the rows kernel (_conv_rows_kernel, the
default: a program takes a range of one sequence's tokens and a block of whole heads, reads each row once and
carries the last three inputs in registers); for other windows the tile kernel (_conv_parts_kernel: a
program takes BT tokens of one sequence and one head's channels, BD = the head dim, a power of two that
divides every part; the conv's W taps are W shifted loads of the same tile). The head's l2 norm is a sum
over the head's channels inside the program. The first W-1 outputs of each sequence, whose taps reach back
into its carried state, are redone by a second small kernel (the state's [C, W-1] layout makes those loads
scalar: in the main kernel they cost registers and spills in every tile), which also writes the new state.
The new state and the captured states are the last W-1 inputs before a position: the second kernel writes
the new state; checkpoint captures come from fused_ops._windows, as before.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from trtllm_dasc.model.recurrence.fla import cu_tensors
from trtllm_dasc.model.ops import causal_conv, l2norm

# tokens per tile, warps, tiles per program: the fastest of the twelve choices `python -m benchmarks
# conv_prefill` times at 16k tokens. measured on an H200: 32 tokens at 4 warps took 0.349 ms on the
# Kimi-Linear shape (55% of a copy of the same bytes) where 64 at 8 warps (the choice before) took 0.431 and
# 128 at 8 warps 0.630; more tiles per program did not help. Bigger tiles hold more registers and leave fewer
# loads in flight per SM. tests/model/test_kernels_compile.py keeps the launch free of register spills (ptxas).
BLOCK_T = 32
WARPS = 4
TILES = 1                # tiles a program takes one after the other
# the rows kernel (W = 4, both stacks' window): (tokens per program, widest channel block, warps), the
# fastest of `python -m benchmarks conv_prefill`'s rows choices. measured on an H200 at 16k tokens: 64 tokens
# of 256 channels at one warp took 0.266 ms on the Kimi-Linear shape (72% of copy speed; 0.181 ms, 71%, on
# Qwen3-Next's), where the tile kernel's best, (32, 4, 1) above, took 0.347 (55%): it reads each input row
# once where the tile kernel's W shifted loads re-read W-1 rows per tile. Blocks of 1024 channels at 4 warps
# were as fast (0.269); longer ranges slower.
ROWS: tuple[int, int, int] | None = (64, 256, 1)
EPS = 1e-6               # fla's l2norm eps (ops.l2norm), which the chunk kernels would otherwise apply


@triton.jit
def _part_of(c0, C, S1, S2):
    """(first channel, width) of the part that channel c0 is in: channels [0, S1) are part 0, [S1, S2) part 1,
    [S2, C) part 2. Part p lands in the flat output at T_total x its first channel, row stride its width."""
    start = tl.where(c0 < S1, 0, tl.where(c0 < S2, S1, S2))
    width = tl.where(c0 < S1, S1, tl.where(c0 < S2, S2 - S1, C - S2))
    return start, width


@triton.jit
def _finish(acc, out, bos, o_t, m_t, o_c, c0, T_total, C, S1, S2, NORM_C, eps):
    """SiLU, the l2 norm of q/k heads (channels below NORM_C, one head per block), the store into the part."""
    y = acc * tl.sigmoid(acc)
    if c0 < NORM_C:
        y = y * (1 / tl.sqrt(tl.sum(y * y, 1) + eps))[:, None]
    start, width = _part_of(c0, C, S1, S2)
    base = out + start.to(tl.int64) * T_total
    tl.store(base + (bos + o_t)[:, None] * width + (o_c - start)[None, :], y.to(out.dtype.element_ty),
             mask=m_t[:, None])


@triton.jit
def _conv_parts_kernel(x, weight, out, chunks, cu, stride_x, T_total, C, S1, S2, NORM_C, eps, NT, W: tl.constexpr,
                       BT: tl.constexpr, BD: tl.constexpr, G: tl.constexpr):
    """Program (channel block, G consecutive chunks), flattened on grid axis 0 with the channel blocks fastest
    (axis 1 would cap the chunks at 65535): chunk = (sequence, tile) from `chunks` (NT of them). The taps
    before a sequence's first token read 0 here: _conv_head_kernel redoes those W-1 rows from the carried
    state afterwards."""
    pid = tl.program_id(0)
    blocks = C // BD
    i_c = pid % blocks
    c0 = i_c * BD
    o_c = c0 + tl.arange(0, BD)
    for g in tl.static_range(G):
        i_k = pid // blocks * G + g
        if i_k < NT:
            n = tl.load(chunks + 2 * i_k).to(tl.int64)
            t0 = tl.load(chunks + 2 * i_k + 1).to(tl.int64) * BT
            bos = tl.load(cu + n).to(tl.int64)
            length = tl.load(cu + n + 1).to(tl.int64) - bos
            o_t = t0 + tl.arange(0, BT)                        # positions inside the sequence
            m_t = o_t < length
            acc = tl.zeros([BT, BD], dtype=tl.float32)
            for j in tl.static_range(W):
                # W vectorised loads of the tile, each shifted by one row
                p = o_t - (W - 1) + j
                xv = tl.load(x + (bos + p)[:, None] * stride_x + o_c[None, :], mask=(m_t & (p >= 0))[:, None],
                             other=0.0)
                acc += xv.to(tl.float32) * tl.load(weight + o_c * W + j).to(tl.float32)[None, :]
            _finish(acc, out, bos, o_t, m_t, o_c, c0, T_total, C, S1, S2, NORM_C, eps)


@triton.jit
def _rows_finish(acc, row, ok, q, width, norm, eps):
    """_finish for one token row of the rows kernel: acc [heads, HD] fp32 (its l2 norm a sum along axis 1),
    q the row-0 pointers of the block's channels in their part (row stride width)."""
    y = acc * tl.sigmoid(acc)
    if norm:
        y = y * (1 / tl.sqrt(tl.sum(y * y, 1) + eps))[:, None]
    tl.store(q + row * width, y.to(q.dtype.element_ty), mask=ok)


@triton.jit
def _conv_rows_kernel(x, weight, out, ranges, stride_x, T_total, C, S1, S2, NORM_C, eps, BC: tl.constexpr,
                      HD: tl.constexpr):
    """W = 4 only. Program (channel block of BC channels, token range from `ranges`: first row, rows, the
    sequence's first row), flattened on axis 0 with the channel blocks fastest. The range's rows are read
    once each, eight rows a step (all eight loads written before any store: the compiler may not move a load
    above a store it cannot prove apart), and the last three inputs ride along in registers: no shifted
    re-reads. Taps before the sequence's first row read 0, as in _conv_parts_kernel (_conv_head_kernel redoes
    those rows from the carried state)."""
    pid = tl.program_id(0)
    blocks = C // BC
    i_c = pid % blocks
    i_r = pid // blocks
    r0 = tl.load(ranges + 3 * i_r).to(tl.int64)
    n = tl.load(ranges + 3 * i_r + 1)
    bos = tl.load(ranges + 3 * i_r + 2).to(tl.int64)
    c0 = i_c * BC
    o_hd = c0 + tl.arange(0, BC // HD)[:, None] * HD + tl.arange(0, HD)[None, :]      # [heads, HD] channels
    w0 = tl.load(weight + o_hd * 4).to(tl.float32)
    w1 = tl.load(weight + o_hd * 4 + 1).to(tl.float32)
    w2 = tl.load(weight + o_hd * 4 + 2).to(tl.float32)
    w3 = tl.load(weight + o_hd * 4 + 3).to(tl.float32)
    p = x + o_hd
    h1 = tl.load(p + (r0 - 3) * stride_x, mask=r0 - 3 >= bos, other=0.0).to(tl.float32)
    h2 = tl.load(p + (r0 - 2) * stride_x, mask=r0 - 2 >= bos, other=0.0).to(tl.float32)
    h3 = tl.load(p + (r0 - 1) * stride_x, mask=r0 - 1 >= bos, other=0.0).to(tl.float32)
    start, width = _part_of(c0, C, S1, S2)
    q = out + start.to(tl.int64) * T_total + (o_hd - start)
    norm = c0 < NORM_C
    for i in range(0, n, 8):
        r = r0 + i
        f0 = tl.load(p + r * stride_x, mask=i < n, other=0.0).to(tl.float32)
        f1 = tl.load(p + (r + 1) * stride_x, mask=i + 1 < n, other=0.0).to(tl.float32)
        f2 = tl.load(p + (r + 2) * stride_x, mask=i + 2 < n, other=0.0).to(tl.float32)
        f3 = tl.load(p + (r + 3) * stride_x, mask=i + 3 < n, other=0.0).to(tl.float32)
        f4 = tl.load(p + (r + 4) * stride_x, mask=i + 4 < n, other=0.0).to(tl.float32)
        f5 = tl.load(p + (r + 5) * stride_x, mask=i + 5 < n, other=0.0).to(tl.float32)
        f6 = tl.load(p + (r + 6) * stride_x, mask=i + 6 < n, other=0.0).to(tl.float32)
        f7 = tl.load(p + (r + 7) * stride_x, mask=i + 7 < n, other=0.0).to(tl.float32)
        _rows_finish(w0 * h1 + w1 * h2 + w2 * h3 + w3 * f0, r, i < n, q, width, norm, eps)
        _rows_finish(w0 * h2 + w1 * h3 + w2 * f0 + w3 * f1, r + 1, i + 1 < n, q, width, norm, eps)
        _rows_finish(w0 * h3 + w1 * f0 + w2 * f1 + w3 * f2, r + 2, i + 2 < n, q, width, norm, eps)
        _rows_finish(w0 * f0 + w1 * f1 + w2 * f2 + w3 * f3, r + 3, i + 3 < n, q, width, norm, eps)
        _rows_finish(w0 * f1 + w1 * f2 + w2 * f3 + w3 * f4, r + 4, i + 4 < n, q, width, norm, eps)
        _rows_finish(w0 * f2 + w1 * f3 + w2 * f4 + w3 * f5, r + 5, i + 5 < n, q, width, norm, eps)
        _rows_finish(w0 * f3 + w1 * f4 + w2 * f5 + w3 * f6, r + 6, i + 6 < n, q, width, norm, eps)
        _rows_finish(w0 * f4 + w1 * f5 + w2 * f6 + w3 * f7, r + 7, i + 7 < n, q, width, norm, eps)
        h1, h2, h3 = f5, f6, f7


@triton.jit
def _conv_head_kernel(x, weight, state, out, new_state, cu, stride_x, stride_sn, stride_sc, T_total, C, S1, S2,
                      NORM_C, eps, W: tl.constexpr, BW: tl.constexpr, BD: tl.constexpr):
    """Program (channel block, sequence), after _conv_parts_kernel: the sequence's first W-1 outputs again,
    their taps before the first token read from the carried state (state [N, C, W-1], any strides; scalar
    loads, which is why they are not in the main kernel), and its new state, the last W-1 inputs
    (new_state [N, C, W-1], contiguous). BW: W-1 rounded up to a power of two."""
    i_c = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    bos = tl.load(cu + n).to(tl.int64)
    length = tl.load(cu + n + 1).to(tl.int64) - bos
    o_t = tl.arange(0, BW).to(tl.int64)
    c0 = i_c * BD
    o_c = c0 + tl.arange(0, BD)
    m_t = (o_t < W - 1) & (o_t < length)
    acc = tl.zeros([BW, BD], dtype=tl.float32)
    for j in tl.static_range(W):
        p = o_t - (W - 1) + j                          # the input this tap reads
        xv = tl.load(x + (bos + p)[:, None] * stride_x + o_c[None, :], mask=(m_t & (p >= 0))[:, None], other=0.0)
        sv = tl.load(state + n * stride_sn + o_c[None, :] * stride_sc + (p + W - 1)[:, None],
                     mask=(m_t & (p < 0))[:, None], other=0.0)
        acc += (xv.to(tl.float32) + sv.to(tl.float32)) * tl.load(weight + o_c * W + j).to(tl.float32)[None, :]
    _finish(acc, out, bos, o_t, m_t, o_c, c0, T_total, C, S1, S2, NORM_C, eps)
    # the new state: inputs length-(W-1) .. length-1, from x or (a sequence shorter than W-1) the old state;
    # exactly one of the two loads is the input (the other is 0), so the sum is it, exactly
    last = length - (W - 1) + o_t
    m_s = o_t < W - 1
    lx = tl.load(x + (bos + last)[:, None] * stride_x + o_c[None, :], mask=(m_s & (last >= 0))[:, None], other=0.0)
    ls = tl.load(state + n * stride_sn + o_c[None, :] * stride_sc + (last + W - 1)[:, None],
                 mask=(m_s & (last < 0))[:, None], other=0.0)
    tl.store(new_state + (n * C + o_c[None, :]) * (W - 1) + o_t[:, None],
             (lx.to(tl.float32) + ls.to(tl.float32)).to(new_state.dtype.element_ty), mask=m_s[:, None])


# (kind, cu_seqlens, tokens per tile or range, device) -> the kernels' tables on the device (_device_table)
_CHUNKS: dict = {}


def _device_table(key: tuple, device, width: int, rows) -> torch.Tensor:
    """rows() (a list of int tuples of `width`) as an int32 [n, width] tensor on the device, made once per key:
    every layer of a forward asks for the same table (cu_seqlens itself: recurrence/fla.cu_tensors' cache)."""
    key = (*key, str(device))
    hit = _CHUNKS.get(key)
    if hit is None:
        if len(_CHUNKS) >= 256:          # a serving loop sees many batch shapes: forget, never grow
            _CHUNKS.clear()
        hit = _CHUNKS[key] = torch.tensor(rows(), dtype=torch.int32).reshape(-1, width).to(device)
    return hit


def _chunks(cu_seqlens: list[int], device, bt: int = BLOCK_T) -> torch.Tensor:
    """The tile kernel's table [NT, 2]: (sequence, tile) of every tile of bt tokens."""
    return _device_table(("chunks", tuple(cu_seqlens), bt), device, 2, lambda: [
        (n, t) for n, (a, b) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])) for t in range(-(-(b - a) // bt))])


def _layout(parts: list[int], C: int) -> tuple[list[int], int, int]:
    """(part bounds [0, p0, p0+p1, ..., C], S1, S2) as the kernels take them (_part_of)."""
    bounds = [0]
    for p in parts:
        bounds.append(bounds[-1] + p)
    S1, S2 = (bounds[1:3] + [C, C])[:2]
    return bounds, S1, S2


def _split(out: torch.Tensor, rows: int, bounds: list[int]) -> tuple[torch.Tensor, ...]:
    """The parts of a flat kernel output: part i is a contiguous [rows, width_i] block."""
    return tuple(out[rows * a:rows * b].view(rows, b - a) for a, b in zip(bounds[:-1], bounds[1:]))


def supports(parts: list[int], head_dim: int, W: int) -> bool:
    """Whether the kernel takes these shapes: at most three parts, each a multiple of a power-of-two head dim."""
    return (len(parts) <= 3 and head_dim >= 16 and head_dim & (head_dim - 1) == 0 and 1 < W <= 8
            and all(p % head_dim == 0 for p in parts))


def _ranges(cu_seqlens: list[int], device, rows: int) -> torch.Tensor:
    """The rows kernel's table [NR, 3]: (first row, rows, the sequence's first row) of each range of at most
    `rows` tokens inside one sequence."""
    return _device_table(("ranges", tuple(cu_seqlens), rows), device, 3, lambda: [
        (r, min(rows, b - r), a) for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:]) for r in range(a, b, rows)])


def rows_block(parts: list[int], head_dim: int, widest: int) -> int:
    """Channels a program of the rows kernel takes: the largest power of two up to `widest` that divides
    every part (a block never straddles two parts) and holds whole heads."""
    bc = max(head_dim, widest)
    while bc > head_dim and any(p % bc for p in parts):
        bc //= 2
    return bc


def conv_parts(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, cu_seqlens: list[int],
               parts: list[int], normalized: int, head_dim: int, tiles: tuple[int, int, int] | None = None,
               rows: tuple[int, int, int] | None = None) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(outputs, new state): silu(causal_conv(x)) cut into `parts` channels, each a contiguous [T, c] tensor
    in x's dtype, the first `normalized` parts l2-normalised per group of head_dim channels (fp32 inside,
    one rounding); the new state [N, C, W-1] in conv_state's dtype (ops.causal_conv's).

    x [T, C] (a column slice is fine: unit channel stride); weight [C, W]; conv_state [N, C, W-1] (any
    strides); cu_seqlens: the N sequences' token offsets. The caller checks supports(). Which kernel:
    rows = (tokens per program, widest channel block, warps) takes _conv_rows_kernel (W = 4 only), tiles =
    (tokens per tile, warps, tiles per program) _conv_parts_kernel; neither: the module's defaults
    (benchmarks/conv_prefill.py times the choices)."""
    T, C = x.shape
    W = weight.shape[1]
    assert x.stride(1) == 1 and sum(parts) == C and supports(parts, head_dim, W), (x.stride(), parts, head_dim)
    bounds, S1, S2 = _layout(parts, C)
    if conv_state.stride(2) != 1:
        conv_state = conv_state.contiguous()
    out = torch.empty(T * C, dtype=x.dtype, device=x.device)
    new_state = torch.empty(conv_state.shape, dtype=conv_state.dtype, device=x.device)
    cu = cu_tensors(cu_seqlens, x.device)[0]
    w = weight.contiguous()
    args = (T, C, S1, S2, bounds[normalized], EPS)
    if rows is None and tiles is None and W == 4:
        rows = ROWS
    if rows is not None and W == 4:
        per_program, widest, warps = rows
        bc = rows_block(parts, head_dim, widest)
        ranges = _ranges(cu_seqlens, x.device, per_program)
        _conv_rows_kernel[(C // bc * ranges.shape[0],)](x, w, out, ranges, x.stride(0), *args, BC=bc, HD=head_dim,
                                                        num_warps=warps)
    else:
        bt, warps, g = tiles or (BLOCK_T, WARPS, TILES)
        chunks = _chunks(cu_seqlens, x.device, bt)
        nt = chunks.shape[0]
        _conv_parts_kernel[(C // head_dim * triton.cdiv(nt, g),)](x, w, out, chunks, cu, x.stride(0), *args, nt,
                                                                 W=W, BT=bt, BD=head_dim, G=g, num_warps=warps)
    # after the main kernel (same stream): each sequence's first W-1 rows from its carried state
    _conv_head_kernel[(C // head_dim, conv_state.shape[0])](
        x, w, conv_state, out, new_state, cu, x.stride(0), conv_state.stride(0), conv_state.stride(1), *args, W=W,
        BW=max(2, triton.next_power_of_2(W - 1)), BD=head_dim, num_warps=4)
    return _split(out, T, bounds), new_state


def conv_parts_reference(x, weight, conv_state, cu_seqlens, parts, normalized, head_dim):
    """The torch reference of conv_parts (fp32 inside, the outputs in x's dtype)."""
    y, state, _ = causal_conv(x.float(), weight.float(), conv_state.float(), cu_seqlens)
    outs, a = [], 0
    for i, p in enumerate(parts):
        part = y[:, a:a + p]
        if i < normalized:
            part = l2norm(part.reshape(-1, p // head_dim, head_dim)).reshape(-1, p)
        outs.append(part.to(x.dtype))
        a += p
    return tuple(outs), state.to(conv_state.dtype)


@triton.jit
def _conv_decode_kernel(x, weight, states, rows, out, stride_x, stride_sr, stride_sc, C, S1, S2,
                        W: tl.constexpr, BD: tl.constexpr):
    """Program (channel block, sequence): one new token. Reads the sequence's state row where it lives
    (states [R, C, W-1], row rows[n]), writes the conv output to its part in `out` (as _conv_parts_kernel,
    T_total = the batch) and shifts the row in place: the oldest input out, the new one in."""
    i_c = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    N = tl.num_programs(1)
    r = tl.load(rows + n).to(tl.int64)
    c0 = i_c * BD
    o_c = c0 + tl.arange(0, BD)
    p_s = states + r * stride_sr + o_c * stride_sc
    xv = tl.load(x + n * stride_x + o_c).to(tl.float32)
    acc = xv * tl.load(weight + o_c * W + W - 1).to(tl.float32)
    for j in tl.static_range(W - 1):
        acc += tl.load(p_s + j).to(tl.float32) * tl.load(weight + o_c * W + j).to(tl.float32)
    y = acc * tl.sigmoid(acc)
    start, width = _part_of(c0, C, S1, S2)
    tl.store(out + start.to(tl.int64) * N + n * width + o_c - start, y.to(out.dtype.element_ty))
    # every load of the row above is done before the row is overwritten (the compiler may not know that
    # the stores below alias them)
    tl.debug_barrier()
    for j in tl.static_range(W - 2):
        tl.store(p_s + j, tl.load(p_s + j + 1))
    tl.store(p_s + W - 2, xv.to(states.dtype.element_ty))


def conv_decode_in_place(x: torch.Tensor, weight: torch.Tensor, states: torch.Tensor, rows: torch.Tensor,
                         parts: list[int], block: int) -> tuple[torch.Tensor, ...]:
    """A decode step's conv: x [N, C] (one token per sequence; a column slice is fine), weight [C, W],
    states [R, C, W-1] every row of the layer (updated in place: row rows[i] is sequence i's), rows [N]
    int64 on the device. Returns silu(conv) cut into `parts`, each a contiguous [N, c] tensor in x's dtype.
    block: channels per program, dividing every part (the head dim). No gather of the N states before and
    no scatter after (what model.forward's eager path does); nothing read on the host, so a CUDA graph can
    hold it. Rows must be distinct, except a graph's padding, which repeats its one reserved row."""
    N, C = x.shape
    W = weight.shape[1]
    assert x.stride(1) == 1 and states.stride(2) == 1 and sum(parts) == C and supports(parts, block, W)
    bounds, S1, S2 = _layout(parts, C)
    out = torch.empty(N * C, dtype=x.dtype, device=x.device)
    _conv_decode_kernel[(C // block, N)](x, weight.contiguous(), states, rows, out, x.stride(0), states.stride(0),
                                         states.stride(1), C, S1, S2, W=W, BD=block, num_warps=1)
    return _split(out, N, bounds)


def conv_decode_reference(x, weight, states, rows, parts, block):
    """The torch reference of conv_decode_in_place (gather, ops.causal_conv, scatter)."""
    y, new, _ = causal_conv(x.float(), weight.float(), states[rows].float(), list(range(x.shape[0] + 1)))
    states[rows] = new.to(states.dtype)
    return tuple(t.to(x.dtype) for t in torch.split(y, parts, dim=-1))
