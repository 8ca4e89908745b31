"""The few-row GEMM kernel (model/kernels/gemv.py; Triton's interpreter on the CPU) against its torch reference
(F.linear in fp32), with ragged edges in N and K, strided rows, every row count it takes and the configs the
decode shapes get; on a GPU also ops.linear's dispatch against F.linear."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from trtllm_dasc.model.kernels import gemv as gemv_kernel  # noqa: E402
from trtllm_dasc.model.kernels.gemv import gemv, gemv_reference  # noqa: E402

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


@pytest.mark.parametrize("M, N, K", [(1, 64, 128), (1, 48, 40), (2, 32, 136)], ids=["M1-N64-K128", "M1-N48-K40",
                                                                                  "M2-N32-K136"])
def test_gemv_groups_take_their_own_columns_of_x(M, N, K):
    # Kimi's f_b over f_a and g_b over g_a in one launch: x = [f_a | g_a], w = [f_b; g_b]; the reference is
    # the two products apart, so a kernel reading the wrong half of x (or one half for both) fails
    g = torch.Generator().manual_seed(N + K)
    x = torch.randn(M, 2 * K + 16, generator=g).to(DEV, DTYPE)[:, 16:]
    w = (torch.randn(2 * N, K, generator=g) / K ** 0.5).to(DEV, DTYPE)
    assert gemv_kernel.supports(x, w, groups=2) if DEV == "cuda" else True
    got = gemv(x, w, groups=2)
    first = torch.nn.functional.linear(x[:, :K].float(), w[:N].float())
    second = torch.nn.functional.linear(x[:, K:].float(), w[N:].float())
    assert got.shape == (M, 2 * N)
    _close(got[:, :N], first, K)
    _close(got[:, N:], second, K)


def test_gemv_upcasts_a_half_x_against_an_fp32_weight():
    # a router's logits: x in the model's dtype, the weight in fp32, the result in fp32 (as
    # F.linear(x.float(), w) computes it); on the CPU x is bf16 through the interpreter
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 264, generator=g).to(DEV, torch.bfloat16)
    w = torch.randn(40, 264, generator=g).to(DEV)
    got = gemv(x, w, out_dtype=torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.nn.functional.linear(x.float(), w), rtol=1e-5, atol=1e-4)


def test_linear_groups_and_linear_fp32_fall_back_to_f_linear_off_the_gpu():
    from trtllm_dasc.model.ops import linear_fp32, linear_groups
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(3, 2 * 24, generator=g), torch.randn(2 * 16, 24, generator=g)
    a, b = linear_groups(x, w, 2)
    torch.testing.assert_close(a, x[:, :24] @ w[:16].T)
    torch.testing.assert_close(b, x[:, 24:] @ w[16:].T)
    xb = torch.randn(2, 24, generator=g).bfloat16()
    torch.testing.assert_close(linear_fp32(xb, w[:16]), xb.float() @ w[:16].T)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_ops_helpers_take_the_kernel_at_one_row_and_match_f_linear():
    from trtllm_dasc.model.ops import linear_fp32, linear_groups
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(1, 2304, device="cuda", generator=g).bfloat16()
    router = torch.randn(256, 2304, device="cuda", generator=g)
    torch.testing.assert_close(linear_fp32(x, router), torch.nn.functional.linear(x.float(), router),
                               rtol=1e-4, atol=1e-3)
    fa = torch.randn(1, 256, device="cuda", generator=g).bfloat16()
    fb = (torch.randn(8192, 128, device="cuda", generator=g) / 11).bfloat16()
    a, b = linear_groups(fa, fb, 2)
    _close(a, torch.nn.functional.linear(fa[:, :128].float(), fb[:4096].float()), 128)
    _close(b, torch.nn.functional.linear(fa[:, 128:].float(), fb[4096:].float()), 128)
