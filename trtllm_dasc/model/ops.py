"""Small tensor ops shared by the layers: norms, RoPE, the short causal conv with carried state.

Tokens of a batch are flattened (fla's varlen layout): x is [T, ...] with sequence i occupying rows
cu_seqlens[i]:cu_seqlens[i+1]. Dtype handling mirrors transformers' modules so FP32 runs match them to
rounding and BF16 runs round at the same places.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _one_row_gemv(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor | None:
    """x [..., K] of one row on a GPU times w [N, K] by kernels/gemv.py where it beat cuBLAS for this shape
    (`preferred`) and takes the operands; None otherwise (the caller runs F.linear)."""
    if not (x.is_cuda and x.numel() == x.shape[-1] and w.dim() == 2):
        return None
    # lazy: triton loads only when a kernel runs (the torch reference needs none)
    from trtllm_dasc.model.kernels import gemv as gemv_kernel
    x2 = x.reshape(1, -1)
    if not (gemv_kernel.preferred(1, w.shape[0], w.shape[1]) and gemv_kernel.supports(x2, w)):
        return None
    return gemv_kernel.gemv(x2, w, out_dtype=out_dtype).view(*x.shape[:-1], w.shape[0])


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, except a one-row product on a GPU of a shape where our kernel beat cuBLAS
    (model/kernels/gemv.py: a decode step at batch 1). Operands of two dtypes go to F.linear (which refuses
    them, as everywhere else): the kernel's upcast of x is linear_fp32's."""
    y = _one_row_gemv(x, w, x.dtype) if b is None and w.dtype == x.dtype else None
    return F.linear(x, w, b) if y is None else y


def linear_fp32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F.linear(x.float(), w) for an fp32 w (a router's logits, as transformers computes them). A one-row
    product on a GPU takes kernels/gemv.py with x upcast inside it (exact): no separate upcast kernel, which
    at a Kimi decode step was one launch per MoE layer."""
    y = _one_row_gemv(x, w, torch.float32) if w.dtype == torch.float32 else None
    return F.linear(x.float(), w) if y is None else y


def linear_groups(x: torch.Tensor, w: torch.Tensor, groups: int) -> tuple[torch.Tensor, ...]:
    """Several products of one step: x [T, groups * K] holds the inputs side by side, w [groups * N, K] the
    weights stacked; returns the groups' outputs x[:, g*K:(g+1)*K] @ w_g.T, each [T, N]. A one-row product
    on a GPU is one gemv_kernel launch for all of them (Kimi's f_b and g_b at a decode step: two 1 MB
    products, each bound by its launch, not its bytes); otherwise one F.linear per group."""
    if x.is_cuda and x.dim() == 2 and x.shape[0] == 1:
        from trtllm_dasc.model.kernels import gemv as gemv_kernel
        if gemv_kernel.supports(x, w, groups):
            return gemv_kernel.gemv(x, w, groups=groups).chunk(groups, dim=-1)
    return tuple(F.linear(a, b) for a, b in zip(x.chunk(groups, dim=-1), w.chunk(groups, dim=0)))


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, offset: bool) -> torch.Tensor:
    """RMSNorm over the last dim. offset=True: qwen3_next's (1 + w) in fp32; False: kimi's w * x.to(dtype)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (xf * (1.0 + w.float())).type_as(x)
    return w * xf.to(x.dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, w: torch.Tensor, eps: float, kind: str) -> torch.Tensor:
    """Norm then gate, per head. kind 'silu' (qwen3_next GDN) or 'sigmoid' (kimi KDA, all in fp32)."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if kind == "silu":
        return ((w * xf.to(dtype)) * F.silu(gate.float())).to(dtype)
    return (w.float() * xf * torch.sigmoid(gate.float())).to(dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """fla's l2norm: x / sqrt(sum(x^2) + eps), in the input dtype (callers pass fp32)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, rotary_dim] for absolute positions [T] (the default, unscaled RoPE)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float, device=positions.device) / rotary_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; rotates the first cos.shape[-1] channels (rotate-half convention), passes the rest."""
    rd = cos.shape[-1]
    if rd == 0:
        return x
    x_rot, x_pass = x[..., :rd], x[..., rd:]
    x1, x2 = x_rot[..., : rd // 2], x_rot[..., rd // 2:]
    rotated = torch.cat((-x2, x1), dim=-1)
    x_rot = x_rot * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat((x_rot, x_pass), dim=-1)


def token_index(cu_seqlens: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence id, position within the sequence) of every flattened token, both int64 [T]."""
    lens = torch.tensor([b - a for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:])], device=device)
    seq = torch.repeat_interleave(torch.arange(len(lens), device=device), lens)
    starts = torch.tensor(cu_seqlens[:-1], device=device)
    pos = torch.arange(cu_seqlens[-1], device=device) - starts[seq]
    return seq, pos


def causal_conv(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, cu_seqlens: list[int],
                cuts: list[list[int]] | None = None):
    """Depthwise causal conv + SiLU over varlen tokens, continuing from a carried state.

    x: [T, C] conv inputs; weight: [C, W]; conv_state: [N, C, W-1] the previous W-1 inputs of each sequence.
    cuts[i]: positions (token counts within sequence i, 1..len_i) at which to capture the conv state.
    Returns y [T, C], the new conv state [N, C, W-1], and the captured states [sum(len(cuts_i)), C, W-1]
    in (sequence, cut) order.
    """
    T, C = x.shape
    N, W1 = conv_state.shape[0], weight.shape[1] - 1
    lens = [b - a for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:])]
    tmax = max(lens)
    # one padded batch [N, W-1 + tmax, C]: the carried state, then the new tokens of each sequence
    padded = x.new_zeros(N, W1 + tmax, C)
    padded[:, :W1] = conv_state.transpose(1, 2).to(x.dtype)
    seq, pos = token_index(cu_seqlens, x.device)
    padded[seq, W1 + pos] = x
    y = F.conv1d(padded.transpose(1, 2), weight.unsqueeze(1).to(x.dtype), groups=C)   # [N, C, tmax]
    y = F.silu(y.transpose(1, 2)[seq, pos])

    def window(rows: list[int], ends: list[int]) -> torch.Tensor:
        # the W-1 inputs before token count `end` of sequence `row`: padded[row, end : end + W-1]
        idx = torch.tensor(ends, device=x.device)[:, None] + torch.arange(W1, device=x.device)[None, :]
        return padded[torch.tensor(rows, device=x.device)[:, None], idx].transpose(1, 2)

    new_state = window(list(range(N)), lens).to(conv_state.dtype)
    cuts = cuts or [[] for _ in range(N)]
    rows = [i for i, c in enumerate(cuts) for _ in c]
    ends = [p for c in cuts for p in c]
    captured = window(rows, ends).to(conv_state.dtype) if rows else conv_state.new_zeros(0, C, W1)
    return y, new_state, captured
