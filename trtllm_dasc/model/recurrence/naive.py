"""PyTorch reference of the gated delta rule (GDN: scalar decay per head; KDA: decay per key channel).

Recurrence per value head, state S in R^{K x V} (fla's layout), q/k l2-normalised, q scaled by K^-0.5:
    S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t
Computed chunk by chunk (WY form, as fla and transformers do) so long prompts stay fast on the CPU;
chunks are processed one at a time so the per-channel decay tensor [HV, C, C, K] stays small.
Same signatures as the fla backend (recurrence/fla.py); everything runs in fp32.
"""
from __future__ import annotations

import torch

from trtllm_dasc.model.ops import l2norm

CHUNK = 64


def _chunk_core(q, k, v, g, beta, S):
    """One sequence. q,k [HV, T, K] (normalised, q scaled), v [HV, T, V], g [HV, T] or [HV, T, K] (log decay),
    beta [HV, T], S [HV, K, V]. Returns o [HV, T, V] and the final S."""
    HV, T, K = k.shape
    o = v.new_empty(v.shape)
    per_channel = g.dim() == 3
    for s in range(0, T, CHUNK):
        e = min(s + CHUNK, T)
        C = e - s
        qc, kc, vc, bc = q[:, s:e], k[:, s:e], v[:, s:e], beta[:, s:e]
        G = g[:, s:e].cumsum(1)
        upper = torch.ones(C, C, dtype=torch.bool, device=q.device).triu(1)
        kb = kc * bc[..., None]
        if per_channel:
            # exp(G_i - G_j) per channel, j <= i only (the masked entries would overflow)
            diff = (G[:, :, None, :] - G[:, None, :, :]).masked_fill(upper[None, :, :, None], float("-inf")).exp()
            A = (kb[:, :, None, :] * kc[:, None, :, :] * diff).sum(-1)
            QK = (qc[:, :, None, :] * kc[:, None, :, :] * diff).sum(-1)
            eG, eLast = G.exp(), G[:, -1:, :]
            k_tail = kc * (eLast - G).exp()
            S_decay = eLast.exp().transpose(1, 2)                   # [HV, K, 1]
        else:
            diff = (G[:, :, None] - G[:, None, :]).masked_fill(upper, float("-inf")).exp()
            A = (kb @ kc.transpose(1, 2)) * diff
            QK = (qc @ kc.transpose(1, 2)) * diff
            eG, eLast = G.exp()[..., None], G[:, -1:]
            k_tail = kc * (eLast - G).exp()[..., None]
            S_decay = eLast.exp()[..., None]                        # [HV, 1, 1]
        # WY: (I + strict_lower(A))^{-1} applied to beta*v and to the decayed beta*k
        Ts = A.masked_fill(~torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1), 0.0)
        U = torch.linalg.solve_triangular(Ts, vc * bc[..., None], upper=False, unitriangular=True)
        Wk = torch.linalg.solve_triangular(Ts, kb * eG, upper=False, unitriangular=True)
        v_new = U - Wk @ S
        o[:, s:e] = (qc * eG) @ S + QK @ v_new
        S = S * S_decay + k_tail.transpose(1, 2) @ v_new
    return o, S


def _run(q, k, v, g, beta, initial_state, cu_seqlens, scale):
    """q,k [1, T, H, K]; v [1, T, HV, V]; g [1, T, HV] or [1, T, HV, K]; beta [1, T, HV];
    initial_state [N, HV, K, V] fp32; cu_seqlens [N+1]. Returns o [1, T, HV, V] (v's dtype), ht fp32."""
    H, K = q.shape[2], q.shape[3]
    HV = v.shape[2]
    scale = K ** -0.5 if scale is None else scale
    cu = [int(c) for c in cu_seqlens]
    f32 = [t[0].float() for t in (q, k, v, g, beta)]
    qf, kf, vf, gf, bf = f32
    qf, kf = l2norm(qf) * scale, l2norm(kf)
    if HV != H:
        # grouped value heads: value head j reads key head j // (HV / H), as repeat_interleave does
        qf, kf = qf.repeat_interleave(HV // H, dim=1), kf.repeat_interleave(HV // H, dim=1)
    o = torch.empty(vf.shape, dtype=torch.float32, device=v.device)
    ht = initial_state.new_empty(initial_state.shape, dtype=torch.float32)
    for i, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        oi, ht[i] = _chunk_core(qf[a:b].transpose(0, 1), kf[a:b].transpose(0, 1), vf[a:b].transpose(0, 1),
                                gf[a:b].transpose(0, 1), bf[a:b].transpose(0, 1), initial_state[i].float())
        o[a:b] = oi.transpose(0, 1)
    return o.to(v.dtype)[None], ht


def gdn(q, k, v, g, beta, initial_state, cu_seqlens, scale=None):
    """Gated DeltaNet. q,k [1,T,H,K], v [1,T,HV,V], g [1,T,HV], beta [1,T,HV], initial_state [N,HV,K,V]."""
    return _run(q, k, v, g, beta, initial_state, cu_seqlens, scale)


def kda(q, k, v, g, beta, initial_state, cu_seqlens, scale=None):
    """Kimi Delta Attention. q,k,v [1,T,H,K], g [1,T,H,K], beta [1,T,H], initial_state [N,H,K,V]."""
    return _run(q, k, v, g, beta, initial_state, cu_seqlens, scale)
