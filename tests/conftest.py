"""Suite-wide setup, loaded before any test module."""
import os

# one OpenMP thread per process, before torch is imported here (and inherited by every xdist worker, tritonserver
# and MPI rank the tests start): `make test` runs two workers on CI's two cores, each beside servers of its own,
# and OpenMP's threads spinning for cores another process holds made a CPU server's warm-up of 22 small requests
# take 117 s instead of 1 s (seen 12-07: test_model_names' setup 6 s in one run, 121 s in the next). The whole
# suite here: 631 s with torch's default threads, 381 s with one. A value set by the caller is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# without a GPU our Triton kernels run in triton's interpreter on CPU tensors. the flag is read when a
# kernel is decorated, so it is set here, before any test module can import triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def triton_device() -> str:
    """Where a test puts the tensors a Triton kernel reads: the GPU when there is one and the interpreter
    is off (triton's nvidia launcher refuses CPU tensors: "cannot be accessed from Triton (cpu tensor?)"),
    else the CPU (the interpreter, which reads CPU tensors)."""
    return "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


@pytest.fixture(scope="session")
def kernel_device() -> str:
    """triton_device() for tests that launch our Triton kernels (directly or through product code)."""
    return triton_device()
