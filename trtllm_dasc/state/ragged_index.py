"""Where a state kernel's rows are: the index arithmetic the INT8 (``kernels``) and FP8 / INT4 (``codec_kernels``)
store and load kernels share, and the request lookup the conv8 kernels share with them.

A checkpoint is ragged: each layer keeps its own set of units (R rows of V contiguous elements each), so a
program's BLOCK_R rows map onto (layer, unit, row within the unit) through a list of units: unit j's layer
and positions are read from tables (store: the retained units; load: the units it writes, LayoutIndex.fill_*
with zero fill: a walk of every row of the state made a mixed checkpoint's segments visit each other's
rows). Everything a caller multiplies by a stride comes back as int64: the active state [L, N, n_units, R * V] and the slot pools pass 2**31 elements at serving sizes (a 48-layer
model's state at a few hundred requests), and a product in int32 wraps silently to a wrong address.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def request_rows(src_idx, dst_idx):
    """(src_idx[b], dst_idx[b]) as int64 for this program's request b = program_id(1): the rows (or slots) of
    the source and destination pools its copy reads and writes."""
    b = tl.program_id(1)
    return tl.load(src_idx + b).to(tl.int64), tl.load(dst_idx + b).to(tl.int64)


@triton.jit
def listed_unit_rows(blk, n_rows, unit_layer, unit_src, unit_dst, R: tl.constexpr, BLOCK_R: tl.constexpr):
    """Rows blk * BLOCK_R + [0, BLOCK_R) of a list of units (n_rows = J * R; unit j owns rows j * R ..
    j * R + R - 1) -> (rmask, r, layer, u_src, u_dst): rows past n_rows masked, r the row within its unit,
    and unit j's layer unit_layer[j] and positions unit_src[j] (in the source layer) and unit_dst[j] (in the
    destination), masked rows 0. The division stays in int32 (row counts fit; a 64-bit division costs
    more); the results are widened, so addresses built from them are int64."""
    ri = blk * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = ri < n_rows
    j = ri // R
    r = (ri - j * R).to(tl.int64)
    layer = tl.load(unit_layer + j, mask=rmask, other=0).to(tl.int64)
    u_src = tl.load(unit_src + j, mask=rmask, other=0).to(tl.int64)
    u_dst = tl.load(unit_dst + j, mask=rmask, other=0).to(tl.int64)
    return rmask, r, layer, u_src, u_dst
