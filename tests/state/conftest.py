import os

import pytest
import torch

# kernels run in triton's interpreter on CPU tensors when there is no GPU; the flag is read when a
# kernel is decorated, so it must be set before trtllm_dasc.state.kernels is imported
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
