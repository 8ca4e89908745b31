"""KDA's two low-rank up-projections over a prefill in one Triton kernel: the decay gate's f = f_a @ f_b.T and
the output gate's g = g_a @ g_b.T, each [T, N] from a [T, K] input with K = the head dim (128).
`up_pair_reference` below is the torch reference (F.linear in fp32, one rounding).

Why: with K = 128 each product is two 64-wide steps of K and then an [T, N] store (134 MB at 16k tokens
for the Kimi-Linear shape): the output bytes are the whole cost. cuBLAS took 86 us per product on the H200
(47 launches of its 256x128 kernel, 4.04 ms per 16k-token forward, model_prefill_kda_h200_5c4b8c4.json's
profile), where writing the bytes at copy speed takes about 33 us: its tiles finish the short K loop and
then wait on their own stores. Here a program computes one [BM, BN] tile with a single dot and stores it,
many programs in flight; both products share one launch (f_a and g_a are adjacent columns of the input
projection's output, f_b and g_b are stacked into one [2N, K] weight at load time).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# output rows and columns per program, warps: benchmarks/lowrank_prefill.py times the choices
BLOCK_M = 128
BLOCK_N = 128
WARPS = 4
MIN_TOKENS = 256         # below this cuBLAS's launch is as good and two F.linear calls keep it simple


@triton.jit
def _up_pair_kernel(x, w, y, stride_x, T, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Program (row block, column block of the 2N stacked outputs), row blocks fastest. Columns [0, N) are
    the first product (input columns [0, K), weight rows [0, N)), [N, 2N) the second (input columns
    [K, 2K), weight rows [N, 2N)); y is [2, T, N], so each product is a contiguous [T, N]."""
    i_m = tl.program_id(0)
    i_n = tl.program_id(1)
    n_blocks = N // BN
    half = i_n // n_blocks
    n0 = (i_n - half * n_blocks) * BN
    o_m = i_m * BM + tl.arange(0, BM)
    m_m = o_m < T
    o_k = tl.arange(0, K)
    o_n = n0 + tl.arange(0, BN)
    a = tl.load(x + o_m[:, None].to(tl.int64) * stride_x + half * K + o_k[None, :], mask=m_m[:, None], other=0.0)
    b = tl.load(w + (half * N + o_n)[:, None] * K + o_k[None, :])
    acc = tl.dot(a, tl.trans(b))
    out = y + half.to(tl.int64) * T * N + o_m[:, None].to(tl.int64) * N + o_n[None, :]
    tl.store(out, acc.to(y.dtype.element_ty), mask=m_m[:, None])


def supports(x: torch.Tensor, w_pair: torch.Tensor) -> bool:
    """x [T, 2K] on a GPU (a column slice is fine: unit column stride) and w_pair [2N, K] contiguous in x's
    dtype (bf16 / fp16), K a power of two from 16 to 256, N a multiple of BLOCK_N, T >= MIN_TOKENS."""
    if not (x.is_cuda and x.dim() == 2 and w_pair.dim() == 2 and w_pair.is_contiguous()):
        return False
    K = w_pair.shape[1]
    return (x.stride(1) == 1 and x.shape[1] == 2 * K and x.dtype == w_pair.dtype
            and x.dtype in (torch.bfloat16, torch.float16) and 16 <= K <= 256 and K & (K - 1) == 0
            and w_pair.shape[0] % (2 * BLOCK_N) == 0 and x.shape[0] >= MIN_TOKENS)


def up_pair(x: torch.Tensor, w_pair: torch.Tensor, tiles: tuple[int, int, int] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x[:, :K] @ w_pair[:N].T, x[:, K:] @ w_pair[N:].T), each [T, N] contiguous in x's dtype (fp32
    accumulation, one rounding). The caller checks supports() (the interpreter tests call it on the CPU).
    tiles: (BM, BN, warps), default the module's (the benchmark passes others)."""
    T = x.shape[0]
    N, K = w_pair.shape[0] // 2, w_pair.shape[1]
    bm, bn, warps = tiles or (BLOCK_M, BLOCK_N, WARPS)
    assert N % bn == 0 and x.shape[1] == 2 * K and x.stride(1) == 1, (x.shape, w_pair.shape, bn)
    y = torch.empty(2, T, N, dtype=x.dtype, device=x.device)
    _up_pair_kernel[(triton.cdiv(T, bm), 2 * N // bn)](x, w_pair, y, x.stride(0), T, N, K=K, BM=bm, BN=bn,
                                                       num_warps=warps)
    return y[0], y[1]


def up_pair_reference(x: torch.Tensor, w_pair: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch reference of up_pair: two fp32 products, each rounded once to x's dtype."""
    N, K = w_pair.shape[0] // 2, w_pair.shape[1]
    f = torch.nn.functional.linear(x[:, :K].float(), w_pair[:N].float()).to(x.dtype)
    g = torch.nn.functional.linear(x[:, K:].float(), w_pair[N:].float()).to(x.dtype)
    return f, g
