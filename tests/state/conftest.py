import pytest
import torch

# TRITON_INTERPRET (kernels on the CPU without a GPU) is set in tests/conftest.py


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
