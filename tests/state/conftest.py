import pytest

# TRITON_INTERPRET (kernels on the CPU without a GPU) is set in tests/conftest.py


@pytest.fixture(scope="session")
def device(kernel_device) -> str:
    """The state tests' device: tests/conftest.py's kernel_device (the GPU unless the interpreter runs)."""
    return kernel_device
