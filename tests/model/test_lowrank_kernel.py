"""model/lowrank_kernel.py (Triton's interpreter on the CPU) against its torch reference (F.linear in fp32),
and the KDA mixer's prefill with the kernel against the same mixer with two F.linear calls (GPU)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from trtllm_dasc.model import lowrank_kernel  # noqa: E402
from trtllm_dasc.model.lowrank_kernel import up_pair, up_pair_reference  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _operands(T, N, K, dtype, seed=0):
    """The two inputs as adjacent columns of a wider projection output (a strided slice, as in the mixer)."""
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(T, 3 * K + 40, generator=g)
    w = torch.randn(2 * N, K, generator=g) / K ** 0.5
    return proj[:, 24:24 + 2 * K].to(DEV, dtype), w.to(DEV, dtype)


@pytest.mark.parametrize("T,tiles", [(300, (128, 64, 4)), (64, (32, 32, 2)), (1, (16, 32, 1))],
                         ids=["ragged-rows", "one-block", "one-row"])
def test_up_pair_matches_reference(T, tiles):
    # rows not a multiple of the row block (masked), several column blocks per product, both products
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    x, w = _operands(T, 128, 32, dtype)
    f, g = up_pair(x, w, tiles)
    rf, rg = up_pair_reference(x, w)
    assert f.shape == g.shape == (T, 128) and f.is_contiguous() and g.is_contiguous() and f.dtype == dtype
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(f, rf, **tol)
    torch.testing.assert_close(g, rg, **tol)
    # the second product really reads the second input half and weight half
    assert not torch.allclose(f, g)


def test_supports_only_the_shapes_the_kernel_takes():
    cuda = DEV == "cuda"
    x, w = _operands(512, 256, 128, torch.bfloat16)
    assert lowrank_kernel.supports(x, w) == cuda                   # CPU tensors: never (a GPU kernel)
    if cuda:
        assert not lowrank_kernel.supports(x[:100], w)              # a short prefill stays on cuBLAS
        assert not lowrank_kernel.supports(x.float(), w.float())    # fp32: TF32 dots would round differently
        assert not lowrank_kernel.supports(x[:, :200], w)           # the inputs are not two K-wide halves
        assert not lowrank_kernel.supports(x, w[:200])              # N not a multiple of the column block


@pytest.mark.skipif(DEV != "cuda", reason="the fused mixer runs on a GPU")
def test_kda_prefill_with_the_kernel_matches_two_linears(tmp_path, monkeypatch):
    # a whole tiny Kimi-Linear model (KDA heads 2 x 64: N = 128, a shape the kernel takes) over a 300-token
    # prefill with the fla backend: logits with the gate products from up_pair against those with two
    # F.linear calls (the products differ in summation order only: the logits within bf16 rounding)
    from hybrid_tiny import build
    from trtllm_dasc.model import HybridModel
    from trtllm_dasc.model.direct import DirectRunner
    from trtllm_dasc.model.recurrence import fla as fla_backend
    ok, why = fla_backend.available()
    if not ok:
        pytest.skip(why)
    build(tmp_path, "kda", seed=4, linear_head_dim=64, linear_num_heads=2)
    model = HybridModel.from_pretrained(str(tmp_path), device="cuda", dtype="bfloat16", backend="fla")
    ids = torch.randint(0, 64, (300,), generator=torch.Generator().manual_seed(1))
    calls = []
    real = lowrank_kernel.up_pair
    monkeypatch.setattr(lowrank_kernel, "up_pair", lambda *a, **k: calls.append(1) or real(*a, **k))
    with_kernel = DirectRunner(model, rows=1, max_tokens=320, block_size=16).run(ids).logits.float()
    assert calls, "the prefill did not take the kernel"
    monkeypatch.setattr(lowrank_kernel, "supports", lambda *a: False)
    without = DirectRunner(model, rows=1, max_tokens=320, block_size=16).run(ids).logits.float()
    err = (with_kernel - without).norm() / without.norm()
    assert err < 2e-2, err
