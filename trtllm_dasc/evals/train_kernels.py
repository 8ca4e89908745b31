"""Which recurrence kernel trains the GDN quality model on a GPU.

fla refuses GDN's gated backward (`chunk_bwd_dqkwg` with a scalar gate) on Hopper with Triton 3.4 to 3.7.0:
it gives wrong results there (fla issue #640), and fla's only offered way around is TileLang. KDA's
backward does not use that kernel and trains fine. GDN is KDA with one decay per head instead of one per
key channel, so GDN's recurrence is `chunk_kda` with the head's log-decay repeated over the K channels
(and the query/key heads repeated to the value heads, as transformers' torch path does). Before use, the
adapter is checked against transformers' torch chunked recurrence (outputs and gradients) on random
inputs; if it disagrees, GDN trains through that torch recurrence instead (exact, about 3x slower).
"""
from __future__ import annotations

from collections.abc import Callable


def gdn_through_kda(kda_fn: Callable) -> Callable:
    """A function with the signature of transformers' `torch_chunk_gated_delta_rule` that runs ``kda_fn``
    (fla's `chunk_kda`, or any function with its signature) with the per-head decay on every key channel."""
    def chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None,
                               output_final_state=False, use_qk_l2norm_in_kernel=False, **_):
        rep = value.shape[2] // key.shape[2]
        if rep > 1:                      # GVA: every value head reads its key head's q/k
            query = query.repeat_interleave(rep, dim=2)
            key = key.repeat_interleave(rep, dim=2)
        gk = g.float().unsqueeze(-1).expand(*g.shape, key.shape[-1]).contiguous()
        return kda_fn(query, key, value, g=gk, beta=beta, initial_state=initial_state,
                      output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    return chunk_gated_delta_rule


def max_relative_error(fn, ref, device: str, heads=(2, 4), head_dim: int = 48, length: int = 192,
                       seed: int = 0) -> float:
    """Largest relative error of ``fn`` against ``ref`` over the output and the gradients of q, k, v, g,
    beta, on random GDN-shaped inputs (GVA: ``heads`` = (key heads, value heads))."""
    import torch
    import torch.nn.functional as F
    gen = torch.Generator(device="cpu").manual_seed(seed)
    hk, hv = heads

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device)
    base = dict(query=rand(2, length, hk, head_dim), key=rand(2, length, hk, head_dim),
                value=rand(2, length, hv, head_dim), g=-F.softplus(rand(2, length, hv)) * 0.5,
                beta=torch.sigmoid(rand(2, length, hv)))
    grad_out = rand(2, length, hv, head_dim)
    results = []
    for f in (fn, ref):
        x = {k: v.clone().requires_grad_(True) for k, v in base.items()}
        out, _ = f(**x, use_qk_l2norm_in_kernel=True)
        (out.float() * grad_out).sum().backward()
        results.append([out.detach().float()] + [x[k].grad.float() for k in base])
    return max(float((a - b).norm() / b.norm().clamp_min(1e-12)) for a, b in zip(*results))


def choose_gdn_recurrence(device: str, log=print, tolerance: float = 2e-2) -> str:
    """Patch transformers' Qwen3-Next so GDN trains correctly on this device; returns which kernel:
    'fla' (fla's own, where its backward is right), 'fla-kda' (the adapter above), 'torch'."""
    if not device.startswith("cuda"):
        return "torch" if not _fla_available() else "fla"
    try:
        from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1
    except ImportError:
        return "torch"
    if not (IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1):
        return "fla"
    from fla.ops.kda import chunk_kda
    from transformers.models.qwen3_next import modeling_qwen3_next as m
    torch_ref = getattr(m.torch_chunk_gated_delta_rule, "__wrapped__", m.torch_chunk_gated_delta_rule)
    adapter = gdn_through_kda(chunk_kda)
    try:
        err = max_relative_error(adapter, torch_ref, device)
    except Exception as e:           # a kernel that does not build for these shapes: use the exact path
        err, why = float("inf"), f"{type(e).__name__}: {e}"
    else:
        why = f"max relative error {err:.2e} against the torch recurrence"
    if err <= tolerance:
        m.torch_chunk_gated_delta_rule = adapter
        log(f"[train] GDN: fla's gated backward is wrong on Hopper with this Triton (fla #640); training through "
            f"fla's chunk_kda with the head decay on every channel ({why})")
        return "fla-kda"
    m.torch_chunk_gated_delta_rule = torch_ref
    log(f"[train] GDN: fla's gated backward is wrong here (fla #640) and the chunk_kda route failed its check "
        f"({why}); training through transformers' torch chunked recurrence")
    return "torch"


def _fla_available() -> bool:
    try:
        import fla  # noqa: F401
    except ImportError:
        return False
    return True
