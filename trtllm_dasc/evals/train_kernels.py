"""Which kernels train the quality models on a GPU: GDN's recurrence, and both models' short convolution.

fla refuses GDN's gated backward (`chunk_bwd_dqkwg` with a scalar gate) on Hopper with Triton 3.4 to 3.7.0:
it gives wrong results there (fla issue #640), and fla's only offered way around is TileLang. KDA's
backward does not use that kernel and trains fine. GDN is KDA with one decay per head instead of one per
key channel, so GDN's recurrence is `chunk_kda` with the head's log-decay repeated over the K channels
(and the query/key heads repeated to the value heads, as transformers' torch path does). Before use, the
adapter is checked against transformers' torch chunked recurrence (outputs and gradients) on random
inputs of the training's shapes and dtypes (bf16 q/k/v/beta as autocast gives them, fp32 decay: Triton
compiles per dtype, and #640 is a miscompile of that kind; the reference runs in fp32 on the same
bf16-rounded inputs); if it disagrees, GDN trains through that torch recurrence instead (exact, slower).

The short convolution (kernel 4, one filter per channel, before the q/k/v of every linear-attention layer):
transformers calls Tri Dao's `causal_conv1d` package where it is installed and otherwise a depthwise
`F.conv1d` (its log says "falling back to its reference PyTorch implementation ... much slower"). The
package is not installable here; fla ships a Triton causal convolution with its own backward, which
`choose_conv` puts in transformers' place after the same kind of check against the torch fallback.
"""
from __future__ import annotations

from collections.abc import Callable


def gdn_through_kda(kda_fn: Callable) -> Callable:
    """A function with the signature of transformers' `torch_chunk_gated_delta_rule` that runs ``kda_fn``
    (fla's `chunk_kda`, or any function with its signature) with the per-head decay on every key channel."""
    def chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None,
                               output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None, **_):
        # packed sequences go through as they are (chunk_kda keeps them apart); the torch stand-in of the
        # tests has no such argument, so it is passed only when there is one
        extra = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        rep = value.shape[2] // key.shape[2]
        if rep > 1:                      # GVA: every value head reads its key head's q/k
            query = query.repeat_interleave(rep, dim=2)
            key = key.repeat_interleave(rep, dim=2)
        gk = g.float().unsqueeze(-1).expand(*g.shape, key.shape[-1]).contiguous()
        return kda_fn(query, key, value, g=gk, beta=beta, initial_state=initial_state,
                      output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                      **extra)
    return chunk_gated_delta_rule


def max_relative_error(fn, ref, device: str, heads=(2, 4), head_dim: int = 48, length: int = 192,
                       seed: int = 0, dtype=None) -> float:
    """Largest relative error of ``fn`` against ``ref`` over the output and the gradients of q, k, v, g,
    beta, on random GDN-shaped inputs (GVA: ``heads`` = (key heads, value heads)). With ``dtype`` (e.g.
    bf16) ``fn`` gets q/k/v/beta in that dtype and ``ref`` the same values in fp32."""
    import torch
    import torch.nn.functional as F
    gen = torch.Generator(device="cpu").manual_seed(seed)
    hk, hv = heads

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device)
    base = dict(query=rand(2, length, hk, head_dim), key=rand(2, length, hk, head_dim),
                value=rand(2, length, hv, head_dim), g=-F.softplus(rand(2, length, hv)) * 0.5,
                beta=torch.sigmoid(rand(2, length, hv)))
    return _error_with_grads(fn, ref, base, rand(2, length, hv, head_dim), dtype, keep_fp32={"g"},
                             call=lambda f, x: f(**x, use_qk_l2norm_in_kernel=True)[0])


def _error_with_grads(fn, ref, base: dict, grad_out, dtype, keep_fp32: set, call) -> float:
    """Largest relative error of ``call(fn, inputs)`` against ``call(ref, inputs)`` over the output and the
    gradients of every input in ``base``. With ``dtype``, the inputs not in ``keep_fp32`` are rounded to it
    once; ``fn`` gets them in that dtype, ``ref`` the same values in fp32."""
    if dtype is not None:                # round once: both sides see the same values
        base = {k: (v if k in keep_fp32 else v.to(dtype).float()) for k, v in base.items()}
    results = []
    for f, cast in ((fn, dtype), (ref, None)):
        x = {k: (v if cast is None or k in keep_fp32 else v.to(cast)).clone().requires_grad_(True)
             for k, v in base.items()}
        out = call(f, x)
        (out.float() * grad_out).sum().backward()
        results.append([out.detach().float()] + [x[k].grad.float() for k in base])
    return max(float((a - b).norm() / b.norm().clamp_min(1e-12)) for a, b in zip(*results))


# transformers' own torch recurrence, kept before any patch (a second call must not take the adapter as
# its reference)
_TORCH_GDN = None


def choose_gdn_recurrence(device: str, log=print, heads=(2, 4), head_dim: int = 48,
                          tolerance: float = 5e-2) -> str:
    """Patch transformers' Qwen3-Next so GDN trains correctly on this device; returns which kernel:
    'fla' (fla's own, where its backward is right), 'fla-kda' (the adapter above), 'torch'. ``heads``
    (key heads, value heads) and ``head_dim`` are the model's: the check compiles the kernels training
    will use. The tolerance is bf16's (a #640-type fault gives errors of order one)."""
    global _TORCH_GDN
    if not device.startswith("cuda"):
        return "torch"                   # fla's kernels are CUDA only: transformers' torch path runs
    try:
        from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1
    except ImportError:
        return "torch"
    if not (IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1):
        return "fla"
    import torch
    from fla.ops.kda import chunk_kda
    from transformers.models.qwen3_next import modeling_qwen3_next as m
    if _TORCH_GDN is None:
        _TORCH_GDN = getattr(m.torch_chunk_gated_delta_rule, "__wrapped__", m.torch_chunk_gated_delta_rule)
    torch_ref = _TORCH_GDN
    adapter = gdn_through_kda(chunk_kda)
    try:
        err = max_relative_error(adapter, torch_ref, device, heads=heads, head_dim=head_dim, dtype=torch.bfloat16)
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



def conv_through_fla(conv_fn: Callable) -> Callable:
    """A function with the signature of transformers' `causal_conv1d_fn` (x [B, C, T], weight [C, K]) that
    runs ``conv_fn`` (fla's `causal_conv1d`, x [B, T, C], returning (y, final state)). transformers builds
    x as the transpose of a [B, T, C] projection, so both transposes here are views, not copies. What fla
    would silently do differently is refused: an activation other than SiLU (fla applies none), and packed
    sequences (the training passes none; fla would need them as its own cu_seqlens)."""
    def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
        if activation not in (None, "silu", "swish"):
            raise ValueError(f"fla's causal_conv1d applies only SiLU, not {activation!r}")
        packed = [k for k in ("cu_seqlens", "cu_seq_lens_q", "seq_idx") if kwargs.get(k) is not None]
        if packed:
            raise ValueError(f"packed sequences ({', '.join(packed)}) are not passed on to fla's causal_conv1d")
        y, _ = conv_fn(hidden_states.transpose(1, 2), weight=weight, bias=bias, activation=activation)
        return y.transpose(1, 2)
    return causal_conv1d_fn


def conv_max_relative_error(fn, ref, device: str, channels: int = 96, length: int = 192, seed: int = 0,
                            dtype=None, batch: int = 2) -> float:
    """Largest relative error of ``fn`` against ``ref`` (both with transformers' causal_conv1d_fn signature,
    SiLU activation) over the output and the gradients of x and the weight. With ``dtype`` ``fn`` gets x
    in that dtype (as autocast gives it) and ``ref`` the same values in fp32; the weight is fp32 for both."""
    import torch
    gen = torch.Generator(device="cpu").manual_seed(seed)
    # x as transformers holds it: [B, T, C] in memory, passed as its [B, C, T] transpose
    base = dict(x=torch.randn(batch, length, channels, generator=gen).to(device),
                weight=(torch.randn(channels, 4, generator=gen) * 0.5).to(device))
    grad_out = torch.randn(batch, channels, length, generator=gen).to(device)
    return _error_with_grads(fn, ref, base, grad_out, dtype, keep_fp32={"weight"},
                             call=lambda f, x: f(x["x"].transpose(1, 2), weight=x["weight"], bias=None,
                                                 activation="silu"))


# transformers' own torch convolutions, kept before any patch (a second call must not take the adapter as
# its reference)
_TORCH_CONV: dict = {}


def _transformers_conv_modules():
    from transformers.models.kimi_linear import modeling_kimi_linear
    from transformers.models.qwen3_next import modeling_qwen3_next
    return modeling_kimi_linear, modeling_qwen3_next


def choose_conv(device: str, log=print, channels: int = 96, mode: str = "auto", tolerance: float = 5e-2) -> str:
    """Patch transformers' Kimi-Linear and Qwen3-Next short convolution for this run; returns which one
    trains: 'fla' (fla's Triton causal_conv1d through `conv_through_fla`, where it passes the check) or
    'torch' (transformers' fallback: on the CPU, with mode 'torch', without fla, or when the check fails).
    ``channels`` is a linear-attention layer's conv width, and the check runs a 4k-token batch of the large
    preset's shape: fla autotunes its kernel per width on the first call, so the check's shape is the one the
    tuning sees. The patch holds for the rest of the process (a training run's)."""
    modules = _transformers_conv_modules()
    for m in modules:
        _TORCH_CONV.setdefault(m.__name__, m.causal_conv1d_fn)

    def use(fn_by_module) -> None:
        for m in modules:
            m.causal_conv1d_fn = fn_by_module(m)
    use(lambda m: _TORCH_CONV[m.__name__])
    if mode == "torch" or not device.startswith("cuda"):
        return "torch"
    try:
        from fla.modules.causal_conv1d import causal_conv1d
    except ImportError:
        log("[train] short convolution: fla is not installed; transformers' torch fallback trains")
        return "torch"
    import torch
    adapter = conv_through_fla(causal_conv1d)
    ref = _TORCH_CONV[modules[0].__name__]
    try:
        err = conv_max_relative_error(adapter, getattr(ref, "__wrapped__", ref), device, channels=channels,
                                      length=4096, batch=16, dtype=torch.bfloat16)
    except Exception as e:               # a kernel that does not build here: keep the torch path
        err, why = float("inf"), f"{type(e).__name__}: {e}"
    else:
        why = f"max relative error {err:.2e} against transformers' torch convolution"
    if err <= tolerance:
        use(lambda m: adapter)
        log(f"[train] short convolution: fla's Triton causal_conv1d ({why})")
        return "fla"
    log(f"[train] short convolution: fla's causal_conv1d failed its check ({why}); transformers' torch "
        f"fallback trains")
    return "torch"
