"""The fused mixer path's ops (model/fused_ops.py, fla's kernels) against the torch references in ops.py.

The capture windows are pure torch and run everywhere; the fla kernels need CUDA and fla-core and skip
with the reason otherwise (tests/model/test_fla_gpu.py then checks the whole fused model).
"""
from __future__ import annotations

import pytest
import torch

from trtllm_dasc.model.fused_ops import _windows
from trtllm_dasc.model.ops import causal_conv, gated_rms_norm
from trtllm_dasc.model.recurrence import fla as fla_backend

_ok, _why = fla_backend.available()
needs_fla = pytest.mark.skipif(not _ok, reason=_why)


def _batch(lens, C, W, device="cpu", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lens), C, generator=g).to(device, dtype)
    weight = torch.randn(C, W, generator=g).to(device, dtype)
    state = torch.randn(len(lens), C, W - 1, generator=g).to(device, dtype)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return x, weight, state, cu


def test_capture_windows_match_the_reference_conv():
    # cuts inside the first W-1 tokens reach back into the carried state; 1-token and long sequences
    lens, W = [1, 2, 9, 40], 4
    x, weight, state, cu = _batch(lens, 6, W)
    cuts = [[1], [1, 2], [1, 2, 3, 4, 9], [5, 17, 40]]
    _, _, ref = causal_conv(x, weight, state, cu, cuts)
    rows = [i for i, c in enumerate(cuts) for _ in c]
    got = _windows(x, state, cu, rows, [p for c in cuts for p in c])
    assert got.shape == ref.shape == (11, 6, W - 1)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


def test_capture_windows_of_a_column_slice():
    # the mixers pass a slice of a wider projection output: rows are strided
    x, weight, state, cu = _batch([7, 3], 10, 4)
    wide = torch.cat([x, torch.randn(10, 5)], dim=1)
    cuts = [[2, 7], [3]]
    _, _, ref = causal_conv(x, weight, state, cu, cuts)
    torch.testing.assert_close(_windows(wide[:, :10], state, cu, [0, 0, 1], [2, 7, 3]), ref, rtol=0, atol=0)


@pytest.mark.gpu
@needs_fla
@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("split, by_part", [(None, False), ([64, 32, 96], False), ([64, 32, 96], True)],
                         ids=["whole", "split-views", "split-by-part"])
def test_short_conv_matches_reference(W, split, by_part, monkeypatch):
    # split: the parts come back as views of one output, or (from SPLIT_MIN_TOKENS tokens, lowered here)
    # as separate contiguous outputs of one conv each, from a column slice of a wider input
    from trtllm_dasc.model import fused_ops
    from trtllm_dasc.model.fused_ops import short_conv
    if by_part:
        monkeypatch.setattr(fused_ops, "SPLIT_MIN_TOKENS", 1)
    lens = [1, 3, 300, 64]
    wide, weight, state, cu = _batch(lens, 192 + 8, W, "cuda", torch.bfloat16, seed=W)
    x, weight, state = wide[:, :192], weight[:192], state[:, :192].contiguous()
    cuts = [[1], [], [2, 64, 299, 300], [64]]
    got = list(short_conv(x, weight, state, cu, cuts, split=split))
    if split is not None:
        assert all(p.shape[1] == c and p.is_contiguous() == by_part for p, c in zip(got[0], split))
        got[0] = torch.cat(got[0], dim=1)
    ref = causal_conv(x.float(), weight.float(), state.float(), cu, cuts)
    for a, b in zip(got, ref):
        assert a.shape == b.shape
        torch.testing.assert_close(a.float(), b, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@needs_fla
@pytest.mark.parametrize("kind", ["silu", "sigmoid"])
def test_gated_norm_matches_reference(kind):
    from trtllm_dasc.model.fused_ops import gated_norm
    g = torch.Generator().manual_seed(1)
    x, gate = (torch.randn(500, 4, 128, generator=g).cuda().bfloat16() for _ in range(2))
    w = (1 + 0.1 * torch.randn(128, generator=g)).cuda().bfloat16()
    got = gated_norm(x, gate, w, 1e-6, kind)
    ref = gated_rms_norm(x.float(), gate.float(), w.float(), 1e-6, kind)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@needs_fla
@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("lens", [[1, 300, 64], [1, 1, 1]], ids=["prefill", "decode"])
def test_in_kernel_gate_matches_reference(kind, lens):
    # raw gate + A_log/dt_bias and beta logits into fla's kernels == the torch formula then the kernels
    import torch.nn.functional as F
    from trtllm_dasc.model.recurrence import naive
    H, K = 4, 64
    g = torch.Generator().manual_seed(2)
    T, N = sum(lens), len(lens)
    q, k, v = (torch.randn(1, T, H, K, generator=g).cuda().bfloat16() for _ in range(3))
    gshape = (1, T, H) if kind == "gdn" else (1, T, H, K)
    raw = torch.randn(gshape, generator=g).cuda().bfloat16()
    A_log = torch.rand(H, generator=g).cuda()
    dt_bias = torch.randn(H if kind == "gdn" else H * K, generator=g).cuda()
    b = torch.randn(1, T, H, generator=g).cuda().bfloat16()
    h0 = 0.3 * torch.randn(N, H, K, K, generator=g).cuda()
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    bias = dt_bias if kind == "gdn" else dt_bias.view(H, K)
    decay = -(A_log.exp() if kind == "gdn" else A_log.exp()[:, None]) * F.softplus(raw.float() + bias)
    o, ht = getattr(fla_backend, kind)(q, k, v, raw, b, h0, cu, A_log=A_log, dt_bias=dt_bias, beta_logits=True)
    ro, rh = getattr(naive, kind)(q.float(), k.float(), v.float(), decay, torch.sigmoid(b.float()), h0, cu)
    for a, r in ((o, ro), (ht, rh)):
        err = ((a.float() - r).pow(2).mean().sqrt() / r.pow(2).mean().sqrt()).item()
        assert err < 1e-2


@pytest.mark.gpu
@needs_fla
def test_kda_decode_in_place_updates_only_its_rows():
    # the in-place decode kernel (states read and written where they live, rows in any order) against the
    # torch reference on gathered states; rows it was not given stay bit-for-bit as they were
    import torch.nn.functional as F
    from trtllm_dasc.model.recurrence import naive
    H, K, R = 4, 64, 7
    rows = torch.tensor([5, 0, 3], device="cuda")
    N = rows.numel()
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, N, H, K, generator=g).cuda().bfloat16() for _ in range(3))
    raw = torch.randn(1, N, H, K, generator=g).cuda().bfloat16()
    A_log, dt_bias = torch.rand(H, generator=g).cuda(), torch.randn(H * K, generator=g).cuda()
    b = torch.randn(1, N, H, generator=g).cuda().bfloat16()
    states = 0.3 * torch.randn(R, H, K, K, generator=g).cuda()
    before = states.clone()
    o = fla_backend.kda_decode_in_place(q, k, v, raw, b, states, rows, A_log=A_log, dt_bias=dt_bias,
                                        beta_logits=True)
    decay = -A_log.exp()[:, None] * F.softplus(raw.float() + dt_bias.view(H, K))
    ro, rh = naive.kda(q.float(), k.float(), v.float(), decay, torch.sigmoid(b.float()), before[rows],
                       list(range(N + 1)))
    for a, r in ((o, ro), (states[rows], rh)):
        err = ((a.float() - r).pow(2).mean().sqrt() / r.pow(2).mean().sqrt()).item()
        assert err < 1e-2
    others = [i for i in range(R) if i not in rows.tolist()]
    assert torch.equal(states[others], before[others])


@pytest.mark.gpu
@needs_fla
@pytest.mark.parametrize("offset", [False, True], ids=["kimi", "qwen3_next"])
@pytest.mark.parametrize("with_delta", [True, False], ids=["add", "norm-only"])
def test_add_rms_norm_matches_reference(offset, with_delta):
    # the residual add and the next norm in one kernel == torch's add then ops.rms_norm (qwen3_next's
    # 1 + w folded into the fp32 weight as model.fused_norm_weights makes it)
    from trtllm_dasc.model.fused_ops import add_rms_norm
    from trtllm_dasc.model.ops import rms_norm
    g = torch.Generator().manual_seed(5)
    x, delta = (torch.randn(37, 2304, generator=g).cuda().bfloat16() for _ in range(2))
    w = (0.1 * torch.randn(2304, generator=g)).cuda().bfloat16()
    h, s = add_rms_norm(x, delta if with_delta else None, 1.0 + w.float() if offset else w, 1e-6)
    ref_s = x + delta if with_delta else x
    torch.testing.assert_close(s.float(), ref_s.float(), rtol=8e-3, atol=0)       # the bf16 sum, to an ulp
    torch.testing.assert_close(h.float(), rms_norm(ref_s, w, 1e-6, offset).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@needs_fla
def test_swiglu_of_column_slices_matches_reference():
    # as DenseMLP calls it: the gate and up halves of one GEMM output, column slices
    from trtllm_dasc.model.fused_ops import swiglu
    gu = torch.randn(29, 2 * 300, generator=torch.Generator().manual_seed(6)).cuda().bfloat16()
    g, u = gu[:, :300], gu[:, 300:]
    ref = torch.nn.functional.silu(g.float()) * u.float()
    torch.testing.assert_close(swiglu(g, u).float(), ref, rtol=2e-2, atol=2e-2)
