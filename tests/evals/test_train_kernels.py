"""GDN's recurrence through a KDA kernel (the training route where fla's GDN backward is wrong): against
transformers' torch GDN recurrence, with transformers' torch KDA recurrence standing in for fla's
chunk_kda (same signature), outputs and gradients; and the check can fail."""
from __future__ import annotations

import pytest
import torch

from trtllm_dasc.evals.train_kernels import choose_gdn_recurrence, gdn_through_kda, max_relative_error

kimi = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
qwen = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def _torch(fn):
    return getattr(fn, "__wrapped__", fn)


@pytest.mark.parametrize("heads", [(2, 4), (3, 3)])
def test_gdn_through_kda_equals_the_gdn_recurrence(heads):
    adapter = gdn_through_kda(_torch(kimi.chunk_kimi_delta_attention))
    err = max_relative_error(adapter, _torch(qwen.torch_chunk_gated_delta_rule), "cpu", heads=heads, head_dim=16,
                             length=80)
    assert err < 1e-4


def test_the_check_catches_a_wrong_decay():
    kda = _torch(kimi.chunk_kimi_delta_attention)

    def doubled_decay(query, key, value, g, beta, **kw):
        return kda(query, key, value, g=2 * g, beta=beta, **kw)
    err = max_relative_error(gdn_through_kda(doubled_decay), _torch(qwen.torch_chunk_gated_delta_rule), "cpu",
                             head_dim=16, length=80)
    assert err > 1e-2


def test_on_cpu_nothing_is_patched():
    before = qwen.torch_chunk_gated_delta_rule
    assert choose_gdn_recurrence("cpu", log=lambda m: None) in ("torch", "fla")
    assert qwen.torch_chunk_gated_delta_rule is before


def test_a_bf16_run_is_compared_with_fp32_on_the_same_rounded_inputs():
    """The check's dtype mode: the tested function gets bf16 q/k/v/beta, the reference their fp32 values;
    a bf16 torch recurrence then differs from the fp32 one by bf16 rounding only."""
    ref = _torch(qwen.torch_chunk_gated_delta_rule)

    def in_bf16(**x):
        assert x["query"].dtype == torch.bfloat16 and x["g"].dtype == torch.float32
        return ref(**x)
    err = max_relative_error(in_bf16, ref, "cpu", head_dim=16, length=80, dtype=torch.bfloat16)
    assert 0 < err < 5e-2


# --- the short convolution (choose_conv) ---------------------------------------------------------------

def _fla_signature_conv(shift: int = 0):
    """A stand-in with fla's causal_conv1d signature (x [B, T, C], weight [C, K]) written as the sum its
    docstring defines, y[t] = silu(sum_k w[:, k] x[t - K + 1 + k]), token by token: independent of the
    F.conv1d the torch fallback uses. ``shift`` > 0 reads that many tokens too early (a wrong kernel)."""
    def conv(x, weight, bias=None, activation=None, **_):
        k = weight.shape[1]
        padded = torch.nn.functional.pad(x, (0, 0, k - 1 + shift, 0))
        y = sum(weight[:, j] * padded[:, j:j + x.shape[1]] for j in range(k))
        return torch.nn.functional.silu(y), None
    return conv


def test_the_conv_adapter_equals_transformers_torch_convolution():
    from trtllm_dasc.evals.train_kernels import conv_max_relative_error, conv_through_fla
    for module in (kimi, qwen):
        err = conv_max_relative_error(conv_through_fla(_fla_signature_conv()), _torch(module.causal_conv1d_fn),
                                      "cpu", channels=24, length=50)
        assert err < 1e-5


def test_the_conv_check_catches_a_shifted_kernel():
    import inspect
    from trtllm_dasc.evals.train_kernels import choose_conv, conv_max_relative_error, conv_through_fla
    err = conv_max_relative_error(conv_through_fla(_fla_signature_conv(shift=1)), _torch(kimi.causal_conv1d_fn),
                                  "cpu", channels=24, length=50)
    assert err > inspect.signature(choose_conv).parameters["tolerance"].default     # what choose_conv refuses


def test_the_conv_adapter_refuses_what_fla_would_do_differently():
    from trtllm_dasc.evals.train_kernels import conv_through_fla
    adapter = conv_through_fla(_fla_signature_conv())
    x, w = torch.randn(1, 8, 10), torch.randn(8, 4)
    with pytest.raises(ValueError, match="only SiLU"):
        adapter(x, w, activation="gelu")
    with pytest.raises(ValueError, match="packed sequences"):
        adapter(x, w, activation="silu", seq_idx=torch.zeros(1, 10, dtype=torch.int32))
    assert adapter(x, w, activation="silu", seq_idx=None).shape == x.shape    # what Qwen3-Next passes


def test_on_cpu_the_torch_convolution_trains_even_after_a_patch():
    """A process that patched the convolution (a GPU run) and then trains on the CPU gets transformers' own
    function back."""
    from trtllm_dasc.evals.train_kernels import choose_conv
    choose_conv("cpu", log=lambda m: None)
    originals = (kimi.causal_conv1d_fn, qwen.causal_conv1d_fn)
    try:
        kimi.causal_conv1d_fn = qwen.causal_conv1d_fn = "a GPU run's patch"
        assert choose_conv("cpu", log=lambda m: None) == "torch"
        assert (kimi.causal_conv1d_fn, qwen.causal_conv1d_fn) == originals
    finally:
        kimi.causal_conv1d_fn, qwen.causal_conv1d_fn = originals


@pytest.mark.parametrize("arch", ["kda", "gdn"])
def test_conv_channels_is_the_models_conv_width(arch):
    from trtllm_dasc.evals.train import TrainConfig, build_model, conv_channels
    cfg = TrainConfig(arch=arch, vocab_size=256, hidden_size=32, groups=1, heads=2, head_dim=16,
                      intermediate_size=64)
    widths = {m.conv1d.weight.shape[0] for m in build_model(cfg).modules() if hasattr(m, "conv1d")}
    assert widths == {conv_channels(cfg)}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fla's causal_conv1d is a CUDA (Triton) kernel: needs a GPU")
@pytest.mark.parametrize("arch", ["kda", "gdn"])
def test_on_a_gpu_fla_convolution_trains_the_same_model(arch):
    """The patched model's loss and gradients against the same model through transformers' fallback, in
    fp32 (the check inside choose_conv runs bf16, as training does)."""
    pytest.importorskip("fla")
    from trtllm_dasc.evals.train import TrainConfig, build_model, conv_channels, loss_fn
    from trtllm_dasc.evals.train_kernels import choose_conv
    cfg = TrainConfig(arch=arch, vocab_size=256, hidden_size=64, groups=1, heads=2, head_dim=32,
                      intermediate_size=64)
    if arch == "gdn":                    # as training does: fla's GDN backward is wrong on some Hopper setups
        choose_gdn_recurrence("cuda", log=lambda m: None, heads=(cfg.heads // 2, cfg.heads), head_dim=cfg.head_dim)
    tokens = torch.randint(1, 256, (2, 128), generator=torch.Generator().manual_seed(0)).cuda()
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, -8:] = True
    grads, tf32 = [], torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False      # cuDNN's conv in TF32 would differ from fla's fp32 by itself
    try:
        for mode in ("torch", "auto"):
            assert choose_conv("cuda", log=lambda m: None, channels=conv_channels(cfg), mode=mode) == \
                ("fla" if mode == "auto" else "torch")
            model = build_model(cfg).cuda()
            loss, _ = loss_fn(model, tokens, mask, 0.1)
            loss.backward()
            grads.append([loss.detach()] + [p.grad.detach().clone() for p in model.parameters() if p.grad is not None])
    finally:
        choose_conv("cpu", log=lambda m: None)
        torch.backends.cudnn.allow_tf32 = tf32
    assert len(grads[0]) == len(grads[1])
    for a, b in zip(*grads):
        assert float((a - b).norm() / b.norm().clamp_min(1e-12)) < 1e-3
