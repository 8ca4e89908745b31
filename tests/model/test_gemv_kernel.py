"""The few-row GEMM kernel (model/gemv_kernel.py; Triton's interpreter on the CPU) against its torch reference
(F.linear in fp32), with ragged edges in N and K, strided rows, every row count it takes and the configs the
decode shapes get; on a GPU also ops.linear's dispatch against F.linear."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from trtllm_dasc.model import gemv_kernel  # noqa: E402
from trtllm_dasc.model.gemv_kernel import gemv, gemv_reference  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float32


def _close(got, ref, K):
    # bf16 output: one rounding of an fp32 sum; fp32 on the CPU: summation order only
    tol = dict(rtol=1e-2, atol=1e-2) if got.dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5 * K ** 0.5)
    torch.testing.assert_close(got.float(), ref.float(), **tol)


@pytest.mark.parametrize("M, N, K", [(1, 37, 40), (1, 300, 1032), (2, 100, 2304), (3, 9, 128), (4, 20, 520),
                                     (1, 64, 2048)],
                         ids=["M1-N37-K40", "M1-N300-K1032", "M2-N100-K2304", "M3-N9-K128", "M4-N20-K520",
                              "M1-N64-K2048"])
def test_gemv_matches_torch(M, N, K):
    g = torch.Generator().manual_seed(M * N + K)
    # x a column slice of a wider tensor (a projection's part, as the mixers pass them)
    x = torch.randn(M, K + 24, generator=g).to(DEV, DTYPE)[:, 8:8 + K]
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(DEV, DTYPE)
    got = gemv(x, w)
    assert got.shape == (M, N) and got.dtype == DTYPE
    _close(got, gemv_reference(x, w), K)


@pytest.mark.parametrize("cfg", [(8, 128, 2), (2, 1024, 4), (16, 256, 4)], ids=["BN8-BK128", "BN2-BK1024",
                                                                                "BN16-BK256"])
def test_gemv_configs_the_benchmark_sweeps(cfg):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 1100, generator=g).to(DEV, DTYPE)
    w = (torch.randn(45, 1100, generator=g) / 33).to(DEV, DTYPE)
    _close(gemv(x, w, cfg), gemv_reference(x, w), 1100)


def test_preferred_shapes_are_batch_one_narrow_or_short():
    # what the benchmark measured (gemv_decode_h200_4e0dcbf.json): only those at batch 1 go to the kernel
    assert gemv_kernel.preferred(1, 4096, 128) and gemv_kernel.preferred(1, 2304, 4096)
    assert gemv_kernel.preferred(1, 576, 2304) and gemv_kernel.preferred(1, 2304, 9216)
    assert not gemv_kernel.preferred(1, 18432, 2304) and not gemv_kernel.preferred(1, 32000, 2304)
    assert not gemv_kernel.preferred(2, 2304, 4096)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_ops_linear_takes_the_kernel_where_preferred_and_matches_f_linear():
    from trtllm_dasc.model.ops import linear
    g = torch.Generator(device="cuda").manual_seed(0)
    for M, N, K in [(1, 2304, 4096), (1, 4096, 128), (1, 18432, 2304), (2, 2304, 4096)]:
        x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
        w = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).bfloat16()
        _close(linear(x, w), torch.nn.functional.linear(x.float(), w.float()), K)
        # leading dims kept ([1, 1, K] -> [1, 1, N])
        assert linear(x[:1, None], w).shape == (1, 1, N)
