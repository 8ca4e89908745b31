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

Ties between equal scores go to the lower expert id (group ids alike), as torch.topk does on both devices
for the values it can tell apart; exp / sigmoid are Triton's, so a weight may differ from the reference's in
its last bits, and the renormalising sum runs in selection order (the reference's in torch's): the tests
compare ids exactly and weights within a few ulps.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

KIMI, QWEN = 0, 1


@triton.jit
def _route_row(row, bias, idx_out, w_out, t, stride_o, scale,
               KIND: tl.constexpr, TOP_K: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr,
               GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_GS: tl.constexpr, BLOCK_K: tl.constexpr,
               NORM: tl.constexpr, SHARED: tl.constexpr, CACHE: tl.constexpr):
    """One token's selection from its logits at row (see the module docstring); CACHE: the logits' load
    cache modifier (".cg" where other programs of this launch wrote them: L2, never a stale L1 line)."""
    g = tl.arange(0, BLOCK_G)[:, None]
    j = tl.arange(0, BLOCK_GS)[None, :]
    e = g * GROUP + j
    valid = (g < N_GROUP) & (j < GROUP)
    E: tl.constexpr = N_GROUP * GROUP
    lg = tl.load(row + e, mask=valid, other=0.0, cache_modifier=CACHE).to(tl.float32)
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
        gate = tl.load(row + E, cache_modifier=CACHE).to(tl.float32)
        ids = tl.where(kk == TOP_K, E, ids)
        ws = tl.where(kk == TOP_K, tl.sigmoid(gate), ws)
    n = TOP_K + (SHARED > 0)
    tl.store(idx_out + t * stride_o + kk, ids, mask=kk < n)
    tl.store(w_out + t * stride_o + kk, ws.to(w_out.dtype.element_ty), mask=kk < n)




@triton.jit
def _route(logits, bias, idx_out, w_out, stride_l, stride_o, scale,
           KIND: tl.constexpr, TOP_K: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr,
           GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_GS: tl.constexpr, BLOCK_K: tl.constexpr,
           NORM: tl.constexpr, SHARED: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    _route_row(logits + t * stride_l, bias, idx_out, w_out, t, stride_o, scale, KIND, TOP_K, N_GROUP, TOPK_GROUP,
               GROUP, BLOCK_G, BLOCK_GS, BLOCK_K, NORM, SHARED, "")


@triton.jit
def _router_route(x, w, logits, counter, bias, idx_out, w_out, N, D, stride_o, scale, BN: tl.constexpr,
                  BK: tl.constexpr, KIND: tl.constexpr, TOP_K: tl.constexpr, N_GROUP: tl.constexpr,
                  TOPK_GROUP: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_GS: tl.constexpr,
                  BLOCK_K: tl.constexpr, NORM: tl.constexpr, SHARED: tl.constexpr):
    """One token: program i computes logits [i*BN, (i+1)*BN) = x . w[rows] (fp32 sums, x upcast exactly,
    stored in logits' dtype: Kimi's fp32, Qwen's bf16 as its router rounds them); the last program to finish
    (an acq_rel count of finished programs: it sees every other program's logits) selects the experts and
    sets the count back to 0 for the next launch or graph replay."""
    pid = tl.program_id(0)
    o_n = pid * BN + tl.arange(0, BN)
    o_w = tl.minimum(o_n, N - 1).to(tl.int64)
    o_k = tl.arange(0, BK)
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(D, BK)):
        kmask = o_k < D - k0 * BK
        xt = tl.load(x + k0 * BK + o_k, mask=kmask, other=0.0).to(tl.float32)
        wt = tl.load(w + o_w[:, None] * D + k0 * BK + o_k[None, :], mask=kmask[None, :], other=0.0).to(tl.float32)
        acc += wt * xt[None, :]
    tl.store(logits + o_n, tl.sum(acc, 1).to(logits.dtype.element_ty), mask=o_n < N)
    # every thread's stores before the count (the barrier), and the count's release publishes them at GPU
    # scope: the threadfence-reduction pattern, a thread's fence replaced by the release's cumulativity
    tl.debug_barrier()
    done = tl.atomic_add(counter, 1, sem="acq_rel")
    if done == tl.num_programs(0) - 1:
        tl.atomic_xchg(counter, 0, sem="relaxed")
        _route_row(logits, bias, idx_out, w_out, 0, stride_o, scale, KIND, TOP_K, N_GROUP, TOPK_GROUP, GROUP,
                   BLOCK_G, BLOCK_GS, BLOCK_K, NORM, SHARED, ".cg")


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


_COUNTERS: dict = {}


def _counter(device) -> torch.Tensor:
    """The finished-program count of _router_route, one per device: each launch leaves it at 0 (its last
    program resets it), so launches on one stream and the graphs that replay them share it."""
    key = str(device)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return _COUNTERS[key]


def router_route(x: torch.Tensor, router: torch.Tensor, logits_dtype: torch.dtype, kind: int, top_k: int,
                 n_group: int = 1, topk_group: int = 1, norm: bool = True, scale: float = 1.0,
                 bias: torch.Tensor | None = None, shared: int = 0,
                 weight_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's router product and selection in one launch: route(x.to(logits_dtype) @ router.T as the
    layer computes it, ...) for x [1, D] and router [E (+1 for Qwen's shared gate), D]. At a batch-1 decode
    step the product (2.4 MB for Kimi) is one short kernel and the selection another, each paid in launch
    latency; here the last of the product's programs selects."""
    assert x.shape[0] == 1 and x.stride(-1) == 1 and router.is_contiguous() and router.shape[1] == x.shape[1]
    N, D = router.shape
    E = N - (shared == 2)
    assert E % n_group == 0 and 1 <= topk_group <= n_group and top_k <= E // n_group * topk_group
    assert kind == QWEN or bias is not None
    group = E // n_group
    width = top_k + (shared > 0)
    idx = torch.empty(1, width, dtype=torch.int32, device=x.device)
    w = torch.empty(1, width, dtype=weight_dtype, device=x.device)
    logits = torch.empty(1, N, dtype=logits_dtype, device=x.device)
    # 2 rows a program, 1024-wide steps (the batch-1 GEMV's tiles, kernels/gemv.py): 128 programs for Kimi
    bn, bk = 2, min(1024, triton.next_power_of_2(D))
    _router_route[(triton.cdiv(N, bn),)](
        x, router, logits, _counter(x.device), x if bias is None else bias, idx, w, N, D, width, float(scale),
        BN=bn, BK=bk, KIND=kind, TOP_K=top_k, N_GROUP=n_group, TOPK_GROUP=topk_group, GROUP=group,
        BLOCK_G=triton.next_power_of_2(n_group), BLOCK_GS=triton.next_power_of_2(group),
        BLOCK_K=triton.next_power_of_2(width), NORM=bool(norm), SHARED=shared, num_warps=4)
    return idx, w
