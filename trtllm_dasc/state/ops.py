"""Public state ops: one entry per op, dispatching to the torch reference or the Triton kernels.

backend: "auto" (Triton for CUDA tensors, torch otherwise), "naive" or "triton" (on CPU tensors the
latter needs TRITON_INTERPRET=1 set before triton is imported). Shapes, for one TP rank:
  temporal   [L, N, HV, K, V] fp32 active state (any view with n_units * E elements per (l, n))
  conv       [L, N, conv_dim, conv_width] model dtype
  payload    [S, width, E] temporal dtype or int8;  scales [S, width, E // V];  conv_store [S, L, conv_dim, conv_width]
  rows [B], slots [B], scratch_rows [B]: int tensors or lists; destinations in one call must be distinct.
"""
from __future__ import annotations

import torch

from trtllm_dasc.state import naive
from trtllm_dasc.state.layout import StateLayout
from trtllm_dasc.state import codec_naive, conv8_naive

BACKENDS = ("auto", "naive", "triton")


def _impl(backend: str, x: torch.Tensor):
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "naive" or (backend == "auto" and not x.is_cuda):
        return naive
    # imported late: the CPU path must not need triton installed
    from trtllm_dasc.state import triton_ops
    return triton_ops


def pack(temporal, rows, payload, slots, layout: StateLayout, *, backend: str = "auto") -> None:
    """Native gather: payload[slots[b], slot_pos[j]] = temporal[layer_j, rows[b], unit_j] (retained j)."""
    _impl(backend, temporal).pack(temporal, rows, payload, slots, layout)


def unpack(payload, slots, temporal, rows, layout: StateLayout, *, zero_fill: bool = True,
           backend: str = "auto") -> None:
    """Native scatter of slots[b] into active rows[b]; omitted units zeroed (nr) unless zero_fill=False."""
    _impl(backend, temporal).unpack(payload, slots, temporal, rows, layout, zero_fill)


def replay_merge(scratch, scratch_rows, temporal, rows, layout: StateLayout, *, backend: str = "auto") -> None:
    """Policy wr: copy only the OMITTED units of scratch[:, scratch_rows[b]] into temporal[:, rows[b]]."""
    _impl(backend, temporal).replay_merge(scratch, scratch_rows, temporal, rows, layout)


def quantize_int8(x: torch.Tensor, scale_dtype: torch.dtype = torch.float32, *, backend: str = "auto"):
    """x [..., V] -> (q int8 [..., V], s [...]), paper Eq. 10 (one scale per V-row); s in float32 or bfloat16."""
    codec_naive.check_scale_dtype(scale_dtype)
    return _impl(backend, x).quantize_int8(x, scale_dtype)


def dequantize_int8(q: torch.Tensor, s: torch.Tensor, out: torch.Tensor | None = None, *,
                    backend: str = "auto") -> torch.Tensor:
    """(q [..., V], s [...]) -> q * s (fp32, or out's dtype)."""
    return _impl(backend, q).dequantize_int8(q, s, out)


def store(temporal, conv, rows, payload, scales, conv_store, slots, layout: StateLayout, *,
          backend: str = "auto") -> None:
    """Fused gather (+ int8 quantize for codec int8) of rows[b] into slots[b], plus the conv state (8-bit
    conv: the torch reference in its own step; the Triton store encodes it in the same launch)."""
    impl = _impl(backend, temporal)
    conv8 = layout.conv_codec == "int8" and conv is not None and impl is naive
    impl.store(temporal, None if conv8 else conv, rows, payload, scales, conv_store, slots, layout)
    if conv8:
        conv8_naive.store(conv, rows, conv_store, slots)


def load(payload, scales, conv_store, slots, temporal, conv, rows, layout: StateLayout, *,
         zero_fill: bool = True, backend: str = "auto") -> None:
    """Fused (dequantize +) scatter + zero-fill of slots[b] into rows[b], plus the conv state."""
    impl = _impl(backend, temporal)
    conv8 = layout.conv_codec == "int8" and conv is not None and impl is naive
    impl.load(payload, scales, conv_store, slots, temporal, None if conv8 else conv, rows, layout, zero_fill)
    if conv8:
        conv8_naive.load(conv_store, slots, conv, rows)
