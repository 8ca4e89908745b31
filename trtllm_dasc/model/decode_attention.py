"""Batched decode attention over the paged KV cache: one query token per sequence, keys read through block
tables, all sequences in one Triton launch (the torch reference below has the same signature).

Why: the eager path attends one sequence at a time (a Python loop, a gather of its KV rows, one SDPA call
per sequence and layer); a decode step of 64 sequences made 64 launches per attention layer. Here the batch
is one launch whose inputs are fixed-shape tensors (block tables [B, max_blocks], lengths [B]): nothing
depends on host values, which a CUDA graph of the decode step needs.

Layouts (kv_cache.py): a pool is [num_blocks, block_size, heads, dim]; token t of sequence b lives at block
block_tables[b, t // block_size], row t % block_size. GQA: k_pool and v_pool, query head h reads KV head
h // (H / H_kv). MLA in its absorbed form: k_pool = v_pool = the latent pool [.., 1, lora + rope], the
query is [q_nope W_kb, q_rope] and the value is the first `dv` = lora columns (attention.py projects it).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(q, k_pool, v_pool, out, block_tables, seq_lens, scale,
                         stride_qb, stride_qh, stride_kr, stride_kh, stride_vr, stride_vh,
                         stride_ob, stride_oh, stride_tb,
                         GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BS: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    hk = (h // GROUP).to(tl.int64)
    n = tl.load(seq_lens + b)
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    qv = tl.load(q + b.to(tl.int64) * stride_qb + h * stride_qh + dk, mask=dk < DK, other=0.0).to(tl.float32)
    qv = qv * scale
    m = tl.full((), float("-inf"), tl.float32)
    l_sum = tl.zeros((), tl.float32)
    acc = tl.zeros((BLOCK_DV,), tl.float32)
    for start in range(0, n, BLOCK_N):
        t = start + tl.arange(0, BLOCK_N)
        valid = t < n
        blk = tl.load(block_tables + b.to(tl.int64) * stride_tb + t // BS, mask=valid, other=0).to(tl.int64)
        row = blk * BS + t % BS
        k = tl.load(k_pool + row[:, None] * stride_kr + hk * stride_kh + dk[None, :],
                    mask=valid[:, None] & (dk < DK)[None, :], other=0.0).to(tl.float32)
        s = tl.sum(k * qv[None, :], axis=1)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        v = tl.load(v_pool + row[:, None] * stride_vr + hk * stride_vh + dv[None, :],
                    mask=valid[:, None] & (dv < DV)[None, :], other=0.0).to(tl.float32)
        l_sum = l_sum * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    o = acc / l_sum
    tl.store(out + b.to(tl.int64) * stride_ob + h * stride_oh + dv, o.to(out.dtype.element_ty), mask=dv < DV)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           dv: int | None = None) -> torch.Tensor:
    """q [B, H, DK]; k_pool [blocks, bs, H_kv, DK]; v_pool [blocks, bs, H_kv, >= dv]; block_tables
    [B, max_blocks] int; seq_lens [B] int (>= 1: the keys 0..len-1, the new token's included).
    Returns [B, H, dv] in q's dtype (softmax and sums in fp32)."""
    B, H, DK = q.shape
    bs, Hk = k_pool.shape[1], k_pool.shape[2]
    dv = v_pool.shape[-1] if dv is None else dv
    assert H % Hk == 0 and k_pool.shape[-1] == DK and v_pool.shape[-1] >= dv
    assert q.stride(-1) == 1 and k_pool.stride(-1) == 1 and v_pool.stride(-1) == 1
    assert k_pool.stride(1) == k_pool.stride(0) // bs and v_pool.stride(1) == v_pool.stride(0) // bs, \
        "pools must be contiguous over (block, row)"
    out = torch.empty(B, H, dv, dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    block_dk, block_dv = _pow2(DK), _pow2(dv)
    # about 8k fp32 key elements per step: 64 keys of 128, 8 latent rows of 576 (padded to 1024)
    block_n = max(1, min(64, 8192 // block_dk))
    _paged_decode_kernel[(B, H)](
        q, k_pool, v_pool, out, block_tables, seq_lens, float(scale),
        q.stride(0), q.stride(1), k_pool.stride(1), k_pool.stride(2), v_pool.stride(1), v_pool.stride(2),
        out.stride(0), out.stride(1), block_tables.stride(0),
        GROUP=H // Hk, DK=DK, DV=dv, BS=bs, BLOCK_N=block_n, BLOCK_DK=block_dk, BLOCK_DV=block_dv)
    return out


def paged_decode_attention_ref(q, k_pool, v_pool, block_tables, seq_lens, scale, dv=None):
    """Torch reference of paged_decode_attention: each sequence's keys gathered by its block table, an
    fp32 softmax, one sequence at a time."""
    B, H, DK = q.shape
    bs, Hk = k_pool.shape[1], k_pool.shape[2]
    dv = v_pool.shape[-1] if dv is None else dv
    out = torch.empty(B, H, dv, dtype=q.dtype, device=q.device)
    for b in range(B):
        n = int(seq_lens[b])
        t = torch.arange(n, device=q.device)
        rows = block_tables[b].long()[t // bs] * bs + t % bs
        k = k_pool.reshape(-1, Hk, DK)[rows].float().repeat_interleave(H // Hk, dim=1)     # [n, H, DK]
        v = v_pool.reshape(-1, Hk, v_pool.shape[-1])[rows][..., :dv].float().repeat_interleave(H // Hk, dim=1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[b].float() * scale, k), dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", p, v).to(q.dtype)
    return out
