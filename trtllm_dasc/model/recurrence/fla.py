"""fla (flash-linear-attention, fla-core 0.6.0) Triton kernels behind the reference's signatures. GPU only.

Prefill uses the chunked kernels; a pure decode step (every sequence has one token) uses the fused
recurrent ones. The gate formula and beta's sigmoid can run inside the kernels (the fused mixers pass
A_log/dt_bias and beta_logits); without them the caller passes the computed log decay and beta. q and k
are l2-normalised inside the kernels unless the caller did it (qk_normalized: the prefill's conv kernel).
State layout is fla's default [N, HV, K, V] (state_v_first=False), fp32.
Note the argument orders differ in fla: chunk_gated_delta_rule(q, k, v, g, beta) but
naive_recurrent_gated_delta_rule(q, k, v, beta, g); keywords everywhere avoid the trap.
"""
from __future__ import annotations

import torch

try:  # fla is optional: the CPU machine runs the torch reference
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    from fla.ops.kda import chunk_kda, fused_recurrent_kda
    # the fused mixers' conv and norms, the fused add + norm and SwiGLU (model/fused_ops.py) come with this
    # backend: unavailable together
    import fla.modules.causal_conv1d  # noqa: F401
    import fla.modules.norm.fused_norm_gate  # noqa: F401
    import fla.modules.norm.layernorm  # noqa: F401
    import fla.modules.activations  # noqa: F401
    IMPORT_ERROR: Exception | None = None
except Exception as e:  # noqa: BLE001 - any import failure means "not available"
    IMPORT_ERROR = e


def available(device: str | torch.device | None = None) -> tuple[bool, str]:
    """(usable, reason): needs the fla package and a CUDA device; with ``device``, the tensors' device must be
    one (a CPU model on a GPU machine must not take fla: Triton's launcher refuses CPU tensors)."""
    if device is not None and torch.device(device).type != "cuda":
        return False, f"the model's device is {torch.device(device).type}; fla's Triton kernels need a CUDA device"
    if not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False); fla's Triton kernels need one"
    if IMPORT_ERROR is not None:
        return False, f"fla is not importable: {IMPORT_ERROR}"
    return True, "ok"


# tuple(cu_seqlens), device -> (device tensor, host tensor). Every layer of a forward passes the same list:
# one copy to the GPU per forward instead of one per layer and kernel (a copy from pageable host memory
# waits for the stream), and fla's per-tensor caches (chunk indices, keyed on the tensor object) hit.
_CU_CACHE: dict = {}


def cu_tensors(cu_seqlens, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens on the device, on the host), int64; the same tensor objects for the same list."""
    if isinstance(cu_seqlens, torch.Tensor):
        return cu_seqlens.to(device=device, dtype=torch.long), cu_seqlens.cpu().long()
    key = (tuple(cu_seqlens), str(device))
    hit = _CU_CACHE.get(key)
    if hit is None:
        if len(_CU_CACHE) >= 256:          # a serving loop sees many batch shapes: forget, never grow
            _CU_CACHE.clear()
        host = torch.tensor(key[0], dtype=torch.long)
        hit = _CU_CACHE[key] = (host.to(device), host)
    return hit


# the mixers (linear_attn.py) take their fused path with this backend: conv, gate, beta and norm in kernels
fused_mixer = True


def _gate_args(A_log=None, dt_bias=None, beta_logits=False, qk_normalized=False) -> dict:
    """The kernels' in-kernel gate, beta and l2norm options. With A_log/dt_bias, g is the raw gate and the
    kernel computes -exp(A_log) * softplus(g + dt_bias) (fp32, the reference's formula); with beta_logits,
    beta is the b projection and the kernel takes its sigmoid; q and k are l2-normalised inside unless
    qk_normalized (the prefill's conv kernel did it, model/kernels/conv.py)."""
    extra = {"use_qk_l2norm_in_kernel": not qk_normalized}
    if A_log is not None:
        extra.update(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    if beta_logits:
        extra.update(use_beta_sigmoid_in_kernel=True)
    return extra


def _call(chunk, fused, q, k, v, g, beta, initial_state, cu_seqlens, scale, **gate):
    """Chunked kernel for prefill, the recurrent one when every sequence has a single token (gate
    arguments: _gate_args)."""
    extra = _gate_args(**gate)
    beta_logits = gate.get("beta_logits", False)
    beta = beta if beta_logits else beta.to(q.dtype)
    N, T = len(cu_seqlens) - 1, q.shape[1]
    if T == N:
        # a decode step (every sequence has one token): the recurrent kernel over a batch of N one-token
        # sequences, [N, 1, ...], which needs no cu_seqlens at all
        o, ht = fused(q=q.transpose(0, 1), k=k.transpose(0, 1), v=v.transpose(0, 1), g=g.transpose(0, 1),
                      beta=beta.transpose(0, 1), scale=scale, initial_state=initial_state.float(),
                      output_final_state=True, **extra)
        return o.transpose(0, 1), ht.float()
    cu, cu_host = cu_tensors(cu_seqlens, q.device)
    o, ht = chunk(q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=initial_state.float(),
                  output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=cu_host,
                  **extra)
    return o, ht.float()


def gdn(q, k, v, g, beta, initial_state, cu_seqlens, scale=None, **gate):
    """Gated DeltaNet. q,k [1,T,H,K], v [1,T,HV,V], g [1,T,HV] fp32 log decay, beta [1,T,HV],
    initial_state [N,HV,K,V] fp32. Returns o [1,T,HV,V] and ht [N,HV,K,V] fp32.
    gate: A_log [HV], dt_bias [HV] (g is then the raw `a` projection), beta_logits, qk_normalized
    (_gate_args)."""
    return _call(chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, q, k, v, g, beta, initial_state,
                 cu_seqlens, scale, **gate)


def kda(q, k, v, g, beta, initial_state, cu_seqlens, scale=None, **gate):
    """Kimi Delta Attention. q,k,v [1,T,H,K], g [1,T,H,K] fp32 log decay, beta [1,T,H],
    initial_state [N,H,K,V] fp32. Returns o [1,T,H,V] and ht [N,H,K,V] fp32.
    gate: A_log [H], dt_bias [H*K] (g is then the raw f_b projection), beta_logits, qk_normalized
    (_gate_args)."""
    return _call(chunk_kda, fused_recurrent_kda, q, k, v, g, beta, initial_state, cu_seqlens, scale, **gate)


def kda_decode_in_place(q, k, v, g, beta, states, rows, scale=None, **gate):
    """A KDA decode step of N one-token sequences that reads and writes their recurrent states where they
    live. q, k, v, g [1, N, H, K], beta [1, N, H]; states [R, H, K, V] fp32, every row of the layer (a
    contiguous view); rows [N] int64 on the device, sequence i's row, distinct (model.forward refuses a
    repeated row; only a CUDA graph's padding repeats its one reserved row, whose contents nobody reads).
    Returns o [1, N, H, V].
    fla's continuous-batching mode (ssm_state_indices, the final state stored over the initial one), which
    its public wrapper does not expose: no gather of the N states before the kernel and no scatter after,
    which at batch 64 moved twice the state bytes the kernel itself reads and writes. GDN's recurrent
    kernel in fla-core 0.6.0 has no such mode."""
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    assert states.is_contiguous() and states.dtype == torch.float32
    extra = _gate_args(**gate)
    beta = beta if gate.get("beta_logits") else beta.to(q.dtype)
    # the kernel addresses its inputs as dense [N, 1, H, *] (the public wrapper's input_guard copies too)
    q, k, v, g, beta = (t.transpose(0, 1).contiguous() for t in (q, k, v, g, beta))
    o, _ = fused_recurrent_kda_fwd(q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=states,
                                   inplace_final_state=True, output_final_state=True, ssm_state_indices=rows,
                                   out=torch.empty_like(v), **extra)
    return o.transpose(0, 1)


# the chunk size of fla's chunked KDA kernels (chunk_kda's default): kda_chunk_states' states are this far apart
CHUNK = 64
# whether run_recurrence takes kda_chunk_states for a step's captures (one fla call instead of one per capture
# round). On since `pytest tests/model/test_fla_gpu.py -k "chunk_state or boundary"` passed on an H200
# (2026-12-02, 4 passed). False here brings back the per-round calls (one fla call per capture round)
chunk_state_captures = True


def _fwd_h_fp32(k, w, u, g=None, gk=None, initial_state=None, output_final_state=False, chunk_size=64,
                save_new_value=True, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                chunk_indices=None, chunk_offsets=None, **unknown):
    """fla's chunk_gated_delta_rule_fwd_h (fla-core 0.6.0, fla/ops/common/chunk_delta_h.py) with the chunk
    states h kept in fp32: the same kernel, whose fp32 running state it stores rounded to h's dtype, and
    which fla allocates in k's (bf16). The output kernel that reads h casts it to q's dtype first
    (chunk_gla_fwd_o_gk), so o is unchanged."""
    import triton
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_kernel_h_blockdim64
    from fla.ops.utils import prepare_chunk_indices, prepare_chunk_offsets
    if unknown or state_v_first or cu_seqlens is None:
        raise RuntimeError(f"fla's chunk KDA called its state kernel in a way kda_chunk_states does not mirror "
                           f"(fla-core 0.6.0's): {sorted(unknown)}, state_v_first={state_v_first}")
    B, T, H, K, V, HV = *k.shape, u.shape[-1], u.shape[2]
    if chunk_indices is None:
        chunk_indices = prepare_chunk_indices(cu_seqlens, chunk_size)
    N, NT = len(cu_seqlens) - 1, len(chunk_indices)
    if chunk_offsets is None:
        chunk_offsets = prepare_chunk_offsets(cu_seqlens, chunk_size)
    h = k.new_empty(B, NT, HV, K, V, dtype=torch.float32)
    final_state = k.new_zeros(N, HV, K, V, dtype=torch.float32) if output_final_state else None
    v_new = torch.empty_like(u) if save_new_value else None
    chunk_gated_delta_rule_fwd_kernel_h_blockdim64[lambda meta: (triton.cdiv(V, meta["BV"]) * N * HV,)](
        k=k, v=u, w=w, v_new=v_new, g=g, gk=gk, h=h, h0=initial_state, ht=final_state, cu_seqlens=cu_seqlens,
        chunk_offsets=chunk_offsets, T=T, H=H, HV=HV, K=K, V=V, BT=chunk_size, STATE_V_FIRST=False)
    return h, v_new, final_state


def kda_chunk_states(q, k, v, g, beta, initial_state, cu_seqlens, scale=None, **gate):
    """kda() over varlen sequences (T > N) that also returns the fp32 state at the start of every chunk of
    CHUNK tokens: (o, ht, chunks [NT, H, K, V] fp32, CHUNK), chunk j of sequence i at row
    sum_{i' < i} ceil(len_i' / CHUNK) + j (the state after CHUNK * j of its tokens; row 0 of a sequence is
    its initial state). fla's return_intermediate_states gives these states in bf16; run_recurrence needs
    them exact (checkpoints), so fla's state kernel runs here with an fp32 h (_fwd_h_fp32), swapped into fla's
    chunk_fwd module for this call (one engine thread runs the model; not safe beside another thread's fla
    call). The fp32 states take twice fla's bf16 ones, transiently: 268 MB a Kimi layer at 8k tokens, TP1."""
    import fla.ops.kda.chunk_fwd as kda_fwd
    extra = _gate_args(**gate)
    beta = beta if gate.get("beta_logits", False) else beta.to(q.dtype)
    cu, cu_host = cu_tensors(cu_seqlens, q.device)
    fla_fwd_h, kda_fwd.chunk_gated_delta_rule_fwd_h = kda_fwd.chunk_gated_delta_rule_fwd_h, _fwd_h_fp32
    try:
        with torch.inference_mode():        # return_intermediate_states requires it (forward runs in it too)
            o, ht, h = chunk_kda(q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=initial_state.float(),
                                 output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=cu_host,
                                 return_intermediate_states=True, chunk_size=CHUNK, **extra)
    finally:
        kda_fwd.chunk_gated_delta_rule_fwd_h = fla_fwd_h
    assert h.dtype == torch.float32, "fla's chunk KDA no longer takes its state kernel from chunk_fwd"
    return o, ht.float(), h[0], CHUNK
