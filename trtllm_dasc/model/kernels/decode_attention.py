"""Batched decode attention over the paged KV cache: one query token per sequence, keys read through block
tables, all sequences in one Triton launch (the torch reference below has the same signature).

Why: the eager path attends one sequence at a time (a Python loop, a gather of its KV rows, one SDPA call
per sequence and layer); a decode step of 64 sequences made 64 launches per attention layer. Here the batch
is one launch whose inputs are fixed-shape tensors (block tables [B, max_blocks], lengths [B]): nothing
depends on host values, which a CUDA graph of the decode step needs. A program takes every query head of
one KV head (GQA's group, MLA's all heads) so each key row is read once, as MMAs; a batch of few sequences
splits its keys over more programs (flash-decoding) and _combine_kernel joins the splits.

Layouts (kv_cache.py): a pool is [num_blocks, block_size, heads, dim]; token t of sequence b lives at block
block_tables[b, t // block_size], row t % block_size. GQA: k_pool and v_pool, query head h reads KV head
h // (H / H_kv). MLA in its absorbed form: k_pool = v_pool = the latent pool [.., 1, lora + rope], the
query is [q_nope W_kb, q_rope] and the value is the first `dv` = lora columns (attention.py projects it).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _as_mma(x, pool, F32_DOT: tl.constexpr):
    """An fp32 tile as an MMA operand next to the pool's tiles: the pool's dtype, or fp32 (F32_DOT)."""
    if F32_DOT:
        return x
    return x.to(pool.dtype.element_ty)


@triton.jit
def _mma(a, b, F32_DOT: tl.constexpr):
    """a @ b with fp32 accumulation; F32_DOT: fp32 operands in ieee precision (no tf32)."""
    if F32_DOT:
        return tl.dot(a, b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _paged_decode_kernel(q, q2, k_pool, v_pool, o_part, ml_part, block_tables, seq_lens, scale,
                         stride_qb, stride_qh, stride_q2b, stride_q2h, stride_kr, stride_kh, stride_vr, stride_vh,
                         stride_tb,
                         GROUP: tl.constexpr, DK1: tl.constexpr, DK2: tl.constexpr, DV: tl.constexpr,
                         BS: tl.constexpr, SPLITS, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_DK1: tl.constexpr, BLOCK_DK2: tl.constexpr, BLOCK_DV: tl.constexpr,
                         F32_DOT: tl.constexpr):
    """One (sequence, KV head, key split): the GROUP query heads of that KV head against keys
    [split * chunk, +chunk) as two MMAs per key block (scores, then probabilities x values), online
    softmax; writes the unnormalised output and the (max, sum) of its split for _combine_kernel. SPLITS is a
    runtime value: the eager path's grows with the context and must not compile a kernel per value.
    The key dim is two segments, DK1 (a power of two) then DK2 (the rest, maybe 0): MLA's 576 = 512 + 64
    would otherwise be padded to 1024. The query's DK2 columns come from q2 (MLA: the rope part where it
    lies, next to the latent query of another tensor; otherwise q itself, DK1 columns on)."""
    b = tl.program_id(0).to(tl.int64)
    hk = tl.program_id(1)
    sp = tl.program_id(2)
    n = tl.load(seq_lens + b)
    chunk = tl.cdiv(tl.cdiv(n, SPLITS), BLOCK_N) * BLOCK_N
    lo = sp * chunk
    hi = tl.minimum(lo + chunk, n)
    g = tl.arange(0, BLOCK_G)
    h = hk * GROUP + g
    d1 = tl.arange(0, BLOCK_DK1)
    d2 = DK1 + tl.arange(0, BLOCK_DK2)
    dv = tl.arange(0, BLOCK_DV)
    q_row = q + b * stride_qb + h[:, None] * stride_qh
    gm = (g < GROUP)[:, None]
    q1 = _as_mma(tl.load(q_row + d1[None, :], mask=gm & (d1 < DK1)[None, :], other=0.0).to(tl.float32) * scale,
                 k_pool, F32_DOT)
    q2_row = q2 + b * stride_q2b + h[:, None] * stride_q2h
    q2 = _as_mma(tl.load(q2_row + (d2 - DK1)[None, :], mask=gm & (d2 < DK1 + DK2)[None, :], other=0.0)
                 .to(tl.float32) * scale, k_pool, F32_DOT)
    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_DV), tl.float32)
    for start in range(lo, hi, BLOCK_N):
        t = start + tl.arange(0, BLOCK_N)
        valid = t < hi
        blk = tl.load(block_tables + b * stride_tb + t // BS, mask=valid, other=0).to(tl.int64)
        row = blk * BS + t % BS
        k_row = k_pool + row[:, None] * stride_kr + hk * stride_kh
        k1 = tl.load(k_row + d1[None, :], mask=valid[:, None] & (d1 < DK1)[None, :], other=0.0)
        s = _mma(q1, tl.trans(k1), F32_DOT)
        if DK2 > 0:
            k2 = tl.load(k_row + d2[None, :], mask=valid[:, None] & (d2 < DK1 + DK2)[None, :], other=0.0)
            s += _mma(q2, tl.trans(k2), F32_DOT)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        v = tl.load(v_pool + row[:, None] * stride_vr + hk * stride_vh + dv[None, :],
                    mask=valid[:, None] & (dv < DV)[None, :], other=0.0)
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        pv = _mma(_as_mma(p, v_pool, F32_DOT), v, F32_DOT)
        acc = acc * alpha[:, None] + pv
        m = m_new
    # [B, H, SPLITS, DV] partial outputs, [B, H, SPLITS, 2] (max, sum); H = Hk * GROUP
    head = (hk * GROUP + g).to(tl.int64)
    gmask = g < GROUP
    base = (b * (tl.num_programs(1) * GROUP) + head) * SPLITS + sp
    tl.store(o_part + base[:, None] * DV + dv[None, :], acc, mask=gmask[:, None] & (dv < DV)[None, :])
    tl.store(ml_part + base * 2, m, mask=gmask)
    tl.store(ml_part + base * 2 + 1, l_sum, mask=gmask)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


# Triton's interpreter multiplies bf16 tiles wrongly (numpy has no bf16): there both MMAs take fp32 operands,
# on a GPU bf16 pools take bf16 MMAs (fp32 accumulation) and fp32 pools ieee fp32 ones
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# programs to keep an H200's 132 SMs busy: a batch of few sequences splits its keys into this many / (B x H_kv)
TARGET_PROGRAMS = 264


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           dv: int | None = None, splits: int | None = None,
                           q_rope: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, DK]; k_pool [blocks, bs, H_kv, DK]; v_pool [blocks, bs, H_kv, >= dv]; block_tables
    [B, max_blocks] int; seq_lens [B] int (>= 1: the keys 0..len-1, the new token's included).
    Returns [B, H, dv] in q's dtype (softmax and sums in fp32). splits: key splits per sequence (None: from
    the shapes alone, so a CUDA graph of one batch bucket keeps it): a batch of few sequences and KV heads
    would leave most of the GPU idle, so their keys are split and the partial results combined.
    q_rope: the query in two tensors (MLA's latent query and its rope part, no concatenation): q
    [B, H, DK1], q_rope [B, H, DK - DK1], unit stride in the last dim (concatenated after all where DK1 is
    not a power of two: the kernel's first key segment is)."""
    q2 = q
    if q_rope is not None and q.shape[-1] & (q.shape[-1] - 1):
        q, q_rope = torch.cat([q, q_rope], dim=-1), None      # the kernel's first segment is a power of two
    if q_rope is not None:
        assert q_rope.shape[:2] == q.shape[:2] and q_rope.stride(-1) == 1 and q.stride(-1) == 1
        q2 = q_rope
    B, H, DK = q.shape[0], q.shape[1], q.shape[2] + (q_rope.shape[2] if q_rope is not None else 0)
    bs, Hk = k_pool.shape[1], k_pool.shape[2]
    dv = v_pool.shape[-1] if dv is None else dv
    assert H % Hk == 0 and k_pool.shape[-1] == DK and v_pool.shape[-1] >= dv
    assert q.stride(-1) == 1 and k_pool.stride(-1) == 1 and v_pool.stride(-1) == 1
    assert k_pool.stride(1) == k_pool.stride(0) // bs and v_pool.stride(1) == v_pool.stride(0) // bs, \
        "pools must be contiguous over (block, row)"
    assert k_pool.dtype == v_pool.dtype, "one dtype for keys and values (the MMAs take both)"
    if B == 0:
        return torch.empty(B, H, dv, dtype=q.dtype, device=q.device)
    group = H // Hk
    dk1 = 1 << (DK.bit_length() - 1)                     # the largest power of two <= DK, then the rest
    dk2 = DK - dk1
    if q_rope is None:
        q2 = q[..., dk1:]                                # the rest of q (empty when DK is a power of two)
    assert q_rope is None or dk1 == q.shape[-1], (q.shape, q_rope.shape)
    block_dk1, block_dk2 = max(16, dk1), max(16, _pow2(dk2))
    block_dv, block_g = max(16, _pow2(dv)), max(16, _pow2(group))
    # about 8k key elements per block: 64 keys of 128, 16 latent rows of 512 (+ 64)
    block_n = max(16, min(64, 8192 // block_dk1))
    # the accumulator [heads, dv] and the key tile live in registers: more warps for the big MLA tiles
    warps = 8 if max(block_g * block_dv, block_n * block_dk1) >= 8192 else 4
    if splits is None:
        max_keys = block_tables.shape[1] * bs
        splits = max(1, min(-(-TARGET_PROGRAMS // (B * Hk)), -(-max_keys // block_n)))
    o_part = torch.empty(B, H, splits, dv, dtype=torch.float32, device=q.device)
    ml_part = torch.empty(B, H, splits, 2, dtype=torch.float32, device=q.device)
    _paged_decode_kernel[(B, Hk, splits)](
        q, q2, k_pool, v_pool, o_part, ml_part, block_tables, seq_lens, float(scale),
        q.stride(0), q.stride(1), q2.stride(0), q2.stride(1), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(1), v_pool.stride(2), block_tables.stride(0),
        GROUP=group, DK1=dk1, DK2=dk2, DV=dv, BS=bs, SPLITS=splits, BLOCK_G=block_g, BLOCK_N=block_n,
        BLOCK_DK1=block_dk1, BLOCK_DK2=block_dk2, BLOCK_DV=block_dv,
        F32_DOT=k_pool.dtype == torch.float32 or INTERPRETED, num_warps=warps)
    out = torch.empty(B, H, dv, dtype=q.dtype, device=q.device)
    block_s = max(16, _pow2(splits))
    block_d = max(16, min(128, 8192 // block_s, _pow2(dv)))
    _combine_kernel[(B * H, triton.cdiv(dv, block_d))](o_part, ml_part, out, splits, dv, BLOCK_S=block_s,
                                                       BLOCK_D=block_d, num_warps=4)
    return out


@triton.jit
def _combine_kernel(o_part, ml_part, out, SPLITS, DV, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (sequence x head, block of value columns): the key splits' partial softmaxes joined, each
    split's output and sum rescaled from its own max to the overall one (a split without keys has max
    -inf and weighs 0; split 0 always has keys). One kernel where torch took nine (max, sub, exp, two
    products, two sums, a division, the cast): at batch 1 their launches counted more than their bytes.
    IEEE division; exp as Triton's (a few ulp of fp32 from torch's)."""
    bh = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    s = tl.arange(0, BLOCK_S)
    ms = s < SPLITS
    m = tl.load(ml_part + (bh * SPLITS + s) * 2, mask=ms, other=float("-inf"))
    l_sum = tl.load(ml_part + (bh * SPLITS + s) * 2 + 1, mask=ms, other=0.0)
    w = tl.where(ms, tl.exp(m - tl.max(m, 0)), 0.0)
    o = tl.load(o_part + (bh * SPLITS + s)[:, None] * DV + d[None, :], mask=ms[:, None] & (d < DV)[None, :],
                other=0.0)
    res = tl.div_rn(tl.sum(o * w[:, None], 0), tl.sum(l_sum * w, 0))
    tl.store(out + bh * DV + d, res.to(out.dtype.element_ty), mask=d < DV)


def _combine(o_part: torch.Tensor, ml_part: torch.Tensor) -> torch.Tensor:
    """The torch reference of _combine_kernel: the key splits' partial softmaxes joined."""
    m, l_sum = ml_part[..., 0], ml_part[..., 1]
    if o_part.shape[2] == 1:
        return o_part[:, :, 0] / l_sum
    top = m.max(dim=2, keepdim=True).values
    w = torch.exp(m - top)
    return (o_part * w[..., None]).sum(2) / (l_sum * w).sum(2)[..., None]


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


@triton.jit
def _latent_write_kernel(ckv, weight, pool, rows, stride_c, stride_p, eps, LORA: tl.constexpr,
                         ROPE: tl.constexpr, BL: tl.constexpr, BR: tl.constexpr):
    """Program b: pool row rows[b] = [RMSNorm(ckv[b, :LORA]) * weight, ckv[b, LORA:]] (fp32 inside, one
    rounding: the fused norm's math, fused_ops.add_rms_norm)."""
    b = tl.program_id(0).to(tl.int64)
    r = tl.load(rows + b).to(tl.int64)
    o = tl.arange(0, BL)
    mo = o < LORA
    x = tl.load(ckv + b * stride_c + o, mask=mo, other=0.0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(x * x, 0) / LORA + eps)
    y = x * rstd * tl.load(weight + o, mask=mo, other=0.0).to(tl.float32)
    tl.store(pool + r * stride_p + o, y.to(pool.dtype.element_ty), mask=mo)
    o2 = tl.arange(0, BR)
    m2 = o2 < ROPE
    rope = tl.load(ckv + b * stride_c + LORA + o2, mask=m2, other=0.0)
    tl.store(pool + r * stride_p + LORA + o2, rope.to(pool.dtype.element_ty), mask=m2)


def latent_write(ckv: torch.Tensor, weight: torch.Tensor, pool: torch.Tensor, rows: torch.Tensor,
                 eps: float) -> None:
    """MLA's new cache rows of a decode step in one kernel: ckv [B, lora + rope] (kv_a_proj's output, unit
    column stride), weight [lora] (kv_a_layernorm), pool [blocks, bs, 1, lora + rope] (the layer's latent
    pool, contiguous rows), rows [B] int64 (the flat pool row of each new token). Where torch took three
    kernels (the norm, a concatenation with the rope part, the row scatter)."""
    B, width = ckv.shape
    lora = weight.shape[0]
    flat = pool.view(-1, pool.shape[-1])
    assert ckv.stride(1) == 1 and flat.shape[1] == width and flat.stride(1) == 1 and lora < width
    if B == 0:
        return
    _latent_write_kernel[(B,)](ckv, weight, flat, rows, ckv.stride(0), flat.stride(0), float(eps), LORA=lora,
                               ROPE=width - lora, BL=_pow2(lora), BR=max(16, _pow2(width - lora)), num_warps=4)


def latent_write_reference(ckv, weight, pool, rows, eps) -> None:
    """The torch reference of latent_write: fp32 norm times the weight, one rounding, the rope part as is."""
    lora = weight.shape[0]
    x = ckv[:, :lora].float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    pool.view(-1, pool.shape[-1])[rows] = torch.cat([y, ckv[:, lora:].float()], -1).to(pool.dtype)
