"""Torch reference of the FP8 and INT4 checkpoint codecs (issue 35), twins of ``codec_ops``' Triton path.

Both follow the INT8 codec's shape (paper Eq. 10): one scale per row of d_v (per (l, h, k)), computed in
fp32 with IEEE division, ``s = max(max_v |x|, 1e-8) / QMAX``, then x / s encoded:
  fp8   e4m3fn (QMAX 448), round to nearest even; the payload is the fp8 bit pattern as uint8
  int4  symmetric, round half to even, clipped to [-7, 7] (-8 unused, so 0 stays exact and the range
        symmetric); two values a byte, element 2i in the low nibble, 2i + 1 in the high one (V even)
Dequantize: decode(code) (exact in fp32) * s, one fp32 multiply: equal bit for bit on every backend.

INT4 granularity, measured (4096 rows of V=128, fp32; RMS of the error over RMS of x): per-row scale
gaussian 0.117, laplace 0.160, student-t(3) 0.227; per group of 32 values 0.097, 0.121, 0.145 (fp8 0.026,
0.025, 0.022; int8 0.0065, 0.0089, 0.014). Groups cut the error by 17% (gaussian) to 36% (heavy tails) but
cost 12 more scale bytes a row: a KDA unit goes from 68 to 80 bytes (+18%), a fifth of what INT4 saves over
INT8 (132 bytes). Per-row scales stay here: INT4 is meant for the short-horizon band only, whose error
decays within a few hundred tokens; if the error study (benchmarks/) finds heavy-tailed rows there,
per-group scales are the next step.

Shapes: rows x [..., V] fp32 (any float); codes [..., V] uint8 (fp8) or [..., V // 2] uint8 (int4);
scales [...] in scale_dtype (the temporal dtype, as INT8's).
"""
from __future__ import annotations

import torch

SCALE_FLOOR = 1e-8
FP8_MAX = 448.0
INT4_MAX = 7
QUANT_CODECS = ("fp8", "int4")


# the dtypes a scaled codec's (int8, fp8, int4) scales may be kept in: fp32's exponent range. float16 is refused:
# a row whose largest value is above 127 * 65504 (~8.3e6) would get an infinite INT8 scale and load as inf or NaN
# (0 * inf), one below 127 * 6e-8 (~7.6e-6) a zero scale, so a checkpoint would not hold what was stored
SCALE_DTYPES = (torch.float32, torch.bfloat16)


def check_scale_dtype(dtype: torch.dtype) -> None:
    """Raise ValueError unless ``dtype`` can hold a scaled codec's scales (SCALE_DTYPES)."""
    if dtype not in SCALE_DTYPES:
        raise ValueError(f"a scaled codec keeps its per-row scales in float32 or bfloat16, not {dtype}: float16's "
                         "range cannot hold them (rows beyond ~8.3e6 would load as inf/NaN, rows below ~7.6e-6 "
                         "as zeros)")


def row_bytes(codec: str, V: int) -> int:
    """Payload bytes of one row of V values."""
    if codec == "fp8":
        return V
    if codec == "int4":
        return (V + 1) // 2
    raise ValueError(f"codec {codec!r} is not one of {QUANT_CODECS}")


def row_amax(xf: torch.Tensor) -> torch.Tensor:
    """max_v |x| of each row, NaN where the row holds a NaN or an infinity: its scale is then NaN and the row
    decodes to NaN on every backend (the kernels' _row_amax), as the native codec keeps a diverged state;
    an infinite row's scale would otherwise be inf, whose codes (inf / inf) decode differently per backend."""
    a = xf.abs().amax(dim=-1)
    return torch.where(torch.isfinite(xf).all(dim=-1), a, torch.full_like(a, float("nan")))


def _scale(xf: torch.Tensor, qmax: float) -> torch.Tensor:
    a = torch.clamp(row_amax(xf), min=SCALE_FLOOR)
    # a tensor divisor, as naive.quantize_int8 says: torch on CUDA turns x / scalar into x * (1 / scalar)
    return a / torch.full_like(a, qmax)


def quantize_fp8(x: torch.Tensor, scale_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., V] -> (codes uint8 [..., V] (e4m3fn bits), s [...])."""
    xf = x.float()
    s = _scale(xf, FP8_MAX)
    y = torch.clamp(xf / s.unsqueeze(-1), -FP8_MAX, FP8_MAX)
    return y.to(torch.float8_e4m3fn).view(torch.uint8), s.to(scale_dtype)


def dequantize_fp8(codes: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(codes uint8 [..., V], s [...]) -> fp32 [..., V]."""
    return codes.view(torch.float8_e4m3fn).float() * s.float().unsqueeze(-1)


def quantize_int4(x: torch.Tensor, scale_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., V] (V even) -> (packed uint8 [..., V // 2], s [...])."""
    if x.shape[-1] % 2:
        raise ValueError(f"int4 packs two values a byte: the row length {x.shape[-1]} must be even")
    xf = x.float()
    s = _scale(xf, INT4_MAX)
    q = torch.clamp(torch.round(xf / s.unsqueeze(-1)), -INT4_MAX, INT4_MAX).to(torch.int16)
    packed = (q[..., 0::2] & 15) | ((q[..., 1::2] & 15) << 4)
    return packed.to(torch.uint8), s.to(scale_dtype)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., V // 2] -> int8 [..., V] in [-8, 7] (sign-extended nibbles)."""
    p = packed.to(torch.int16)
    lo, hi = p & 15, p >> 4
    q = torch.stack([lo, hi], dim=-1).flatten(-2)
    return torch.where(q >= 8, q - 16, q).to(torch.int8)


def dequantize_int4(packed: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(packed uint8 [..., V // 2], s [...]) -> fp32 [..., V]."""
    return unpack_int4(packed).float() * s.float().unsqueeze(-1)


QUANTIZE = {"fp8": quantize_fp8, "int4": quantize_int4}
DEQUANTIZE = {"fp8": dequantize_fp8, "int4": dequantize_int4}


# ---- unit groups: what store / load do for one codec -------------------------------------------------
def _idx(x, device) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.int64, device=device).flatten()


def store_units(t: torch.Tensor, rows, payload, scales, slots, unit_layer, unit_local, slot_pos, R: int, V: int,
                codec: str) -> None:
    """Quantize units (unit_layer[j], unit_local[j]) of active rows[b] (t: [L, N, n_units, R * V] view)
    into payload[slots[b], slot_pos[j]] ([S, width, R * row_bytes] uint8) and scales[.., .., R]."""
    rows, slots = _idx(rows, t.device), _idx(slots, t.device)
    x = t[unit_layer[None, :], rows[:, None], unit_local[None, :]]
    B, U = x.shape[:2]
    q, s = QUANTIZE[codec](x.reshape(B, U, R, V), scales.dtype)
    pos = (slots[:, None], slot_pos[None, :])
    # explicit sizes: a group of no units (a rank whose share of a codec segment is empty) has nothing to infer -1 from
    payload[pos] = q.reshape(B, U, R * row_bytes(codec, V))
    scales[pos] = s


def load_units(payload, scales, slots, t: torch.Tensor, rows, pos_of_unit, R: int, V: int, codec: str,
               zero_fill: bool = True) -> None:
    """Every unit (l, u) of active rows[b] (t: [L, N, n_units, R * V]) with p = pos_of_unit[l * n + u] >= 0
    is dequantized from payload[slots[b], p]; p == -1 (omitted) is zeroed when zero_fill; any other
    negative p (a unit of another codec group) is left alone."""
    rows, slots = _idx(rows, t.device), _idx(slots, t.device)
    L, n = t.shape[0], t.shape[2]
    pos = pos_of_unit.view(L, n)
    if zero_fill:
        ol, ou = torch.nonzero(pos == -1, as_tuple=True)
        t[ol[None, :], rows[:, None], ou[None, :]] = 0
    kl, ku = torch.nonzero(pos >= 0, as_tuple=True)
    sp = pos[kl, ku]
    B, U = slots.numel(), sp.numel()
    q = payload[slots[:, None], sp[None, :]].reshape(B, U, R, row_bytes(codec, V))
    x = DEQUANTIZE[codec](q, scales[slots[:, None], sp[None, :]]).reshape(B, U, R * V)
    t[kl[None, :], rows[:, None], ku[None, :]] = x.to(t.dtype)
