"""Suite-wide setup, loaded before any test module."""
import os

import torch

# without a GPU our Triton kernels run in triton's interpreter on CPU tensors. the flag is read when a
# kernel is decorated, so it is set here, before any test module can import triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
