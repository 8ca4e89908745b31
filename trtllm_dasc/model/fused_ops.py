"""fla's fused kernels for the work around the recurrence (GPU only): the short conv and the gated norm;
and for the rest of a layer: the residual add with the next RMSNorm, and SwiGLU's activation. Where a kernel
of ours does better it takes over (the prefill's conv: kernels/conv.py; SwiGLU: kernels/swiglu.py).

The fused mixer path (linear_attn.py, taken when the recurrence backend says `fused_mixer`) calls these in
place of ops.causal_conv and ops.gated_rms_norm, which stay the torch references with the same signatures
and results to bf16 rounding (tests/model/test_fla_gpu.py compares the whole model against the torch
backend). Why: the reference conv builds a padded copy of the batch and runs cuDNN's depthwise conv over
it, and the reference norm makes several fp32 passes; here each is one Triton kernel reading the bf16 input
once. Gate and beta's sigmoid go inside fla's chunk kernels (recurrence/fla.py); q/k's l2norm too, except
in a prefill, where our conv kernel takes it.
"""
from __future__ import annotations

import torch

from trtllm_dasc.model.recurrence.fla import cu_tensors

try:  # fla-core is optional: the CPU machine never takes this path
    from fla.modules.causal_conv1d import causal_conv1d, causal_conv1d_update
    from fla.modules.norm.fused_norm_gate import rms_norm_gated
    from fla.modules.norm.layernorm import rms_norm as fla_rms_norm
    from fla.modules.activations import swiglu as fla_swiglu
except Exception:  # noqa: BLE001 - recurrence/fla.py reports why fla is unavailable
    causal_conv1d = causal_conv1d_update = rms_norm_gated = fla_rms_norm = fla_swiglu = None


# From this many tokens the prefill's conv runs once per part of `split` (q, k, v), each into its own
# contiguous output: column slices of one output reach the chunk kernels as strided q / k / v, which they
# copy. On the H200 at 16k tokens that took the KDA mixer from 5.04 to 4.62 ms per layer (fla's own layer,
# whose convs are separate: 5.2). At 4k a forward is bound by the host's launches and each conv call adds
# fla's Python dispatch and a final-state kernel: the split run measured 2.20 ms per KDA layer at 4k against
# 1.41 unsplit, though on another host, so the threshold is a judgement that wants a same-host comparison:
# `python -m benchmarks model_prefill --arch kda --tokens 4096 16384` with SPLIT_MIN_TOKENS on either side.
SPLIT_MIN_TOKENS = 8192


def short_conv(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, cu_seqlens: list[int],
               cuts: list[list[int]] | None = None, split: list[int] | None = None):
    """ops.causal_conv on fla's varlen Triton kernel: depthwise causal conv + SiLU from a carried state.

    x [T, C] (may be a column slice); weight [C, W]; conv_state [N, C, W-1]. Returns y [T, C], the new
    state [N, C, W-1] and the states at the cuts [sum(len(cuts_i)), C, W-1] in (sequence, cut) order, all
    as ops.causal_conv returns them. split: channel counts summing to C; y is then a tuple of [T, c_i]
    tensors: from T >= SPLIT_MIN_TOKENS each contiguous (one conv per part), below that column views of
    one output (see SPLIT_MIN_TOKENS).
    """
    T, C = x.shape
    N, W1 = conv_state.shape[0], weight.shape[1] - 1
    # fla keeps W inputs per sequence ([N, C, W], newest last) and never reads the oldest in a prefill
    init = conv_state.new_zeros(N, C, W1 + 1)
    init[:, :, 1:] = conv_state
    if T == N and not any(cuts or []):
        # a decode step: fla's one-token update (shifts the window in place, newest last), no varlen setup
        y, final = causal_conv1d_update(x, init, weight=weight, activation="silu")
        return ((y if split is None else torch.split(y, split, dim=-1)), final[:, :, 1:].to(conv_state.dtype),
                _captures(x, conv_state, cu_seqlens, None))
    cu, cu_host = cu_tensors(cu_seqlens, x.device)
    by_part = split is not None and T >= SPLIT_MIN_TOKENS
    bounds = [0]
    for c in split if by_part else [C]:
        bounds.append(bounds[-1] + c)
    ys, finals = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        part_init = init if (a, b) == (0, C) else init[:, a:b].contiguous()    # fla reads it as dense [N, c, W]
        y, final = causal_conv1d(x[None, :, a:b], weight=weight[a:b], initial_state=part_init,
                                 output_final_state=True, activation="silu", cu_seqlens=cu, cu_seqlens_cpu=cu_host)
        ys.append(y[0])
        finals.append(final)
    final = finals[0] if len(finals) == 1 else torch.cat(finals, dim=1)
    new_state = final[:, :, 1:].to(conv_state.dtype)
    y = ys[0] if split is None else tuple(ys) if by_part else torch.split(ys[0], split, dim=-1)
    return y, new_state, _captures(x, conv_state, cu_seqlens, cuts)


def prefill_conv(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, cu_seqlens: list[int],
                 cuts: list[list[int]] | None, parts: list[int], head_dim: int):
    """A prefill's conv in our kernels (model/kernels/conv.py): (parts, new state, captures) as
    short_conv returns them with split=parts, each part contiguous, and the first two (q and k)
    l2-normalised per head_dim channels: the recurrence must not normalise them again. The caller checks
    conv_kernel.supports(parts, head_dim, W)."""
    # lazy: triton loads only when a kernel runs (the torch reference needs none)
    from trtllm_dasc.model.kernels.conv import conv_parts
    ys, new_state = conv_parts(x, weight, conv_state, cu_seqlens, parts, 2, head_dim)
    return ys, new_state, _captures(x, conv_state, cu_seqlens, cuts)


def _captures(x, conv_state, cu_seqlens, cuts) -> torch.Tensor:
    """The conv states at the checkpoint cuts, [sum(len(cuts_i)), C, W-1] in (sequence, cut) order (empty
    without cuts), from the inputs and the carried state (_windows)."""
    rows = [i for i, c in enumerate(cuts or []) for _ in c]
    if not rows:
        return conv_state.new_zeros(0, *conv_state.shape[1:])
    return _windows(x, conv_state, cu_seqlens, rows, [p for c in cuts for p in c])


def _windows(x, conv_state, cu_seqlens, rows, ends):
    """The W-1 conv inputs before token count `end` of sequence `row`, for each (row, end): from x where
    the position is inside the sequence, from the carried state before it. [n, C, W-1] in the state dtype."""
    W1 = conv_state.shape[2]
    offs = torch.arange(W1)
    pos = torch.tensor(ends)[:, None] - W1 + offs[None, :]          # [n, W-1] positions within the sequence
    r = torch.tensor(rows)
    starts = torch.tensor(cu_seqlens)[r]
    dev = x.device
    from_x = x[(starts[:, None] + pos).clamp(min=0).to(dev)]          # [n, W-1, C]
    from_state = conv_state[r.to(dev)[:, None], :, (pos + W1).clamp(0, W1 - 1).to(dev)]   # [n, W-1, C]
    inside = (pos >= 0).to(dev)[:, :, None]
    return torch.where(inside, from_x.to(conv_state.dtype), from_state).transpose(1, 2).contiguous()


# fla's row-tiled norm kernels (rows of at most 512 values) autotune once per bucket of their row count:
# their autotune key holds NB = cdiv(rows, 2048) (layernorm.py) or cdiv(rows, 65536) (fused_norm_gate.py),
# which the kernels' bodies never read. Each new bucket tried nine configs inside the step that reached it:
# on the H200 a user's first batch of ~3k-token prompts after warm-up compiled 18 of them in ~20 s
# (`python -m benchmarks real_model`, its passes' Triton compile log). Here the same kernels are called with
# NB pinned to two buckets, steps up to PINNED_ROWS rows and above, which warm-up's decode and prefill steps
# both reach before the engine reports ready.
PINNED_ROWS = 2048


def _pinned_bucket(rows: int) -> int:
    return 1 if rows <= PINNED_ROWS else 2


def gated_norm(x: torch.Tensor, gate: torch.Tensor, w: torch.Tensor, eps: float, kind: str) -> torch.Tensor:
    """ops.gated_rms_norm in one fla kernel: RMSNorm over the last dim, weight, then silu or sigmoid gate,
    all in fp32 with one cast to x's dtype (the reference's silu kind rounds once more, to bf16, before the
    gate: a bf16 ulp apart). fla's rms_norm_gated with its autotune bucket pinned (PINNED_ROWS)."""
    activation = "swish" if kind == "silu" else "sigmoid"
    D = x.shape[-1]
    if D > 512:
        return rms_norm_gated(x, gate, w, None, activation=activation, eps=eps)     # the row kernel: no bucket
    import triton
    from fla.modules.norm.fused_norm_gate import layer_norm_gated_fwd_kernel
    x2, g2 = x.reshape(-1, D).contiguous(), gate.reshape(-1, D).contiguous()
    T = x2.shape[0]
    y = torch.empty_like(x2)
    rstd = torch.empty(T, dtype=torch.float, device=x.device)
    layer_norm_gated_fwd_kernel[lambda meta: (triton.cdiv(T, meta["BT"]),)](
        x=x2, g=g2, y=y, w=w.contiguous(), b=None, residual=None, residual_out=None, mean=None, rstd=rstd, eps=eps,
        T=T, D=D, BD=triton.next_power_of_2(D), NB=_pinned_bucket(T), ACTIVATION=activation, IS_RMS_NORM=True)
    return y.view(x.shape)


def _rms_norm_rows(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """fla's rms_norm of x [T, D] (no residual) with its autotune bucket pinned (PINNED_ROWS)."""
    D = x.shape[-1]
    if D > 512:
        return fla_rms_norm(x, w, None, eps=eps)                                   # the row kernel: no bucket
    import triton
    from fla.modules.norm.layernorm import layer_norm_fwd_kernel
    x2 = x.reshape(-1, D).contiguous()
    T = x2.shape[0]
    y = torch.empty_like(x2)
    rstd = torch.empty(T, dtype=torch.float, device=x.device)
    layer_norm_fwd_kernel[lambda meta: (triton.cdiv(T, meta["BT"]),)](
        x=x2, y=y, w=w.contiguous(), b=None, res=None, res_out=None, mean=None, rstd=rstd, eps=eps, T=T, G=1, D=D,
        BD=triton.next_power_of_2(D), NB=_pinned_bucket(T), IS_RMS_NORM=True, HAS_RESIDUAL=False,
        STORE_RESIDUAL_OUT=False, HAS_WEIGHT=True, HAS_BIAS=False)
    return y.view(x.shape)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float):
    """(RMSNorm(x + delta) * w, x + delta) in one fla kernel: the residual add and the next layer's norm,
    which in torch are two passes over the hidden states plus the norm's five (ops.rms_norm). The sum is
    rounded to x's dtype like the reference's add, the norm is taken of the fp32 sum and rounded once.
    w: the effective fp32 weight (model.py folds qwen3_next's 1 + w in). delta None: the norm alone."""
    if delta is None:
        return _rms_norm_rows(x, w, eps), x
    return fla_rms_norm(delta, w, None, residual=x, eps=eps, prenorm=True)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in one kernel of ours (model/kernels/swiglu.py; fp32 inside, one rounding: torch
    rounds silu's output first); fla's kernel for shapes ours does not take."""
    if gate.dim() == 2 and gate.stride(1) == up.stride(1) == 1 and gate.shape == up.shape:
        # lazy: triton loads only when a kernel runs (the torch reference needs none)
        from trtllm_dasc.model.kernels.swiglu import swiglu as tiled_swiglu
        return tiled_swiglu(gate, up)
    return fla_swiglu(gate, up)
