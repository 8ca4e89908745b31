"""A decode step's few-row GEMMs, y = x @ w.T for x [M, K] with M <= MAX_ROWS, as one Triton kernel that
streams w once: each program owns BN output columns (rows of w) and walks K. `gemv_reference` below is the
torch reference (F.linear in fp32).

Why: at batch 1 the Kimi-Linear-shaped decode step is ~490 kernels (measured on an H200 by
`python -m benchmarks decode_step --model DIR --profile 1`), 170 of them GEMMs; cuBLAS splits K for the down
and output projections (54 extra reduce kernels per step, each with its launch gap inside the graph) and
takes 3 us for the 1 MB f_b / g_b products. Here no split, no workspace, no second kernel; the output block
is reduced in registers. Which (BN, BK, warps) per shape, and which shapes at all, comes from
`python -m benchmarks gemv_decode --sweep` (cuBLAS against this kernel on the decode's shapes, in the same
run): cuBLAS reads the wide matrices at 82-95% of copy bandwidth and keeps them.

Used by ops.linear where `preferred` says it is faster than cuBLAS (a decode step's batch-1 products of
some shapes; everything else goes to F.linear), by ops.linear_fp32 (a router's fp32 product of x upcast in
the kernel) and ops.linear_groups (two products of one step in one launch). At batch 1 on a GPU the tiles
around config()'s are timed per shape at warm-up (kernels/tuning.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtllm_dasc.model.kernels import tuning

MAX_ROWS = 4


@triton.jit
def _gemv_kernel(x, w, y, stride_xm, stride_ym, N, K, M: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, GROUP_N: tl.constexpr = 0):
    """Program i: output columns [i*BN, (i+1)*BN) of every row. w [N, K] row-major (K contiguous). The
    accumulator keeps a partial sum per (row, column, lane of K) and reduces once at the end (no shuffles
    inside the loop); columns past N are clamped onto the last one for the loads (no masks in the hot
    loop) and dropped at the store. The tail of K (K % BK) runs once, masked. GROUP_N > 0: output columns
    [g*GROUP_N, (g+1)*GROUP_N) read x's columns [g*K, (g+1)*K) (BN divides GROUP_N: one group a program)."""
    pid = tl.program_id(0)
    o_n = pid * BN + tl.arange(0, BN)
    o_w = tl.minimum(o_n, N - 1).to(tl.int64)
    o_m = tl.arange(0, MP)
    m_m = o_m < M
    o_k = tl.arange(0, BK)
    p_w = w + o_w[:, None] * K + o_k[None, :]
    p_x = x + o_m[:, None] * stride_xm + o_k[None, :]
    if GROUP_N > 0:
        p_x += (pid * BN // GROUP_N) * K
    acc = tl.zeros([MP, BN, BK], dtype=tl.float32)
    K_full = K - K % BK
    for k0 in range(0, K_full, BK):
        wt = tl.load(p_w + k0).to(tl.float32)
        xt = tl.load(p_x + k0, mask=m_m[:, None], other=0.0).to(tl.float32)
        acc += wt[None, :, :] * xt[:, None, :]
    if K_full < K:
        m_k = (K_full + o_k) < K
        wt = tl.load(p_w + K_full, mask=m_k[None, :], other=0.0).to(tl.float32)
        xt = tl.load(p_x + K_full, mask=m_m[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        acc += wt[None, :, :] * xt[:, None, :]
    out = tl.sum(acc, 2)
    tl.store(y + o_m[:, None] * stride_ym + o_n[None, :], out.to(y.dtype.element_ty),
             mask=m_m[:, None] & (o_n < N)[None, :])


def config(M: int, N: int, K: int) -> tuple[int, int, int]:
    """(BN, BK, num_warps) for an [M, K] x [N, K]^T product. At batch 1 the fastest of
    `python -m benchmarks gemv_decode --sweep` (measured on an H200): short rows (K <= 256) 8 columns a
    program at 2 warps, long ones 2 columns a program with 1024-wide steps of K (few columns, many programs:
    N = 2304 spreads over 1152 of them). Otherwise about 32 accumulator registers a thread
    (BN x BK x MP / threads)."""
    if M == 1:
        return (8, max(16, triton.next_power_of_2(K)), 2) if K <= 256 else (2, 1024, 4)
    mp = triton.next_power_of_2(M)
    bk = 512 // mp if K >= 512 else max(16, triton.next_power_of_2(K))
    return 8 if N >= 8 * 264 else 4, bk, 4


# batch 1's candidates on a GPU (tuning.py), (BN, warps, stages) around config()'s choice: fewer or more
# columns a program, more warps, an unpipelined loop. BK stays config()'s (the row up to 256, else 1024 a
# step): it sets the order of the fp32 partial sums, and a tile picked by timing must not change a result
# from one server start to the next. A shape keeps the candidates it can take (_prune).
_CANDIDATES = [(2, 4, 3), (1, 4, 3), (2, 4, 1), (4, 8, 3), (2, 8, 3), (8, 2, 3), (4, 1, 3), (16, 4, 3), (8, 4, 3)]


def _prune(configs, args):
    K, group_n = args["K"], args["GROUP_N"]
    bk = config(1, 1, K)[1]
    # at most 64 fp32 accumulators a thread: wider tiles spill on sm90 (ptxas: 255 registers and spill
    # stores at 16 x 1024 over 4 warps; tests/model/test_kernels_compile.py compiles the widest kept)
    kept = [c for c in configs if c.kwargs["BK"] == bk and (group_n == 0 or group_n % c.kwargs["BN"] == 0)
            and c.kwargs["BN"] * bk <= 64 * 32 * c.num_warps]
    if not kept:
        raise ValueError(f"no gemv candidate takes K={K}, GROUP_N={group_n}")
    return kept


def _candidates():
    return [({"BN": bn, "BK": bk}, w, st) for bn, w, st in _CANDIDATES for bk in (16, 32, 64, 128, 256, 1024)]


_gemv_tuned = tuning.autotuned(_gemv_kernel, _candidates(), key=["N", "K", "GROUP_N"], prune=_prune)


def preferred(M: int, N: int, K: int) -> bool:
    """Whether gemv beats cuBLAS for this product inside CUDA graphs (`python -m benchmarks gemv_decode`,
    both in the same run). measured on an H200: at batch 1 the short rows (f_b / g_b: 2.1 against 3.0 us)
    and the narrow outputs (the output projections, N = 2304 from K = 4096: 8.0 against 9.2 us; the MLA
    latent projection, N = 576: 4.4 against 6.5; the MLP's down projection ties, 14.9 against 14.7, without
    cuBLAS's split-K reduce kernel). The wide ones (gate_up, the KDA input projection, q_proj, the LM head)
    stay on cuBLAS, which read them at 82-95% of copy bandwidth; from 2 rows on cuBLAS won every shape."""
    return M == 1 and (K <= 256 or N <= 4096)


def supports(x: torch.Tensor, w: torch.Tensor, groups: int = 1) -> bool:
    """Whether gemv takes these operands: x [M <= MAX_ROWS, groups * K] on a GPU with a unit column stride,
    w [N, K] contiguous in x's dtype (bf16 / fp16 / fp32) or in fp32 (a router's weight: x is upcast in the
    kernel, exactly), K a multiple of 8 (16-byte rows); groups > 1: N a multiple of groups x 8."""
    return (x.is_cuda and x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.stride(1) == 1
            and w.dim() == 2 and w.is_contiguous() and w.dtype in (x.dtype, torch.float32)
            and w.shape[1] * groups == x.shape[1] and w.shape[1] % 8 == 0 and w.shape[0] > 0
            and (groups == 1 or w.shape[0] % (groups * 8) == 0)
            and x.dtype in (torch.bfloat16, torch.float16, torch.float32))


def gemv(x: torch.Tensor, w: torch.Tensor, cfg: tuple[int, int, int] | None = None, groups: int = 1,
         out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, groups * K] @ w[N, K].T -> [M, N] in out_dtype (default x's; fp32 accumulation), the output's
    g-th N/groups columns from x's g-th K columns (groups > 1: two products of one step in one launch, e.g.
    Kimi's f_b and g_b). The caller checks supports(x, w, groups). cfg: (BN, BK, num_warps), default
    config(M, N / groups, K) (the benchmark passes others)."""
    M = x.shape[0]
    N, K = w.shape
    group_n = N // groups if groups > 1 else 0
    y = torch.empty(M, N, dtype=out_dtype or x.dtype, device=x.device)
    if cfg is None and M == 1 and tuning.on_device():
        # batch 1 on a GPU: the tiles measured fastest for this shape (tuning.py)
        _gemv_tuned[lambda meta: (triton.cdiv(N, meta["BN"]),)](x, w, y, x.stride(0), y.stride(0), N, K, M=1, MP=1,
                                                               GROUP_N=group_n)
        return y
    bn, bk, warps = cfg or config(M, N // groups, K)
    if group_n:
        while group_n % bn:
            bn //= 2
    _gemv_kernel[(triton.cdiv(N, bn),)](x, w, y, x.stride(0), y.stride(0), N, K, M=M,
                                        MP=triton.next_power_of_2(M), BN=bn, BK=bk, GROUP_N=group_n,
                                        num_warps=warps)
    return y


def gemv_reference(x: torch.Tensor, w: torch.Tensor, groups: int = 1,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The torch reference of gemv: fp32 products per group, one rounding to out_dtype (default x's)."""
    parts = torch.matmul(x.float().unflatten(-1, (groups, -1)).transpose(0, 1),       # [groups, M, K]
                         w.float().unflatten(0, (groups, -1)).transpose(1, 2))       # -> [groups, M, N / groups]
    return parts.transpose(0, 1).flatten(1).to(out_dtype or x.dtype)
