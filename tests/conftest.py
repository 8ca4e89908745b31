"""Suite-wide setup, loaded before any test module."""
import os

import pytest
import torch

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
