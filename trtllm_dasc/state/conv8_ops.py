"""Host wrappers of the 8-bit conv-state kernels: same signatures as conv8_naive.store / load."""
from __future__ import annotations

import torch

from trtllm_dasc.state import conv8_kernels as K
from trtllm_dasc.state.launch import _idx
from trtllm_dasc.state.conv8_naive import conv8_row_bytes

# elements per vector step of one (layer, request) program
BLOCK = 2048


def _check(conv: torch.Tensor, conv_store: torch.Tensor) -> int:
    L, _, cd, w = conv.shape
    n, row = cd * w, conv_store.shape[-1]
    assert conv.stride(3) == 1 and conv.stride(2) == w, f"conv [.., conv_dim, width] must be contiguous: {conv.stride()}"
    assert conv_store.dtype == torch.int8 and conv_store.shape[1] == L and row == conv8_row_bytes(n) \
        and conv_store.stride(2) == 1 and conv_store.stride(1) % 4 == 0 and conv_store.stride(0) % 4 == 0, \
        f"conv store {tuple(conv_store.shape)} is not [S, {L}, {conv8_row_bytes(n)}] int8, rows contiguous"
    return n


def fast_div(conv: torch.Tensor) -> bool:
    """The encode's quotients by the fma sequence (kernels._div_fma): on a GPU (the interpreter's fma rounds
    twice) and for bf16 values, the inputs on which it is proven equal to torch's division
    (tests/state/fma_quotient.py)."""
    return conv.is_cuda and conv.dtype == torch.bfloat16


def _block(n: int) -> int:
    return max(16, min(BLOCK, 1 << max(n - 1, 0).bit_length()))


def store(conv, rows, conv_store, slots) -> None:
    """conv [L, N, conv_dim, width] rows[b] -> conv_store [S, L, row] int8 slots[b] (one scale per layer)."""
    n = _check(conv, conv_store)
    rows, slots = _idx(rows, conv.device), _idx(slots, conv.device)
    if rows.numel() == 0 or n == 0:
        return
    K.conv8_encode_kernel[(conv.shape[0], rows.numel())](
        conv, conv_store, conv_store.view(torch.float32), rows, slots, n, conv.stride(0), conv.stride(1),
        conv_store.stride(0), conv_store.stride(1), ROW4=conv_store.shape[-1] // 4, BLOCK=_block(n),
        FAST_DIV=fast_div(conv))


def load(conv_store, slots, conv, rows) -> None:
    """conv_store [S, L, row] int8 slots[b] -> conv rows[b] (codes * scale in fp32, cast to conv's dtype)."""
    n = _check(conv, conv_store)
    rows, slots = _idx(rows, conv.device), _idx(slots, conv.device)
    if rows.numel() == 0 or n == 0:
        return
    K.conv8_decode_kernel[(conv.shape[0], rows.numel())](
        conv_store, conv_store.view(torch.float32), conv, slots, rows, n, conv_store.stride(0), conv_store.stride(1),
        conv.stride(0), conv.stride(1), ROW4=conv_store.shape[-1] // 4, BLOCK=_block(n),
        TO_BF16=conv.dtype == torch.bfloat16)
