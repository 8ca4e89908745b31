"""Recurrence backends (torch reference, fla kernels) behind one interface, plus boundary-state capture.

A backend is a module-like object with
    gdn(q, k, v, g, beta, initial_state, cu_seqlens, scale=None) -> (o, ht)
    kda(q, k, v, g, beta, initial_state, cu_seqlens, scale=None) -> (o, ht)
(fla shapes: q,k [1,T,H,K], v [1,T,HV,V], g [1,T,HV] (gdn) or [1,T,HV,K] (kda), beta [1,T,HV],
initial_state / ht [N,HV,K,V] fp32). `run_recurrence` adds checkpoints: it returns the states after
chosen token counts of each sequence in the same forward pass, by cutting every sequence at its
checkpoint positions and running the segments in rounds (round r = r-th segment of every sequence, one
varlen kernel call, h0 = the states the previous round left). The states are exact fp32, not the
bf16 chunk states fla's return_intermediate_states gives.

A backend that also offers `kda_chunk_states` (fla's; `gdn_chunk_states` would be taken alike; same
arguments; returns o, ht and the
fp32 state at the start of every chunk of CHUNK tokens of every sequence, see fla.kda_chunk_states) takes
the rounds' place: one call for the whole batch, a cut on a chunk boundary read from those states, any
other cut replayed from the chunk boundary below it (under CHUNK tokens, all such cuts in one more varlen
call). On the H200 a prefill step of 8192 tokens with a checkpoint every 256 tokens ran each KDA layer's
recurrence as up to 11 rounds, each a full fla call of ~1 ms of host time (`python -m benchmarks
real_model --profile-pass`): the step was host-bound. A backend can say chunk_state_captures = False to
keep the rounds (fla's does, until its GPU test has run: recurrence/fla.py).
"""
from __future__ import annotations

import torch

from trtllm_dasc.errors import UserError
from trtllm_dasc.model.recurrence import fla as fla_backend
from trtllm_dasc.model.recurrence import naive as torch_backend
from trtllm_dasc.spec import BACKENDS


class _FlaUnfused:
    """fla's recurrence kernels under the mixers' torch code for the conv, gate and norm: the speed
    benchmark's comparison arm (what the fla backend was before the mixers were fused)."""
    __name__ = "fla-unfused"
    fused_mixer = False
    gdn = staticmethod(fla_backend.gdn)
    kda = staticmethod(fla_backend.kda)


fla_unfused_backend = _FlaUnfused()


def get_backend(name: str = "auto", device: str | torch.device = "cpu"):
    """'torch' (reference, any device), 'fla' (CUDA + fla: recurrence and the mixers' conv, gate and norm in
    fla's kernels), 'fla-unfused' (fla's recurrence only), 'auto' (fla on CUDA when importable)."""
    if name not in BACKENDS:
        raise UserError(f"recurrence backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    on_cuda = torch.device(device).type == "cuda"
    if name == "torch" or (name == "auto" and not on_cuda):
        return torch_backend
    # by the tensors' device, not by whether a GPU exists: a CPU model on a GPU machine runs the reference
    ok, why = fla_backend.available(device)
    if ok:
        return fla_unfused_backend if name == "fla-unfused" else fla_backend
    if name != "auto":
        raise UserError(f"recurrence backend {name!r} is unavailable: {why}")
    return torch_backend


def run_recurrence(backend, kind: str, q, k, v, g, beta, h0: torch.Tensor, cu_seqlens: list[int],
                   cuts: list[list[int]] | None = None, **gate):
    """Run the recurrence over varlen sequences and capture states at chosen token counts.

    kind: 'gdn' | 'kda'. Tensors as in the module docstring; h0 [N, HV, K, V] fp32 (not modified).
    cuts[i]: sorted token counts in 1..len_i after which sequence i's state is captured.
    Returns o [1, T, HV, V], ht [N, HV, K, V] fp32, hb [sum(len(cuts_i)), HV, K, V] fp32 in
    (sequence, cut) order. gate: the fla backend's in-kernel gate arguments (recurrence/fla.py), passed on.
    """
    fn = backend.gdn if kind == "gdn" else backend.kda
    N = len(cu_seqlens) - 1
    cuts = cuts or [[] for _ in range(N)]
    lens = [b - a for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:])]
    # segment ends of each sequence: its cuts, then its end
    ends = [sorted(set(c) | {n}) for c, n in zip(cuts, lens)]
    rounds = max(len(e) for e in ends)
    HV, K, V = h0.shape[1:]
    hb = h0.new_empty(sum(len(c) for c in cuts), HV, K, V, dtype=torch.float32)
    where = {}                                    # (seq, cut) -> row of hb
    for i, c in enumerate(cuts):
        if len(set(c)) != len(c):
            raise ValueError(f"sequence {i}'s cuts repeat a position: {c}")
        for p in c:
            where[(i, p)] = len(where)
    if rounds == 1:
        o, ht = fn(q, k, v, g, beta, h0, cu_seqlens, **gate)
        for (i, _), row in where.items():
            hb[row] = ht[i]
        return o, ht, hb
    with_chunks = getattr(backend, f"{kind}_chunk_states", None)
    if with_chunks is not None and getattr(backend, "chunk_state_captures", True):
        return _from_chunk_states(with_chunks, fn, q, k, v, g, beta, h0, cu_seqlens, cuts, lens, where, hb, gate)
    o = v.new_empty(v.shape)
    state = h0.float().clone()
    for r in range(rounds):
        active = [i for i in range(N) if len(ends[i]) > r]
        spans = [(cu_seqlens[i] + (ends[i][r - 1] if r else 0), cu_seqlens[i] + ends[i][r]) for i in active]
        idx = torch.cat([torch.arange(a, b, device=q.device) for a, b in spans])
        sub_cu = [0]
        for a, b in spans:
            sub_cu.append(sub_cu[-1] + b - a)
        rows = torch.tensor(active, device=h0.device)
        o_r, ht_r = fn(q[:, idx], k[:, idx], v[:, idx], g[:, idx], beta[:, idx], state[rows], sub_cu, **gate)
        o[:, idx] = o_r
        state[rows] = ht_r
        for j, i in enumerate(active):
            row = where.get((i, ends[i][r]))
            if row is not None:
                hb[row] = ht_r[j]
    return o, state, hb


def _from_chunk_states(with_chunks, fn, q, k, v, g, beta, h0, cu_seqlens, cuts, lens, where, hb, gate):
    """run_recurrence's captures from one call that keeps the state at every chunk start (module docstring):
    a cut at p = the state at the start of chunk p / CHUNK when CHUNK divides p, the final state when p is
    the sequence's length, else the tokens [CHUNK * (p // CHUNK), p) replayed from the chunk start below p
    (every such cut of the batch in one varlen call of fn)."""
    o, ht, chunks, size = with_chunks(q, k, v, g, beta, h0, cu_seqlens, **gate)
    first_chunk = [0]                         # sequence i's chunk j is chunks[first_chunk[i] + j]
    for n in lens:
        first_chunk.append(first_chunk[-1] + -(-n // size))
    # (row of hb, row of the source) for the cuts read as they are: one gather each, not one copy a cut
    from_final, from_chunk, replay_rows, replay_from, replay_spans = [], [], [], [], []
    for i, c in enumerate(cuts):
        for p in c:
            row = where[(i, p)]
            if p == lens[i]:
                from_final.append((row, i))
            elif p % size == 0:
                from_chunk.append((row, first_chunk[i] + p // size))
            else:
                base = p - p % size
                replay_rows.append(row)
                replay_from.append(first_chunk[i] + p // size)
                replay_spans.append((cu_seqlens[i] + base, cu_seqlens[i] + p))
    for pairs, src in ((from_final, ht), (from_chunk, chunks)):
        if pairs:
            rows, srcs = zip(*pairs)
            hb[torch.tensor(rows, device=hb.device)] = src[torch.tensor(srcs, device=src.device)]
    if replay_rows:
        idx = torch.cat([torch.arange(a, b, device=q.device) for a, b in replay_spans])
        sub_cu = [0]
        for a, b in replay_spans:
            sub_cu.append(sub_cu[-1] + b - a)
        start = chunks[torch.tensor(replay_from, device=chunks.device)]
        _, ends = fn(q[:, idx], k[:, idx], v[:, idx], g[:, idx], beta[:, idx], start, sub_cu, **gate)
        hb[torch.tensor(replay_rows, device=hb.device)] = ends
    return o, ht, hb
