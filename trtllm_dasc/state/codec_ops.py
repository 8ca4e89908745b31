"""Host wrappers of the FP8 / INT4 codec kernels: the same signatures as ``codec_naive`` (read its docstring).

``store_units`` / ``load_units`` move one codec group of units between the active state and a slot
payload; the composed ``naive.store`` / ``triton_ops.store`` (and load) call them for layouts of codec
fp8 or int4, and the mixed layout (one group per codec) calls them once per group.
"""
from __future__ import annotations

import functools

import torch

from trtllm_dasc.state import codec_kernels as K
from trtllm_dasc.state import codec_naive
from trtllm_dasc.state.codec_naive import row_bytes
from trtllm_dasc.state.launch import _cdiv, _idx, _pow2

CODEC_ID = {"fp8": 1, "int4": 2}


def _blocks(n_rows: int, VB: int, cid: int) -> tuple[int, int]:
    # same tile budget as triton_ops (read at call time: tests shrink it to force partial row blocks), in
    # values, not bytes: an int4 tile of BLOCK_B bytes a row holds 2 * BLOCK_B values, and sized by bytes
    # (32 rows x 128 values at V = 128) its load kernel took 255 registers and spilled on sm90
    from trtllm_dasc.state import triton_ops
    block_b = _pow2(VB)
    values = block_b * (2 if cid == CODEC_ID["int4"] else 1)
    return max(1, min(max(triton_ops.TILE_ELEMS // max(values, 1), 1), _pow2(n_rows))), block_b


def fast_div_for(cid: int, is_cuda: bool, capability: tuple[int, int] | None) -> bool:
    """int4's and fp8's quotients by the fma sequence on a GPU (codec_kernels._encode_rows; the interpreter's
    fma rounds twice), proven to give div_rn's codes near every int4 and e4m3fn boundary (fma_quotient.py).
    fp8's FAST_DIV also encodes with the hardware's e4m3 conversion, which Triton compiles for sm89 and newer
    only ("type fp8e4nv not supported in this architecture" on an A100): older GPUs take the bit encode and
    div_rn, the interpreter's path, the same codes."""
    if not is_cuda or cid not in (CODEC_ID["int4"], CODEC_ID["fp8"]):
        return False
    return cid != CODEC_ID["fp8"] or capability is None or tuple(capability) >= (8, 9)


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _fast_div(cid: int, x: torch.Tensor) -> bool:
    # the device's capability once per device: this runs on every checkpoint store
    cap = _capability(x.device) if x.is_cuda and cid == CODEC_ID["fp8"] else None
    return fast_div_for(cid, x.is_cuda, cap)


def _check_codec(codec: str, V: int) -> int:
    if codec not in CODEC_ID:
        raise ValueError(f"codec {codec!r} is not one of {tuple(CODEC_ID)}")
    if codec == "int4" and V % 2:
        raise ValueError(f"int4 packs two values a byte: the row length {V} must be even")
    return CODEC_ID[codec]


def quantize(x: torch.Tensor, codec: str, scale_dtype: torch.dtype = torch.float32):
    """x [..., V] -> (codes uint8 [..., row_bytes], s [...]); s in float32 or bfloat16."""
    codec_naive.check_scale_dtype(scale_dtype)
    V = x.shape[-1]
    cid = _check_codec(codec, V)
    VB = row_bytes(codec, V)
    xc = x.contiguous()
    q = torch.empty((*x.shape[:-1], VB), dtype=torch.uint8, device=x.device)
    s = torch.empty(x.shape[:-1], dtype=scale_dtype, device=x.device)
    n_rows = xc.numel() // max(V, 1)
    if n_rows:
        BR, BB = _blocks(n_rows, VB, cid)
        K.quantize_rows_kernel[(_cdiv(n_rows, BR),)](xc, q, s, n_rows, V=V, VB=VB, BLOCK_R=BR, BLOCK_B=BB, CODEC=cid,
                                                     FAST_DIV=_fast_div(cid, xc))
    return q, s


def dequantize(q: torch.Tensor, s: torch.Tensor, codec: str, V: int | None = None) -> torch.Tensor:
    """(codes uint8 [..., row_bytes], s [...]) -> fp32 [..., V] (V: fp8 the code count, int4 twice it)."""
    V = V or (q.shape[-1] * (2 if codec == "int4" else 1))
    cid = _check_codec(codec, V)
    VB = row_bytes(codec, V)
    assert q.shape[-1] == VB and s.shape == q.shape[:-1], f"codes {tuple(q.shape)} / scales {tuple(s.shape)}"
    out = torch.empty((*q.shape[:-1], V), dtype=torch.float32, device=q.device)
    n_rows = s.numel()
    if n_rows:
        BR, BB = _blocks(n_rows, VB, cid)
        K.dequantize_rows_kernel[(_cdiv(n_rows, BR),)](q.contiguous(), s.contiguous(), out, n_rows, V=V, VB=VB,
                                                       BLOCK_R=BR, BLOCK_B=BB, CODEC=cid)
    return out


def store_units(t, rows, payload, scales, slots, unit_layer, unit_local, slot_pos, R: int, V: int,
                codec: str, conv=None) -> None:
    """Triton twin of codec_naive.store_units (t: [L, N, n_units, R * V] view, units contiguous). conv
    (triton_ops._store_conv): the conv state's store, run by the same launch's programs past the rows."""
    from trtllm_dasc.state.triton_ops import NO_CONV
    conv = conv or NO_CONV
    cid = _check_codec(codec, V)
    VB = row_bytes(codec, V)
    assert t.stride(3) == 1 and t.stride(2) == R * V, f"units of one (layer, request) must be contiguous: {t.stride()}"
    assert payload.dtype == torch.uint8 and payload.shape[2] == R * VB and payload.stride(2) == 1 \
        and payload.stride(1) == R * VB, f"payload {tuple(payload.shape)} is not [S, width, {R * VB}] uint8, rows contiguous"
    assert scales.shape[:2] == payload.shape[:2] and scales.shape[2] == R and scales.stride(2) == 1 \
        and scales.stride(1) == R, f"scales {tuple(scales.shape)} must be [S, width, {R}], contiguous per slot"
    rows, slots = _idx(rows, t.device), _idx(slots, t.device)
    n_rows, B = unit_layer.numel() * R, slots.numel()
    BR, BB = _blocks(n_rows, VB, cid)
    n_blocks = _cdiv(n_rows, BR) + conv.n_programs
    if n_blocks == 0 or B == 0:
        return
    K.store_units_kernel[(n_blocks, B)](
        t, payload, scales, rows, slots, unit_layer, unit_local, slot_pos, n_rows, t.stride(0), t.stride(1),
        payload.stride(0), scales.stride(0), *conv.kernel_args(payload), R=R, V=V, VB=VB, BLOCK_R=BR,
        BLOCK_B=BB, CODEC=cid, **conv.consts, FAST_DIV=_fast_div(cid, t))


def load_units(payload, scales, slots, t, rows, pos_of_unit, R: int, V: int, codec: str,
               zero_fill: bool = True, units=None, conv=None) -> None:
    """Every unit (l, u) of active rows[b] (t: [L, N, n_units, R * V]) with pos_of_unit[l * n + u] >= 0
    is decoded from slots[b]; -1 zeroed when zero_fill; other negatives left alone (another group's).
    units: the (layer, position or -1, local unit) lists of what to write (triton_ops._load_list, built once
    per layout); without them they are derived from pos_of_unit here (a device sync). conv: as store_units."""
    from trtllm_dasc.state.triton_ops import NO_CONV
    conv = conv or NO_CONV
    cid = _check_codec(codec, V)
    VB = row_bytes(codec, V)
    assert t.stride(3) == 1 and t.stride(2) == R * V, f"units of one (layer, request) must be contiguous: {t.stride()}"
    assert payload.dtype == torch.uint8 and payload.shape[2] == R * VB and payload.stride(1) == R * VB
    assert scales.shape[2] == R and scales.stride(1) == R
    rows, slots = _idx(rows, t.device), _idx(slots, t.device)
    if units is None:
        n = t.shape[2]
        flat = torch.nonzero((pos_of_unit >= 0) | ((pos_of_unit == -1) & zero_fill)).flatten()
        units = (flat // n, pos_of_unit[flat], flat % n)
    n_rows, B = units[0].numel() * R, slots.numel()
    BR, BB = _blocks(n_rows, VB, cid)
    n_blocks = _cdiv(n_rows, BR) + conv.n_programs
    if n_blocks == 0 or B == 0:
        return
    K.load_units_kernel[(n_blocks, B)](
        payload, scales, t, slots, rows, *units, n_rows, payload.stride(0), scales.stride(0),
        t.stride(0), t.stride(1), *conv.kernel_args(t), R=R, V=V, VB=VB, BLOCK_R=BR, BLOCK_B=BB, CODEC=cid,
        **conv.consts)


# the torch twins under the same names, for callers that pick a backend by module
naive_quantize = codec_naive.QUANTIZE
naive_dequantize = codec_naive.DEQUANTIZE
