"""Torch reference of every state op (the CPU path, and what the Triton kernels are tested against).

Shapes (one TP rank; B requests in a batch, S physical slots, U retained units, R = E // V):
  temporal  [L, N, n_units, E] or any view of it, e.g. [L, N, HV, K, V]; fp32 active state
  conv      [L, N, conv_dim, conv_width]    model dtype
  payload   [S, width, E]                   temporal dtype (native) or int8
  scales    [S, width, R]                   temporal dtype (int8 codec only)
  conv_store[S, L, conv_dim, conv_width]    layout.conv_dtype
  rows [B] active rows, slots [B] slot ids (int tensors); rows of one call must be distinct when written.
Every function has the same signature as its twin in ``triton_ops``.
"""
from __future__ import annotations

import math

import torch

from trtllm_dasc.state import codec_naive
from trtllm_dasc.state.layout import StateLayout

# paper Eq. 10: the floor on the row max keeps all-zero rows finite
SCALE_FLOOR = 1e-8
QMAX = 127


def as_units(temporal: torch.Tensor, layout: StateLayout) -> torch.Tensor:
    """[L, N, ...] -> [L, N, n_units, E] view (no copy; raises if the unit block is not contiguous)."""
    L, n, E = layout.num_layers, layout.units_per_layer, layout.unit_elements
    shape = temporal.shape
    if len(shape) < 2 or shape[0] != L or math.prod(shape[2:]) != n * E:
        raise ValueError(f"temporal {tuple(temporal.shape)} is not [L={L}, N, ...] with {n}x{E} elements per row")
    return temporal.view(L, shape[1], n, E)


def _idx(x, device) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.int64, device=device).flatten()


# ---- int8 codec (Eq. 10) -------------------------------------------------------------------------------
def quantize_int8(x: torch.Tensor, scale_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., V] -> (q int8 [..., V], s [...]): s = max(max_v |x|, 1e-8) / 127, q = clip(round(x / s)).

    Computed in fp32; round is half-to-even (torch.round)."""
    xf = x.float()
    # NaN for a row with a NaN or an infinity (codec_naive.row_amax)
    a = torch.clamp(codec_naive.row_amax(xf), min=SCALE_FLOOR)
    # a tensor divisor: torch on CUDA turns division by a python scalar into a multiply by its
    # reciprocal, which is 1 ulp off the ieee quotient that Eq. 10 (and the cpu, numpy, our kernels) give
    s = a / torch.full_like(a, QMAX)
    q = torch.clamp(torch.round(xf / s.unsqueeze(-1)), -QMAX, QMAX).to(torch.int8)
    return q, s.to(scale_dtype)


def dequantize_int8(q: torch.Tensor, s: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """(q int8 [..., V], s [...]) -> q * s in fp32 (written into ``out`` when given, cast to its dtype)."""
    x = q.float() * s.float().unsqueeze(-1)
    if out is None:
        return x
    out.copy_(x)
    return out


# ---- temporal ops ------------------------------------------------------------------------------------
def pack(temporal, rows, payload, slots, layout: StateLayout) -> None:
    """payload[slots[b], slot_pos[j]] = temporal[layer_j, rows[b], unit_j] for every retained unit j."""
    t = as_units(temporal, layout)
    ix = layout.index(t.device)
    rows, slots = _idx(rows, t.device), _idx(slots, t.device)
    x = t[ix.unit_layer[None, :], rows[:, None], ix.unit_local[None, :]]
    payload[slots[:, None], ix.slot_pos[None, :]] = x.to(payload.dtype)


def unpack(payload, slots, temporal, rows, layout: StateLayout, zero_fill: bool = True) -> None:
    """temporal[layer_j, rows[b], unit_j] = payload[slots[b], slot_pos[j]]; omitted units of those rows
    are set to zero (policy nr) unless ``zero_fill`` is False (then left as they are)."""
    t = as_units(temporal, layout)
    ix = layout.index(t.device)
    rows, slots = _idx(rows, t.device), _idx(slots, t.device)
    x = payload[slots[:, None], ix.slot_pos[None, :]]
    if zero_fill:
        t[ix.omit_layer[None, :], rows[:, None], ix.omit_local[None, :]] = 0
    t[ix.unit_layer[None, :], rows[:, None], ix.unit_local[None, :]] = x.to(t.dtype)


def replay_merge(scratch, scratch_rows, temporal, rows, layout: StateLayout) -> None:
    """Policy wr: temporal[l, rows[b], u] = scratch[l, scratch_rows[b], u] for the OMITTED units (l, u)
    only; retained units of the active state are left untouched. scratch: [L, Ns, n_units, E] view."""
    t, s = as_units(temporal, layout), as_units(scratch, layout)
    ix = layout.index(t.device)
    rows, srows = _idx(rows, t.device), _idx(scratch_rows, t.device)
    ol, ou = ix.omit_layer[None, :], ix.omit_local[None, :]
    t[ol, rows[:, None], ou] = s[ol, srows[:, None], ou].to(t.dtype)


# ---- composed store / load ---------------------------------------------------------------------------
def store(temporal, conv, rows, payload, scales, conv_store, slots, layout: StateLayout) -> None:
    """One checkpoint per (rows[b] -> slots[b]): gather the retained units (quantized for int8) and copy
    the conv state cast to conv_store's dtype. conv / conv_store / scales may be None when absent."""
    t = as_units(temporal, layout)
    ix = layout.index(t.device)
    rows, slots = _idx(rows, t.device), _idx(slots, t.device)
    x = t[ix.unit_layer[None, :], rows[:, None], ix.unit_local[None, :]]
    pos = (slots[:, None], ix.slot_pos[None, :])
    if layout.codec in codec_naive.QUANT_CODECS:
        codec_naive.store_units(t, rows, payload, scales, slots, ix.unit_layer, ix.unit_local, ix.slot_pos,
                                layout.rows_per_unit, layout.value_dim, layout.codec)
    elif layout.codec == "int8":
        B, U = x.shape[:2]
        q, s = quantize_int8(x.view(B, U, layout.rows_per_unit, layout.value_dim), scales.dtype)
        payload[pos] = q.view(B, U, layout.unit_elements)
        scales[pos] = s
    else:
        payload[pos] = x.to(payload.dtype)
    if conv is not None:
        conv_store[slots] = conv[:, rows].transpose(0, 1).to(conv_store.dtype)


def load(payload, scales, conv_store, slots, temporal, conv, rows, layout: StateLayout,
         zero_fill: bool = True) -> None:
    """Inverse of store: retained units dequantized (int8) into the active rows, omitted units zeroed
    (unless ``zero_fill`` is False), conv state cast back to the model dtype."""
    t = as_units(temporal, layout)
    ix = layout.index(t.device)
    rows, slots = _idx(rows, t.device), _idx(slots, t.device)
    pos = (slots[:, None], ix.slot_pos[None, :])
    if layout.codec in codec_naive.QUANT_CODECS:
        codec_naive.load_units(payload, scales, slots, t, rows, ix.pos_of_unit, layout.rows_per_unit,
                               layout.value_dim, layout.codec, zero_fill)
        x = None
    elif layout.codec == "int8":
        B, U = slots.numel(), layout.num_retained
        q = payload[pos].view(B, U, layout.rows_per_unit, layout.value_dim)
        x = dequantize_int8(q, scales[pos]).view(B, U, layout.unit_elements)
    else:
        x = payload[pos]
    if x is not None:
        if zero_fill:
            t[ix.omit_layer[None, :], rows[:, None], ix.omit_local[None, :]] = 0
        t[ix.unit_layer[None, :], rows[:, None], ix.unit_local[None, :]] = x.to(t.dtype)
    if conv is not None:
        conv[:, rows] = conv_store[slots].transpose(0, 1).to(conv.dtype)
