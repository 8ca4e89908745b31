"""The router's selection after its GEMV in one launch: scores, grouped top-k, top-k, gather, renormalise,
scale, and the shared expert's slot. Its torch reference is the layers' own route() in model/mlp.py
(KimiMoE.route, QwenMoE.route), which follow transformers' modules and are tested against them.

At a decode step the routing in torch is ~18 launches per MoE layer (sigmoid, add, a topk per group, a sum,
zeros, scatter, expand, masked_fill, topk, gather, sum, add, div, mul; Qwen: softmax, topk, sum, div, cast,
and the shared gate's sigmoid), each a few microseconds of a CUDA graph's replay while the layer's expert
bytes take ~27 us on the H200: at batch 1 the chain, not the bytes, set the layer's time. Here one program
per token holds the token's E logits in registers (E <= 1024) and writes
  idx [T, k + S]  the k chosen experts in the order of selection (best first), then, where the layer has a
                  shared expert (S = 1), the id E: the shared expert stored as expert E (mlp._MoE folds it);
  w   [T, k + S]  their routing weights (Kimi: fp32, sigmoid scores renormalised and scaled; Qwen: x's dtype,
                  softmax probabilities renormalised), then the shared expert's (Kimi 1; Qwen
                  sigmoid(logit of its gate), the gate's row appended to the router's as row E).

Ties between equal scores go to the lower expert id (group ids alike), in every place of the selection.
torch.topk, which the reference and transformers' routers use, promises no order among equal values, and on
the CPU it often takes a higher id: on exactly tied scores the kernel may pick another of the equally scored
experts than the reference (the same weights, another expert), never a different score
(tests/model/test_moe_route_ties.py). exp / sigmoid are Triton's, so a weight may differ from the
reference's in its last bits, and the renormalising sum runs in selection order (the reference's in
torch's): the tests compare ids exactly (untied scores) and weights within a few ulps.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

KIMI, QWEN = 0, 1


@triton.jit
def _route(logits, bias, idx_out, w_out, stride_l, stride_o, scale,
           KIND: tl.constexpr, TOP_K: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr,
           GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_GS: tl.constexpr, BLOCK_K: tl.constexpr,
           NORM: tl.constexpr, SHARED: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, BLOCK_G)[:, None]
    j = tl.arange(0, BLOCK_GS)[None, :]
    e = g * GROUP + j
    valid = (g < N_GROUP) & (j < GROUP)
    E: tl.constexpr = N_GROUP * GROUP
    row = logits + t * stride_l
    lg = tl.load(row + e, mask=valid, other=0.0).to(tl.float32)
    if KIND == 0:
        # kimi: sigmoid scores choose with the correction bias, weigh without it
        score = tl.sigmoid(lg)
        choice = score + tl.load(bias + e, mask=valid, other=0.0).to(tl.float32)
    else:
        # qwen: softmax in fp32 over the E experts
        m = tl.max(tl.max(tl.where(valid, lg, float("-inf")), 1), 0)
        p = tl.where(valid, tl.exp(lg - m), 0.0)
        score = p / tl.sum(tl.sum(p, 1), 0)
        choice = score
    # a padded lane's e may alias a real expert of the next group: it neither chooses nor weighs
    score = tl.where(valid, score, 0.0)
    choice = tl.where(valid, choice, float("-inf"))
    if N_GROUP > 1:
        # a group's score: the sum of its two best choices (its best alone when a group holds one expert)
        best = tl.max(choice, 1)
        if GROUP > 1:
            first = tl.min(tl.where(choice == best[:, None], j, BLOCK_GS), 1)
            second = tl.max(tl.where(j == first[:, None], float("-inf"), choice), 1)
            gscore = best + second
        else:
            gscore = best
        gi = tl.arange(0, BLOCK_G)
        gscore = tl.where(gi < N_GROUP, gscore, float("-inf"))
        keep = gi < 0
        for _ in tl.static_range(TOPK_GROUP):
            top = tl.max(gscore, 0)
            pick = tl.min(tl.where(gscore == top, gi, BLOCK_G), 0)
            keep = keep | (gi == pick)
            gscore = tl.where(gi == pick, float("-inf"), gscore)
        choice = tl.where(keep[:, None], choice, float("-inf"))
    kk = tl.arange(0, BLOCK_K)
    ids = tl.zeros((BLOCK_K,), dtype=tl.int32)
    ws = tl.zeros((BLOCK_K,), dtype=tl.float32)
    total = 0.0
    for s in tl.static_range(TOP_K):
        top = tl.max(tl.max(choice, 1), 0)
        pick = tl.min(tl.min(tl.where(valid & (choice == top), e, E), 1), 0)
        wt = tl.sum(tl.sum(tl.where(valid & (e == pick), score, 0.0), 1), 0)
        ids = tl.where(kk == s, pick, ids)
        ws = tl.where(kk == s, wt, ws)
        total += wt
        choice = tl.where(valid & (e == pick), float("-inf"), choice)
    if NORM:
        if KIND == 0:
            ws = ws / (total + 1e-20)
        else:
            ws = ws / total
    if KIND == 0:
        ws = ws * scale
    if SHARED == 1:
        # kimi's shared expert: weight 1 (its output is added as it is)
        ids = tl.where(kk == TOP_K, E, ids)
        ws = tl.where(kk == TOP_K, 1.0, ws)
    if SHARED == 2:
        # qwen's: its gate's logit follows the router's E logits
        gate = tl.load(row + E).to(tl.float32)
        ids = tl.where(kk == TOP_K, E, ids)
        ws = tl.where(kk == TOP_K, tl.sigmoid(gate), ws)
    n = TOP_K + (SHARED > 0)
    tl.store(idx_out + t * stride_o + kk, ids, mask=kk < n)
    tl.store(w_out + t * stride_o + kk, ws.to(w_out.dtype.element_ty), mask=kk < n)


def _warps(E: int) -> int:
    """Warps of a token's program. Each of the top_k picks is three reductions over the E scores; with one
    warp per 256 experts (8 a thread) they are register shuffles, with more each crosses warps through
    shared memory with a barrier: at a decode step the program's latency is those reductions, not its
    1 KB of logits."""
    return max(1, min(8, E // 256))


def route(logits: torch.Tensor, kind: int, top_k: int, n_group: int = 1, topk_group: int = 1,
          norm: bool = True, scale: float = 1.0, bias: torch.Tensor | None = None, shared: int = 0,
          weight_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx int32 [T, top_k + (shared > 0)], weights [T, same] in weight_dtype) from the router's logits
    [T, E] (shared == 2: [T, E + 1], the shared gate's logit last). kind: KIMI or QWEN; shared: 0 none, 1 a
    shared expert of weight 1 (Kimi), 2 a sigmoid-gated one (Qwen). bias: Kimi's correction bias [E]."""
    T = logits.shape[0]
    E = logits.shape[1] - (shared == 2)
    assert E % n_group == 0 and 1 <= topk_group <= n_group and top_k <= E // n_group * topk_group
    assert logits.stride(1) == 1 and (kind == QWEN or bias is not None)
    group = E // n_group
    width = top_k + (shared > 0)
    idx = torch.empty(T, width, dtype=torch.int32, device=logits.device)
    w = torch.empty(T, width, dtype=weight_dtype, device=logits.device)
    if T == 0:
        return idx, w
    _route[(T,)](logits, logits if bias is None else bias, idx, w, logits.stride(0), width, float(scale),
                 KIND=kind, TOP_K=top_k, N_GROUP=n_group, TOPK_GROUP=topk_group, GROUP=group,
                 BLOCK_G=triton.next_power_of_2(n_group), BLOCK_GS=triton.next_power_of_2(group),
                 BLOCK_K=triton.next_power_of_2(width), NORM=bool(norm), SHARED=shared,
                 num_warps=_warps(E))
    return idx, w
