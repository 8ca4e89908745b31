"""MLA's long prefill (model/attention.py, MLAttention._cudnn_prefill): keys and values of every head from one
GEMM of the cached rows through the extended kv_b (kv_b_keys_values), then cuDNN. The extension is checked
exactly on the CPU against kv_b_proj and the rope columns it must copy; the attention on the GPU against the
explicit-mask fp32 reference (tests/model/test_attention_gpu.py's) on keys built the plain way."""
from __future__ import annotations

import pytest
import torch


def _layer(device, dtype, std=0.02):
    """One MLA layer with Kimi-Linear-48B's attention shapes (32 heads, nope 128, rope 64, lora 512, v 128)."""
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.model.attention import MLAttention
    from trtllm_dasc.model.spec import ModelSpec
    from trtllm_dasc.model.weights import RandomWeights
    from trtllm_dasc.plan.synthetic import KIMI_48B
    raw = dict(KIMI_48B, mlp_layer_types=["dense"] * KIMI_48B["num_hidden_layers"],
               first_k_dense_replace=KIMI_48B["num_hidden_layers"])      # dense MLPs: no expert fields needed
    cfg = HybridConfig.from_dict(raw)
    spec = ModelSpec.from_config(cfg)
    layer = next(i for i, t in enumerate(cfg.layer_types) if t != "linear_attention")
    return MLAttention.load(RandomWeights(seed=1, std=std, device=device), f"model.layers.{layer}.", spec,
                            dtype, device), spec


def test_extended_kv_b_gives_keys_and_values_exactly():
    mla, s = _layer("cpu", torch.float64, std=0.5)
    nope, rope, lora, vd, H = s.qk_nope_head_dim, s.qk_rope_head_dim, s.kv_lora_rank, s.v_head_dim, mla.H
    rows = torch.randn(9, lora + rope, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    got = (rows @ mla.kv_b_keys_values.T).view(9, H, nope + rope + vd)
    kvx = (rows[:, :lora] @ mla.w["kv_b_proj"].T).view(9, H, nope + vd)
    torch.testing.assert_close(got[..., :nope], kvx[..., :nope], rtol=1e-12, atol=1e-12)
    assert torch.equal(got[..., nope:nope + rope], rows[:, None, lora:].expand(9, H, rope))   # copied, exactly
    torch.testing.assert_close(got[..., nope + rope:], kvx[..., nope:], rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("T", [4096 + 37, 5120], ids=["padded", "whole-bucket"])
def test_cudnn_prefill_matches_masked_math(T):
    from test_attention_gpu import _reference
    mla, s = _layer("cuda", torch.bfloat16)
    nope, rope, lora, vd, H = s.qk_nope_head_dim, s.qk_rope_head_dim, s.kv_lora_rank, s.v_head_dim, mla.H
    g = torch.Generator(device="cuda").manual_seed(T)
    q = torch.randn(T, H, nope + rope, device="cuda", generator=g).bfloat16()
    cached = torch.randn(T, lora + rope, device="cuda", generator=g).bfloat16()
    out = mla._cudnn_prefill(q, cached)
    kvx = (cached[:, :lora] @ mla.w["kv_b_proj"].T).view(T, H, nope + vd)
    k = torch.cat([kvx[..., :nope], cached[:, None, lora:].expand(T, H, rope)], dim=-1)
    ref = _reference(q, k, kvx[..., nope:], 0)
    assert out.shape == (T, H, vd)
    # bf16 against fp32: the relative RMS error over all rows (an absolute tolerance the size of the
    # outputs would check little), as tests/model/test_attention_gpu.py measures it
    err = ((out.float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
    assert err < 2e-2, f"relative RMS error {err:.2e}"
    # the graphs of every bucket up to 5120 tokens are built through the same path
    assert mla.warm_long_prefill(5120) == 2 and mla.warm_long_prefill(4095) == 0


def test_long_prefill_lengths_are_the_buckets_a_prefill_can_reach():
    # both warm-ups (attention.warm_long_prefill, MLAttention.warm_long_prefill) build graphs for these
    from trtllm_dasc.model.attention import CUDNN_BUCKET, CUDNN_MIN_TOKENS, long_prefill_lengths
    assert list(long_prefill_lengths(CUDNN_MIN_TOKENS + 1, "cuda", torch.bfloat16)) == \
        [CUDNN_MIN_TOKENS, CUDNN_MIN_TOKENS + CUDNN_BUCKET]
    assert list(long_prefill_lengths(CUDNN_MIN_TOKENS, "cuda", torch.float16)) == [CUDNN_MIN_TOKENS]
    for max_tokens, device, dtype in ((CUDNN_MIN_TOKENS - 1, "cuda", torch.bfloat16),
                                      (8192, "cuda", torch.float32), (8192, "cpu", torch.bfloat16)):
        assert not long_prefill_lengths(max_tokens, device, dtype)
