"""Torch reference of the 8-bit conv-state codec (issue 35), twin of ``conv8_ops``' Triton kernels.

One request's conv state of one layer, conv_dim x (kernel - 1) values, is INT8 with ONE fp32 scale per
(layer, request) (paper Eq. 10 over the whole layer): ``s = max(amax, 1e-8) / 127``, ``q = clip(round(x /
s), -127, 127)``, decoded as ``q * s`` in fp32 then cast to the model dtype.

Why per layer, measured (tests/engine tiny Kimi-shaped model, conv state after a 256-token random prefix,
3 layers x 216 channels x 3; RMS of the error over RMS of x): per layer 0.76% (median channel 0.80%, p99
channel 3.5%), one scale per time step 0.69%, per channel 0.26%. A per-channel scale triples the accuracy
but costs a scale per channel: on Kimi-Linear at TP8 (1536 channels x 3 a layer) that is 4,608 code bytes
+ 6,144 fp32 scale bytes, more than the 9,216 bf16 bytes it replaces, while per layer takes 4,612 (-50%).
And the conv state is short-lived: it is the last kernel - 1 = 3 inputs of the short convolution, flushed
after three tokens, so its error reaches the temporal state only through those three tokens' k / v.

Slot row of one layer: ``conv8_row_bytes(n)`` int8 = the n codes, padded to a multiple of 4, then the
scale's 4 bytes (fp32 bit pattern, little-endian), so one int8 tensor [S, L, row] holds codes and scales
and the storage all-to-all moves it like any other conv tensor.
"""
from __future__ import annotations

import torch

from trtllm_dasc.state.codec_naive import row_amax

SCALE_FLOOR = 1e-8
QMAX = 127.0


def conv8_row_bytes(n: int) -> int:
    """Bytes of one layer's conv state of n values: codes padded to 4, plus the fp32 scale."""
    return -(-n // 4) * 4 + 4


def encode(x: torch.Tensor) -> torch.Tensor:
    """x [..., L, conv_dim, width] -> int8 [..., L, conv8_row_bytes(conv_dim * width)]."""
    n = x.shape[-2] * x.shape[-1]
    xf = x.float().reshape(*x.shape[:-2], n)
    # NaN for a layer with a NaN or an infinity (codec_naive.row_amax): the layer decodes to NaN
    a = torch.clamp(row_amax(xf), min=SCALE_FLOOR)
    # a tensor divisor: torch on CUDA turns x / scalar into x * (1 / scalar), 1 ulp off the ieee quotient
    s = a / torch.full_like(a, QMAX)
    q = torch.clamp(torch.round(xf / s.unsqueeze(-1)), -QMAX, QMAX).to(torch.int8)
    row = conv8_row_bytes(n)
    out = torch.zeros((*q.shape[:-1], row), dtype=torch.int8, device=x.device)
    out[..., :n] = q
    out[..., row - 4:] = s.unsqueeze(-1).contiguous().view(torch.int8)
    return out


def scales(codes: torch.Tensor) -> torch.Tensor:
    """The fp32 scale of each row [..., row] -> [...]."""
    return codes[..., -4:].contiguous().view(torch.float32).squeeze(-1)


def decode(codes: torch.Tensor, conv_dim: int, width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """int8 [..., L, row] -> [..., L, conv_dim, width] in dtype (q * s in fp32, then one cast)."""
    n = conv_dim * width
    x = codes[..., :n].float() * scales(codes).unsqueeze(-1)
    return x.reshape(*codes.shape[:-1], conv_dim, width).to(dtype)


def store(conv, rows, conv_store, slots) -> None:
    """conv [L, N, conv_dim, width] rows[b] -> conv_store [S, L, row] int8 slots[b]."""
    conv_store[slots] = encode(conv[:, rows].transpose(0, 1))


def load(conv_store, slots, conv, rows) -> None:
    """conv_store [S, L, row] slots[b] -> conv rows[b], in conv's dtype."""
    conv[:, rows] = decode(conv_store[slots], conv.shape[-2], conv.shape[-1], conv.dtype).transpose(0, 1)
