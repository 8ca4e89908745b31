"""The full-attention core on the GPU against an explicit-mask fp32 math reference.

`_attend` keeps cuDNN out of SDPA (a per-shape graph build; see model/attention.py) except for long
prefills from position 0, whose length it pads up to a bucket for cuDNN, and gives a prefix hit (start > 0)
a lower-right causal bias instead of a [T, S] mask; all must leave the result unchanged: GQA and MLA-like
head dims (v padded), bf16 and fp32, new and continued sequences, padded and unpadded long ones.
"""
from __future__ import annotations

import pytest
import torch

from trtllm_dasc.model.attention import _attend, keep_cudnn_out_of_sdpa

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


def _reference(q, k, v, start):
    """fp32, heads repeated for GQA, the causal mask written out: query i sees keys 0..start + i."""
    T, S = q.shape[0], k.shape[0]
    rep = q.shape[1] // k.shape[1]
    q, k, v = q.float(), k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    scores = torch.einsum("thd,shd->hts", q, k) / q.shape[-1] ** 0.5
    mask = torch.arange(S, device=q.device)[None, :] <= (start + torch.arange(T, device=q.device))[:, None]
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v)


@pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, 2e-2), (torch.float32, 1e-4)])
@pytest.mark.parametrize("H, Hk, E, Ev", [(16, 2, 256, 256), (32, 32, 192, 128)])   # qwen3_next GQA; Kimi MLA
@pytest.mark.parametrize("T, start", [(37, 0), (1, 300), (29, 1000), (300, 17), (4096 + 37, 0), (5120, 0)])
def test_attend_matches_masked_math(dtype, tol, H, Hk, E, Ev, T, start):
    g = torch.Generator(device="cuda").manual_seed(T + start)
    S = start + T
    q = torch.randn(T, H, E, device="cuda", generator=g).to(dtype)
    k = torch.randn(S, Hk, E, device="cuda", generator=g).to(dtype)
    v = torch.randn(S, Hk, Ev, device="cuda", generator=g).to(dtype)
    keep_cudnn_out_of_sdpa("cuda")            # as loading a layer onto the GPU does
    out = _attend(q, k, v, start)
    assert not torch.backends.cuda.cudnn_sdp_enabled()      # the long prefill's cuDNN stays inside its call
    ref = _reference(q, k, v, start)
    assert out.shape == (T, H, Ev)
    err = ((out.float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
    assert err < tol, f"relative RMS error {err:.2e}"


def test_long_prefill_warmup_builds_every_bucket():
    from trtllm_dasc.model.attention import CUDNN_BUCKET, CUDNN_MIN_TOKENS, warm_long_prefill
    shapes = {(4, 2, 64, 64), (4, 4, 96, 64)}
    assert warm_long_prefill(shapes, CUDNN_MIN_TOKENS - 1, "cuda", torch.bfloat16) == 0
    assert warm_long_prefill(shapes, 2 * CUDNN_MIN_TOKENS, "cuda", torch.float32) == 0     # no cuDNN in fp32
    # 4096 + 1 tokens pad to the 5120 bucket: 4096 and 5120 for each shape
    assert warm_long_prefill(shapes, CUDNN_MIN_TOKENS + 1, "cuda", torch.bfloat16) == 4
    assert CUDNN_MIN_TOKENS % CUDNN_BUCKET == 0
