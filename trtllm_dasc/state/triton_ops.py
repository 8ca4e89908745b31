"""Host wrappers of the Triton state kernels: same signatures and shapes as ``naive`` (read its docstring).

They assert strides (units contiguous inside one (layer, request); slots contiguous), pick block sizes and
grids, and launch. On a machine without a GPU they run in Triton's interpreter (TRITON_INTERPRET=1 set
before triton is imported) on CPU tensors.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from trtllm_dasc.state import kernels
from trtllm_dasc.state.launch import _cdiv, _idx, _pow2
from trtllm_dasc.state.layout import StateLayout
from trtllm_dasc.state.naive import as_units

# elements per program tile: 2048 fp32 (8 KiB read per program), the fastest of
# `python -m benchmarks state_bandwidth --sweep --sweep-w 16,128` (the planner's TP8 masks at batch 64).
# measured on an H200: 2048 at 4 warps beat 4096 on the small Kimi W=128 stores (native 79.6% of copy
# bandwidth against 74.6%, INT8 69.8% against 68.8%) and on the W=16 ones (native 88.6% against 85.1%):
# 4096 held 212 registers a thread in the INT8 store (two programs an SM), 2048 about 96 (ptxas, sm_90).
TILE_ELEMS = 2048
NUM_WARPS = 4
# elements per program of the conv copy that store / load fuse into their launch (None: TILE_ELEMS)
CONV_TILE_ELEMS: int | None = None


def _blocks(n_rows: int, V: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_V): whole rows, about TILE_ELEMS elements per program (tests shrink TILE_ELEMS)."""
    block_v = _pow2(V)
    return max(1, min(TILE_ELEMS // block_v, _pow2(n_rows))), block_v


def _check_units(t: torch.Tensor, layout: StateLayout) -> None:
    st = t.stride()
    assert st[3] == 1 and st[2] == layout.unit_elements, f"units of one (layer, request) must be contiguous: {st}"


def _check_slots(payload: torch.Tensor, width: int, E: int) -> None:
    assert payload.dim() == 3 and payload.shape[1] >= width and payload.shape[2] == E, \
        f"payload {tuple(payload.shape)} is not [S, >={width}, {E}]"
    st = payload.stride()
    assert st[2] == 1 and st[1] == E, "payload rows must be contiguous"


def _check_scales(scales: torch.Tensor, payload: torch.Tensor, R: int) -> None:
    assert scales.shape == (payload.shape[0], payload.shape[1], R), \
        f"scales {tuple(scales.shape)} must be [S, width, {R}]"
    assert scales.stride(2) == 1 and scales.stride(1) == R, "scales must be contiguous per slot"


class _Conv(NamedTuple):
    """The conv part of one store / load launch: its kernel args (conv_src .. conv_row4, in the kernels'
    order), programs per request, and constexprs."""
    args: tuple
    n_programs: int
    consts: dict

    def kernel_args(self, fallback) -> tuple:
        # absent tensors: any pointer of the launch (no program reads them)
        return tuple(fallback if x is None else x for x in self.args)


NO_CONV = _Conv((None, None, 0, 0, 0, 0, 0, None, 1), 0, {"CONV_BLOCK": 16, "TO_BF16": False, "CONV8": 0})


def _conv_args(src, dst, src_strides, dst_strides, layout, encode: bool) -> _Conv:
    """The conv copy (or 8-bit encode / decode, layout.conv_codec int8) that store / load fuse into their
    launch; src/dst are the active conv [L, N, conv_dim, width] and the slots (native [S, L, conv_dim, width],
    int8 [S, L, conv8 row]) in either order (encode: src is the active conv), strides given as
    (request-or-slot stride, layer stride). None: no conv part."""
    if src is None:
        return NO_CONV
    conv, conv_store = (src, dst) if encode else (dst, src)
    if layout.conv_codec == "int8":
        from trtllm_dasc.state import conv8_ops
        n = conv8_ops._check(conv, conv_store)
        block = conv8_ops._block(n)
        # encode: one program a layer (its scale needs the layer's amax); decode: blocks of a layer
        per_request = layout.num_layers * (1 if encode else _cdiv(n, block))
        args = (src, dst, n, *src_strides, *dst_strides, conv_store.view(torch.float32), conv_store.shape[-1] // 4)
        # CONV8: 1 encode (div_rn), 3 encode with the fma quotient (conv8_ops.fast_div), 2 decode
        code = (3 if conv8_ops.fast_div(conv) else 1) if encode else 2
        return _Conv(args, per_request, {"CONV_BLOCK": block, "TO_BF16": not encode and conv.dtype == torch.bfloat16,
                                         "CONV8": code})
    for x in (src, dst):
        assert x.shape[-2:] == (layout.conv_dim, layout.conv_width), f"conv {tuple(x.shape)} has the wrong shape"
        st = x.stride()
        assert st[-1] == 1 and st[-2] == layout.conv_width, "conv [.., conv_dim, width] must be contiguous"
    cw = layout.conv_dim * layout.conv_width
    block = max(16, min(CONV_TILE_ELEMS or TILE_ELEMS, _pow2(cw)))    # never straddles layers (kernels._conv_block)
    to_bf16 = dst.dtype == torch.bfloat16 and src.dtype != torch.bfloat16
    return _Conv((src, dst, cw, *src_strides, *dst_strides, None, 1), layout.num_layers * _cdiv(cw, block),
                 {"CONV_BLOCK": block, "TO_BF16": to_bf16, "CONV8": 0})


def _store_conv(conv, conv_store, layout) -> _Conv:
    if conv is None:
        return NO_CONV
    cs, ps = conv.stride(), conv_store.stride()
    return _conv_args(conv, conv_store, (cs[1], cs[0]), (ps[0], ps[1]), layout, encode=True)


def _load_conv(conv_store, conv, layout) -> _Conv:
    if conv is None:
        return NO_CONV
    cs, ps = conv.stride(), conv_store.stride()
    return _conv_args(conv_store, conv, (ps[0], ps[1]), (cs[1], cs[0]), layout, encode=False)


def _gather(src_units, dst, dst_scale, src_idx, dst_idx, unit_layer, unit_src, unit_dst, stride_dst_b,
            stride_dst_l, stride_scale_b, layout, quant, conv: _Conv = NO_CONV):
    # QUANT: 0 none, 1 int8 with div_rn (the interpreter), 2 int8 with the fma quotient (kernels._quantize_rows)
    R, V = layout.rows_per_unit, layout.value_dim
    n_rows, B = unit_layer.numel() * R, src_idx.numel()
    BR, BV = _blocks(n_rows, V)
    n_blocks = _cdiv(n_rows, BR) + conv.n_programs
    if n_blocks == 0 or B == 0:
        return
    kernels.gather_units_kernel[(n_blocks, B)](
        src_units, dst, dst_scale if dst_scale is not None else dst, src_idx, dst_idx, unit_layer, unit_src,
        unit_dst, n_rows, src_units.stride(0), src_units.stride(1), stride_dst_b, stride_dst_l, stride_scale_b,
        *conv.kernel_args(dst), R=R, V=V, BLOCK_R=BR, BLOCK_V=BV, QUANT=(1 + src_units.is_cuda) * quant,
        **conv.consts, num_warps=NUM_WARPS)


def _load_list(ix, zero_fill: bool) -> tuple:
    """(layer, slot position or -1, local unit) of every unit a load writes: with zero fill every unit the
    layout owns, else the retained ones; never another codec segment's (foreign) units."""
    return (ix.fill_layer, ix.fill_pos, ix.fill_local) if zero_fill else (ix.unit_layer, ix.slot_pos, ix.unit_local)


def _scatter(payload, scales, slots, t, rows, layout, zero_fill, conv: _Conv = NO_CONV):
    R, V = layout.rows_per_unit, layout.value_dim
    B = slots.numel()
    ix = layout.index(t.device)
    lists = _load_list(ix, zero_fill)
    n_rows = lists[0].numel() * R
    BR, BV = _blocks(n_rows, V)
    n_blocks = _cdiv(n_rows, BR) + conv.n_programs
    if n_blocks == 0 or B == 0:
        return
    dequant = scales is not None
    kernels.scatter_units_kernel[(n_blocks, B)](
        payload, scales if dequant else payload, t, slots, rows, *lists, n_rows,
        payload.stride(0), scales.stride(0) if dequant else 0, t.stride(0), t.stride(1),
        *conv.kernel_args(t), R=R, V=V, BLOCK_R=BR, BLOCK_V=BV, DEQUANT=dequant, **conv.consts,
        num_warps=NUM_WARPS)


# ---- public twins of naive.* -------------------------------------------------------------------------
def pack(temporal, rows, payload, slots, layout: StateLayout) -> None:
    t = as_units(temporal, layout)
    _check_units(t, layout)
    _check_slots(payload, layout.width, layout.unit_elements)
    ix = layout.index(t.device)
    _gather(t, payload, None, _idx(rows, t.device), _idx(slots, t.device), ix.unit_layer, ix.unit_local,
            ix.slot_pos, payload.stride(0), 0, 0, layout, False)


def unpack(payload, slots, temporal, rows, layout: StateLayout, zero_fill: bool = True) -> None:
    t = as_units(temporal, layout)
    _check_units(t, layout)
    _check_slots(payload, layout.width, layout.unit_elements)
    _scatter(payload, None, _idx(slots, t.device), t, _idx(rows, t.device), layout, zero_fill)


def replay_merge(scratch, scratch_rows, temporal, rows, layout: StateLayout) -> None:
    t, s = as_units(temporal, layout), as_units(scratch, layout)
    _check_units(t, layout)
    _check_units(s, layout)
    ix = layout.index(t.device)
    _gather(s, t, None, _idx(scratch_rows, t.device), _idx(rows, t.device), ix.omit_layer, ix.omit_local,
            ix.omit_local, t.stride(1), t.stride(0), 0, layout, False)


def quantize_int8(x: torch.Tensor, scale_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    V = x.shape[-1]
    xc = x.contiguous()
    q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    s = torch.empty(x.shape[:-1], dtype=scale_dtype, device=x.device)
    n_rows = xc.numel() // max(V, 1)
    if n_rows:
        BR, BV = _blocks(n_rows, V)
        kernels.quantize_kernel[(_cdiv(n_rows, BR),)](xc, q, s, n_rows, V=V, BLOCK_R=BR, BLOCK_V=BV,
                                                      FAST_DIV=xc.is_cuda)
    return q, s


def dequantize_int8(q: torch.Tensor, s: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    assert s.shape == q.shape[:-1], f"scales {tuple(s.shape)} do not match q {tuple(q.shape)}"
    V = q.shape[-1]
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device) if out is None else out
    assert out.shape == q.shape and out.is_contiguous(), "out must be contiguous and shaped like q"
    n_rows = q.numel() // max(V, 1)
    if n_rows:
        BR, BV = _blocks(n_rows, V)
        kernels.dequantize_kernel[(_cdiv(n_rows, BR),)](q.contiguous(), s.contiguous(), out, n_rows,
                                                              V=V, BLOCK_R=BR, BLOCK_V=BV)
    return out


def _checked(temporal, payload, scales, rows, slots, layout: StateLayout):
    """The unit view of the active state, the codec flag and device index tensors, after the stride and
    dtype checks both composed paths need."""
    t = as_units(temporal, layout)
    _check_units(t, layout)
    _check_slots(payload, layout.width, layout.unit_elements)
    quant = layout.codec == "int8"
    if quant:
        assert payload.dtype == torch.int8 and scales is not None, "int8 codec needs an int8 payload and scales"
        _check_scales(scales, payload, layout.rows_per_unit)
    return t, quant, _idx(rows, t.device), _idx(slots, t.device)


def _codec_store(temporal, conv, rows, payload, scales, conv_store, slots, layout: StateLayout) -> None:
    # lazy: codec_ops imports this module (a cycle at import time)
    from trtllm_dasc.state import codec_ops
    t = as_units(temporal, layout)
    _check_units(t, layout)
    ix = layout.index(t.device)
    rows, slots = _idx(rows, t.device), _idx(slots, t.device)
    codec_ops.store_units(t, rows, payload, scales, slots, ix.unit_layer, ix.unit_local, ix.slot_pos,
                          layout.rows_per_unit, layout.value_dim, layout.codec,
                          conv=_store_conv(conv, conv_store, layout))


def _codec_load(payload, scales, conv_store, slots, temporal, conv, rows, layout: StateLayout, zero_fill) -> None:
    # lazy: codec_ops imports this module (a cycle at import time)
    from trtllm_dasc.state import codec_ops
    t = as_units(temporal, layout)
    _check_units(t, layout)
    ix = layout.index(t.device)
    rows, slots = _idx(rows, t.device), _idx(slots, t.device)
    codec_ops.load_units(payload, scales, slots, t, rows, ix.pos_of_unit, layout.rows_per_unit, layout.value_dim,
                         layout.codec, zero_fill, units=_load_list(ix, zero_fill),
                         conv=_load_conv(conv_store, conv, layout))


def store(temporal, conv, rows, payload, scales, conv_store, slots, layout: StateLayout) -> None:
    """naive.store's twin in one launch: the units and the conv state (copied, or 8-bit with conv_codec
    int8) together."""
    if layout.codec in ("fp8", "int4"):
        return _codec_store(temporal, conv, rows, payload, scales, conv_store, slots, layout)
    t, quant, rows, slots = _checked(temporal, payload, scales, rows, slots, layout)
    ix = layout.index(t.device)
    _gather(t, payload, scales if quant else None, rows, slots, ix.unit_layer, ix.unit_local, ix.slot_pos,
            payload.stride(0), 0, scales.stride(0) if quant else 0, layout, quant,
            _store_conv(conv, conv_store, layout))


def load(payload, scales, conv_store, slots, temporal, conv, rows, layout: StateLayout,
         zero_fill: bool = True) -> None:
    """naive.load's twin in one launch (units and conv state, like store)."""
    if layout.codec in ("fp8", "int4"):
        return _codec_load(payload, scales, conv_store, slots, temporal, conv, rows, layout, zero_fill)
    t, quant, rows, slots = _checked(temporal, payload, scales, rows, slots, layout)
    _scatter(payload, scales if quant else None, slots, t, rows, layout, zero_fill,
             _load_conv(conv_store, conv, layout))
