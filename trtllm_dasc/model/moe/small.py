"""The routed experts of a decode step's few tokens as two GEMVs, with no sort and no alignment (the small-T
path of moe.experts; kernel.py is the grouped-GEMM path of larger batches).

At decode the layer is bound by the bytes of the experts it reads (Kimi at batch 1: 8 experts x 3 x 2304 x
1024 x 2 B = 113 MB, 27 us at 4.2 TB/s), yet kernel.py's path costs ~10 alignment launches before its two
GEMMs, pads every expert's one or two rows to a 16-row MMA block, and sums y over top_k in a third launch.
Here:

1. _pair_gate_up: one program per ((token, slot) pair, BLOCK_N intermediate channels). It reads the pair's
   expert id from idx itself, streams that expert's BLOCK_N gate rows and BLOCK_N up rows along D once,
   reduces in fp32 registers (a partial sum per lane of K, one reduction at the end: no shuffles in the
   loop), silu(g) * u, one rounding -> h [T*top_k, I] (row = t * top_k + j).
2. _token_down: one program per (token, BLOCK_N output channels): one loop over the token's top_k slots x
   I, each step the slot's down rows times h's row times the slot's routing weight (fp32), accumulated in
   registers -> out [T, D]: the routing weight and the sum over top_k fused, in a fixed order (no atomics,
   the result does not depend on the schedule), one rounding.

Few columns a program and long steps of K (many programs, many bytes in flight), as kernels/gemv.py
measured best at batch 1 on the H200. Both grids are functions of (T, top_k, I, D) only: CUDA-graph
capturable, no host synchronisation. Row, expert and token indices are widened to int64 before any address
arithmetic (expert e's offset e * 2I * D passes 2^31 at 256 experts x 2048 x 2304 x 2 B).

A pair reads its expert's weights whether or not another pair chose the same expert (the grouped path reads
each expert in use once), so the path pays off while pairs rarely share experts: SMALL_PAIRS.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtllm_dasc.model.kernels import tuning

# T * top_k up to which moe.experts takes this path. At 64 pairs over Kimi's 256 experts ~57 distinct
# experts are expected (256 x (1 - (255/256)^64)): ~11% of the bytes read twice (less where the L2 catches
# them), against the grouped path's ~10 alignment launches and 16-row padding; Kimi decodes up to 8 tokens
# and Qwen (top-10) up to 6 here. benchmarks/moe_layer.py times both paths at every decode size (its
# triton_small arm) so the threshold can follow the H200's numbers.
SMALL_PAIRS = 64


@triton.jit(do_not_specialize=["R"])
def _pair_gate_up(x, idx, w, h, I, D, stride_x, stride_we, stride_wn, stride_h, R, TOP_K: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # R only keys the autotuner (tuning.py): the pair count rounded up to a power of two
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(I, BLOCK_N)
    r = (pid // tiles_n).to(tl.int64)
    cols = (pid % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < I
    # columns past I read the last one (no mask on the weights in the loop) and are dropped at the store
    c64 = tl.minimum(cols, I - 1).to(tl.int64)
    e = tl.load(idx + r).to(tl.int64)
    kk = tl.arange(0, BLOCK_K)
    x_ptr = x + (r // TOP_K) * stride_x + kk
    g_ptr = w + e * stride_we + c64[:, None] * stride_wn + kk[None, :]
    # the up rows follow the I gate rows of the same expert
    u_ptr = g_ptr + I * stride_wn
    acc_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(D, BLOCK_K)):
        kmask = kk < D - k0 * BLOCK_K
        a = tl.load(x_ptr, mask=kmask, other=0.0).to(tl.float32)[None, :]
        acc_g += tl.load(g_ptr, mask=kmask[None, :], other=0.0).to(tl.float32) * a
        acc_u += tl.load(u_ptr, mask=kmask[None, :], other=0.0).to(tl.float32) * a
        x_ptr += BLOCK_K
        g_ptr += BLOCK_K
        u_ptr += BLOCK_K
    g = tl.sum(acc_g, 1)
    u = tl.sum(acc_u, 1)
    out = g * tl.sigmoid(g) * u
    tl.store(h + r * stride_h + cols, out.to(h.dtype.element_ty), mask=cmask)


@triton.jit
def _token_down(h, idx, topk_w, w, y, D, I, stride_h, stride_we, stride_wn, stride_y, TOP_K: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(D, BLOCK_N)
    t = (pid // tiles_n).to(tl.int64)
    cols = (pid % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < D
    c64 = tl.minimum(cols, D - 1).to(tl.int64)
    kk = tl.arange(0, BLOCK_K)
    steps = tl.cdiv(I, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    # one flat loop over (slot, step of I): one software-pipelined loop, whatever top_k and I are
    for s in range(0, TOP_K * steps):
        j = s // steps
        k0 = (s % steps) * BLOCK_K
        r = t * TOP_K + j
        e = tl.load(idx + r).to(tl.int64)
        wt = tl.load(topk_w + r).to(tl.float32)
        kmask = kk < I - k0
        a = tl.load(h + r * stride_h + k0 + kk, mask=kmask, other=0.0).to(tl.float32) * wt
        b = tl.load(w + e * stride_we + c64[:, None] * stride_wn + (k0 + kk)[None, :], mask=kmask[None, :],
                    other=0.0)
        acc += b.to(tl.float32) * a[None, :]
    tl.store(y + t * stride_y + cols, tl.sum(acc, 1).to(y.dtype.element_ty), mask=cmask)


def config(T: int, top_k: int, I: int, D: int) -> dict:
    """Tiles of both kernels: (BLOCK_N, BLOCK_K, num_warps) each. gate_up: 2 gate + 2 up rows a program,
    steps of 1024 along D; down: 2 output channels a program with steps of 1024 along I, or 4 with steps
    of 512 where I <= 512 (Qwen). The small-path sweep of `python -m benchmarks moe_layer` on the H200 at
    a28fefc (whole layer in a CUDA graph, one kernel's tiles varied): gate_up 2x1024 was the fastest of six
    at 1 and 8 tokens for both models (Kimi at 1 token 38.7 us against 45.4 for the 4x512 it replaced);
    down 4x512 the fastest for Qwen (29.6 us against 34.8 at 1 token), 2x1024 within 0.3% of the best for
    Kimi. ~32 fp32 accumulator registers a thread each."""
    return {"gate_up": (2, min(1024, max(16, triton.next_power_of_2(D))), 4),
            "down": (4, max(16, triton.next_power_of_2(I)), 4) if I <= 512 else (2, 1024, 4)}


# the candidates a GPU times per shape (tuning.py), (BLOCK_N, warps, stages) around config()'s choice; BLOCK_K
# stays config()'s: it sets the order of the fp32 partial sums, and a tile picked by timing must not change
# a result from one server start to the next
_GATE_UP_CANDIDATES = [(2, 4, 3), (2, 4, 1), (1, 4, 3), (4, 8, 3), (2, 8, 3), (4, 4, 3), (1, 2, 3)]


def _one_step_of_k(configs, args):
    """Prune: the candidates at config()'s BLOCK_K for this shape that keep their accumulators in registers."""
    bk = config(1, 1, args["I"], args["D"])["gate_up"][1]
    # two accumulators (gate, up) of BLOCK_N x BLOCK_K: at most 64 fp32 a thread, as kernels/gemv.py
    return [c for c in configs if c.kwargs["BLOCK_K"] == bk and 2 * c.kwargs["BLOCK_N"] * bk <= 64 * 32 * c.num_warps]


_pair_gate_up_tuned = tuning.autotuned(
    _pair_gate_up, [({"BLOCK_N": bn, "BLOCK_K": bk}, w, st) for bn, w, st in _GATE_UP_CANDIDATES
                    for bk in (16, 32, 64, 128, 256, 512, 1024)], ["I", "D", "R", "TOP_K"], prune=_one_step_of_k)


def warm_token_counts(top_k: int, width: int) -> list[int]:
    """One token count per key of the autotuned gate_up (pairs rounded up to a power of two) the small path
    can meet (T * top_k <= SMALL_PAIRS; width: ids per token, the shared expert's included): what a warm-up
    runs so that no user's step times the candidates (model.warm_moe)."""
    seen, out = set(), []
    for T in range(1, SMALL_PAIRS // top_k + 1):
        key = triton.next_power_of_2(T * width)
        if key not in seen:
            seen.add(key)
            out.append(T)
    return out


def _buffer(shape, dtype, device) -> torch.Tensor:
    """The intermediate's and the output's allocation (tests poison it with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def experts_small(x, idx, weights, gate_up, down, cfg: dict | None = None) -> torch.Tensor:
    """See moe.experts (any T works; moe.experts sends T * top_k <= SMALL_PAIRS here). cfg: tiles
    {"gate_up": (BLOCK_N, BLOCK_K, warps), "down": (...)}; default config(...)'s, except gate_up's on a GPU,
    which the autotuner picks at config()'s BLOCK_K (tuning.py)."""
    T, D = x.shape
    k = idx.shape[1]
    E, I2, _ = gate_up.shape
    inter = I2 // 2
    assert gate_up.shape == (E, 2 * inter, D) and down.shape == (E, D, inter) and idx.shape == weights.shape
    assert x.stride(1) == gate_up.stride(2) == down.stride(2) == 1, "unit stride along the reduced dims"
    flat_idx = idx.reshape(-1).contiguous()
    flat_w = weights.reshape(-1).contiguous()
    h = _buffer((T * k, inter), x.dtype, x.device)
    y = _buffer((T, D), x.dtype, x.device)
    # the autotuner's key: pair counts in powers of two, so the warm-up's decode buckets (1, 2, 4, ... tokens)
    # tune every count a later step can bring (3 tokens share 4's tiles): no tuning inside a user's request
    pairs = triton.next_power_of_2(T * k)
    gate_up_args = (x, flat_idx, gate_up, h, inter, D, x.stride(0), gate_up.stride(0), gate_up.stride(1), h.stride(0),
                    pairs)
    down_args = (h, flat_idx, flat_w, down, y, D, inter, h.stride(0), down.stride(0), down.stride(1), y.stride(0))
    if cfg is None and tuning.on_device():
        # on a GPU: the tiles measured fastest for this shape (tuning.py)
        _pair_gate_up_tuned[lambda m: (T * k * triton.cdiv(inter, m["BLOCK_N"]),)](*gate_up_args, TOP_K=k)
    else:
        bn, bk, warps = (cfg or config(T, k, inter, D))["gate_up"]
        _pair_gate_up[(T * k * triton.cdiv(inter, bn),)](*gate_up_args, TOP_K=k, BLOCK_N=bn, BLOCK_K=bk,
                                                         num_warps=warps)
    # the down kernel keeps config()'s tiles on the GPU too: its autotuned pick (timed alone) ran 17% slower
    # inside the batch-1 decode graph than config()'s (434 against 372 us a step, `python -m benchmarks
    # real_model --profile 1` at 1fbf5c3 against abacc93)
    bn, bk, warps = (cfg or config(T, k, inter, D))["down"]
    _token_down[(T * triton.cdiv(D, bn),)](*down_args, TOP_K=k, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps)
    return y
