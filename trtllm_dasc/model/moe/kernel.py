"""The fused experts in Triton, vLLM's fused_moe design written anew: two grouped GEMMs over the rows that
align.py sorted and padded by expert.

1. _gate_up_act: for each block of BLOCK_M rows (one expert) and BLOCK_N intermediate channels, the gate and
   the up products of the same channels from the one [E, 2I, D] weight (two accumulators), silu(g) * u in
   fp32, one rounding -> h [T*top_k, I] indexed by row id (token = row // top_k).
2. _down_weighted: h's rows by the down weight [E, D, I], times the row's routing weight (fp32) -> y
   [T*top_k, D], again indexed by row id.
Then y.view(T, top_k, D).sum(1): the combine, one launch, a fixed order (no atomics: the result does not
depend on the schedule).

The grid is max_blocks(T, top_k, E, BLOCK_M) x channel tiles, a function of the shapes only, so the layer
can be captured in a CUDA graph; blocks past num_post_padded return at once. Row ids and expert ids are
widened to int64 before any address arithmetic (T * top_k * D passes 2^31 at 8192 tokens x top-10 x 2^15).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtllm_dasc.model.moe.align import max_blocks, moe_align


@triton.jit
def _gate_up_act(x, w, h, sorted_ids, block_expert, num_post, N, I, D, stride_x, stride_we, stride_wn, stride_h,
                 TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(I, BLOCK_N)
    pid_m, pid_n = pid // tiles_n, pid % tiles_n
    if pid_m * BLOCK_M >= tl.load(num_post):
        return
    rows = tl.load(sorted_ids + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    valid = rows < N
    e = tl.load(block_expert + pid_m).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < I
    kk = tl.arange(0, BLOCK_K)
    a_ptr = x + (rows // TOP_K)[:, None] * stride_x + kk[None, :]
    g_ptr = w + e * stride_we + cols.to(tl.int64)[None, :] * stride_wn + kk[:, None]
    # the up rows follow the I gate rows of the same expert
    u_ptr = w + e * stride_we + (cols.to(tl.int64) + I)[None, :] * stride_wn + kk[:, None]
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(D, BLOCK_K)):
        kmask = kk < D - k0 * BLOCK_K
        a = tl.load(a_ptr, mask=valid[:, None] & kmask[None, :], other=0.0)
        bmask = kmask[:, None] & cmask[None, :]
        acc_g = tl.dot(a, tl.load(g_ptr, mask=bmask, other=0.0), acc_g)
        acc_u = tl.dot(a, tl.load(u_ptr, mask=bmask, other=0.0), acc_u)
        a_ptr += BLOCK_K
        g_ptr += BLOCK_K
        u_ptr += BLOCK_K
    out = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(h + rows[:, None] * stride_h + cols[None, :], out.to(h.dtype.element_ty),
             mask=valid[:, None] & cmask[None, :])


@triton.jit
def _down_weighted(h, w, y, topk_w, sorted_ids, block_expert, num_post, N, D, I, stride_h, stride_we, stride_wn,
                   stride_y, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(D, BLOCK_N)
    pid_m, pid_n = pid // tiles_n, pid % tiles_n
    if pid_m * BLOCK_M >= tl.load(num_post):
        return
    rows = tl.load(sorted_ids + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    valid = rows < N
    e = tl.load(block_expert + pid_m).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < D
    kk = tl.arange(0, BLOCK_K)
    a_ptr = h + rows[:, None] * stride_h + kk[None, :]
    b_ptr = w + e * stride_we + cols.to(tl.int64)[None, :] * stride_wn + kk[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(I, BLOCK_K)):
        kmask = kk < I - k0 * BLOCK_K
        a = tl.load(a_ptr, mask=valid[:, None] & kmask[None, :], other=0.0)
        acc = tl.dot(a, tl.load(b_ptr, mask=kmask[:, None] & cmask[None, :], other=0.0), acc)
        a_ptr += BLOCK_K
        b_ptr += BLOCK_K
    acc = acc * tl.load(topk_w + rows, mask=valid, other=0.0).to(tl.float32)[:, None]
    tl.store(y + rows[:, None] * stride_y + cols[None, :], acc.to(y.dtype.element_ty),
             mask=valid[:, None] & cmask[None, :])


def config(T: int, top_k: int, E: int) -> dict:
    """Tile sizes by the mean rows per expert: decode's few rows per expert waste less of a 16-row block;
    prefill's many fill 64- and 128-row blocks, which read each weight tile once per 64 / 128 rows. At 8192
    tokens (256 rows per expert in Kimi, 160 in Qwen) 128x128x64 w8 s3 beat 64x128x64 w8 s3 in
    `python -m benchmarks moe_layer`'s tile sweep (experts only; measured on an H200: Kimi 2.71 against 3.24
    ms, Qwen 2.09 against 2.27): from 128 rows per expert on, where a 128-row block pads at most half of one block per expert."""
    per_expert = T * top_k / E
    if per_expert <= 16:
        return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
    if per_expert <= 64:
        return dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3)
    if per_expert < 128:
        return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)


def warm_token_counts(top_k: int, E: int, max_tokens: int, small_pairs: int) -> list[int]:
    """Token counts that take every tile config of config() a step of up to max_tokens tokens can reach on
    the grouped path (T * top_k > small_pairs), each with its row count N = T * top_k both a multiple of 16
    and not where the config's range has both (Triton compiles the kernels apart by N's divisibility by 16:
    at top_k = 8 an even and an odd T, at Qwen's 10 a T on and off the multiples of 8). What a warm-up must
    run so that no user's batch compiles these kernels."""
    seen, out = set(), []
    for T in range(small_pairs // top_k + 1, max_tokens + 1):
        key = (tuple(sorted(config(T, top_k, E).items())), T * top_k % 16 == 0)
        if key not in seen:
            seen.add(key)
            out.append(T)
    return out


def _buffer(shape, dtype, device) -> torch.Tensor:
    """The intermediates' allocation (tests poison it with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def experts_triton(x, idx, weights, gate_up, down, cfg: dict | None = None) -> torch.Tensor:
    """See moe.experts; cfg: tile sizes (default config(T, top_k, E)); an optional cfg["down"] (BLOCK_N,
    BLOCK_K, num_warps, num_stages) overrides them for the down GEMM alone (one accumulator, not the gate_up
    kernel's two: room for wider tiles; BLOCK_M is the alignment's, shared)."""
    T, D = x.shape
    k = idx.shape[1]
    E, I2, _ = gate_up.shape
    inter = I2 // 2
    assert gate_up.shape == (E, 2 * inter, D) and down.shape == (E, D, inter) and idx.shape == weights.shape
    assert x.stride(1) == gate_up.stride(2) == down.stride(2) == 1, "unit stride along the reduced dims"
    cfg = dict(cfg or config(T, k, E))
    down_cfg = cfg.pop("down", None) or {}
    bm, bn, bk = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N"), cfg.pop("BLOCK_K")
    sorted_ids, block_expert, num_post, _ = moe_align(idx, E, bm)
    nb, n = max_blocks(T, k, E, bm), T * k
    h = _buffer((n, inter), x.dtype, x.device)
    _gate_up_act[(nb * triton.cdiv(inter, bn),)](
        x, gate_up, h, sorted_ids, block_expert, num_post, n, inter, D, x.stride(0), gate_up.stride(0),
        gate_up.stride(1), h.stride(0), TOP_K=k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, **cfg)
    y = _buffer((n, D), x.dtype, x.device)
    wf = weights.reshape(-1)
    dcfg = {**cfg, **{k: v for k, v in down_cfg.items() if k not in ("BLOCK_N", "BLOCK_K")}}
    bn, bk = down_cfg.get("BLOCK_N", bn), down_cfg.get("BLOCK_K", bk)
    _down_weighted[(nb * triton.cdiv(D, bn),)](
        h, down, y, wf, sorted_ids, block_expert, num_post, n, D, inter, h.stride(0), down.stride(0),
        down.stride(1), y.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, **dcfg)
    return y.view(T, k, D).sum(1)
