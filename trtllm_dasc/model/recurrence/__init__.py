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
    ok, why = fla_backend.available()
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
        for p in c:
            where[(i, p)] = len(where)
    if rounds == 1:
        o, ht = fn(q, k, v, g, beta, h0, cu_seqlens, **gate)
        for (i, _), row in where.items():
            hb[row] = ht[i]
        return o, ht, hb
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
