"""The tiled SwiGLU kernel (model/kernels/swiglu.py; Triton's interpreter on the CPU) against its torch
reference (torch's silu(gate) * up in fp32), on the column halves of one GEMM output as DenseMLP hands them
over."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from trtllm_dasc.model.kernels.swiglu import swiglu, swiglu_reference  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("T, inter", [(1, 300), (3, 17), (70, 1100)], ids=["decode", "tiny", "prefill-tiles"])
def test_swiglu_of_gemm_halves_matches_torch(T, inter):
    # decode-sized and prefill-sized tiles, ragged edges in both dims
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    gu = torch.randn(T, 2 * inter, generator=torch.Generator().manual_seed(T)).to(DEV, dtype)
    gate, up = gu[:, :inter], gu[:, inter:]
    got = swiglu(gate, up)
    ref = swiglu_reference(gate.float(), up.float())
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)
    assert got.shape == (T, inter) and got.is_contiguous() and got.dtype == dtype
    torch.testing.assert_close(got.float(), ref, **tol)
