"""The dasc codec as graphs (plugins.graph), one per op, parameterised by one rank's StateLayout:

    store  temporal [L, N, n, E], rows [B] (+ conv [L, N, C, W])
           -> payload [B, width, E] (the checkpoint's temporal dtype, or int8), scales [B, width, R] (int8),
              conv_store [B, L, C, W]
    load   payload, scales, conv_store, temporal, rows, conv
           -> temporal_out (the rows' retained units written, omitted ones zeroed or kept), conv_out
    merge  one layer's active state [N, n, E], scratch_rows [B], rows [B], layer [1]
           -> temporal_out (policies wr, wr-warm: the omitted units of the layer's rows taken from their
              scratch rows, as the runtime merges: per layer, inside the forward, scratch rows being
              rows of the same state)

What ``state/naive.py`` does with slot ids (payload[slots[b]] = ...), the engines do per request: store
returns the B slot images (the runtime writes them at their slots), load takes them. The plan's index
tables (which unit sits at which slot position) are constants of the graph. Positions of a slot that no
retained unit uses (the padded layout, or a width wider than this rank's units) hold zeros (int8: q = 0,
scale = 1e-8 / 127, as Eq. 10 gives for a zero row). A rank that keeps no unit (width 0: W_max above
every horizon) stores the conv state only and its load zero-fills every unit.
The store engine reads the captures of one step (runner._store: up to one per checkpoint interval of
each span), so its batch dims are sized by the caller for that, not for the running requests.
"""
from __future__ import annotations

import numpy as np

from plugins.graph import Graph
from trtllm_dasc.state.layout import StateLayout

# paper Eq. 10, as state/naive.py
SCALE_FLOOR = 1e-8
QMAX = 127
# what these graphs implement: the temporal payload in its own dtype or int8 (one codec for every unit: no
# horizon-precision segments) and the conv state in its own dtype. Any other codec would be written as raw
# floats under its name, so dasc-build --tensorrt refuses it (engines.check_supported) and so does _check.
CODECS = ("native", "int8")
CONV_CODECS = ("native",)

_TORCH_DTYPE = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16"}


def dtype_name(torch_dtype) -> str:
    return _TORCH_DTYPE[str(torch_dtype)]


def _tables(layout: StateLayout) -> dict:
    """The layout's index tables as numpy: flat unit id = l * n + u."""
    L, n = layout.num_layers, layout.units_per_layer
    flat = (layout.layer_of_unit * n + layout.unit_in_layer).numpy()
    slot_pos = layout.slot_pos.numpy()
    src_of_pos = np.zeros(layout.width, dtype=np.int64)        # slot position -> flat unit (0 if unused)
    used = np.zeros(layout.width, dtype=np.int64)
    src_of_pos[slot_pos] = flat
    used[slot_pos] = 1
    pos_of_unit = np.zeros(L * n, dtype=np.int64)               # flat unit -> slot position (0 if omitted)
    kept = np.zeros(L * n, dtype=np.int64)
    pos_of_unit[flat] = slot_pos
    kept[flat] = 1
    return {"src_of_pos": src_of_pos, "used": used, "pos_of_unit": pos_of_unit, "kept": kept}


def _rows_as_units(g: Graph, state: str, rows: str, L: int, n: int, E: int) -> str:
    """state [L, N, n, E] gathered at rows -> [B, L * n, E]."""
    x = g.op("gather", state, rows, axis=1, hint="rows")
    x = g.op("transpose", x, perm=(1, 0, 2, 3))
    return g.op("reshape", x, shape=(0, L * n, E), hint="units")


def _write_rows(g: Graph, state: str, rows: str, updates: str) -> str:
    """state [L, N, ...] with state[:, rows[b]] = updates[b] ([B, L, ...]); rows distinct."""
    t = g.op("transpose", state, perm=(1, 0, 2, 3))
    idx = g.op("reshape", rows, shape=(-1, 1))
    t = g.op("scatter_nd", t, idx, updates)
    return g.op("transpose", t, perm=(1, 0, 2, 3), hint="written")


def _dims(max_batch: int, max_rows: int, max_scratch_rows: int | None = None) -> dict:
    dims = {"B": (1, max(1, max_batch // 2), max_batch), "N": (1, max_rows, max_rows)}
    if max_scratch_rows is not None:
        dims["NS"] = (1, max_scratch_rows, max_scratch_rows)
    return dims


def _check(layout: StateLayout, max_batch: int, max_rows: int) -> None:
    if max_batch < 1 or max_rows < max_batch:
        raise ValueError(f"need 1 <= max_batch ({max_batch}) <= max_rows ({max_rows})")
    if layout.codec not in CODECS or layout.conv_codec not in CONV_CODECS:
        raise ValueError(f"the codec graphs implement temporal codecs {'|'.join(CODECS)} and conv codec "
                         f"{'|'.join(CONV_CODECS)}, not {layout.codec} / conv {layout.conv_codec}")


def store_graph(layout: StateLayout, max_batch: int, max_rows: int, conv_active_dtype: str | None = None) -> Graph:
    _check(layout, max_batch, max_rows)
    L, n, E, V, R, W = (layout.num_layers, layout.units_per_layer, layout.unit_elements, layout.value_dim,
                        layout.rows_per_unit, layout.width)
    tab, tdt = _tables(layout), dtype_name(layout.temporal_dtype)
    g = Graph("dasc_store", dims=_dims(max_batch, max_rows))
    if not W and not layout.conv_dim:
        raise ValueError("this rank keeps no unit and has no conv state: there is nothing to store")
    # with nothing retained the temporal state is not read (an unused input would be an error)
    temporal = g.input("temporal", "float32", (L, "N", n, E)) if W else None
    rows = g.input("rows", "int32", ("B",))
    if W:
        x = _rows_as_units(g, temporal, rows, L, n, E)
        x = g.op("gather", x, g.constant(tab["src_of_pos"], "int32", "src_of_pos"), axis=1, hint="slot")
        x = g.op("select", g.mask(tab["used"], (1, W, 1), "used"), x, g.scalar(0.0, 3), hint="slot")
        if layout.codec == "int8":
            xr = g.op("reshape", x, shape=(0, W, R, V))
            a = g.op("reduce", g.op("unary", xr, fn="abs"), fn="max", axes=(3,), keepdims=True)
            a = g.op("binary", a, g.scalar(SCALE_FLOOR, 4), fn="max")
            s = g.op("binary", a, g.scalar(float(QMAX), 4), fn="div", hint="scale")
            q = g.op("unary", g.op("binary", xr, s, fn="div"), fn="round")
            q = g.op("binary", g.op("binary", q, g.scalar(-QMAX, 4), fn="max"), g.scalar(QMAX, 4), fn="min")
            payload = g.op("reshape", g.op("cast", q, dtype="int8"), shape=(0, W, E), hint="payload")
            g.output(payload, "payload", "int8")
            scales = g.op("reshape", s, shape=(0, W, R))
            if tdt != "float32":
                scales = g.op("cast", scales, dtype=tdt)
            g.output(scales, "scales", tdt)
        else:
            g.output(g.op("cast", x, dtype=tdt) if tdt != "float32" else x, "payload", tdt)
    if layout.conv_dim:
        C, Wc, cdt = layout.conv_dim, layout.conv_width, dtype_name(layout.conv_dtype)
        conv = g.input("conv", conv_active_dtype or cdt, (L, "N", C, Wc))
        c = g.op("transpose", g.op("gather", conv, rows, axis=1), perm=(1, 0, 2, 3))
        g.output(g.op("cast", c, dtype=cdt) if cdt != (conv_active_dtype or cdt) else c, "conv_store", cdt)
    return g


def load_graph(layout: StateLayout, max_batch: int, max_rows: int, zero_fill: bool = True,
               conv_active_dtype: str | None = None) -> Graph:
    _check(layout, max_batch, max_rows)
    L, n, E, V, R, W = (layout.num_layers, layout.units_per_layer, layout.unit_elements, layout.value_dim,
                        layout.rows_per_unit, layout.width)
    tab, tdt = _tables(layout), dtype_name(layout.temporal_dtype)
    g = Graph("dasc_load", dims=_dims(max_batch, max_rows))
    payload = g.input("payload", "int8" if layout.codec == "int8" else tdt, ("B", W, E)) if W else None
    if not W:
        x = None
    elif layout.codec == "int8":
        scales = g.input("scales", tdt, ("B", W, R))
        q = g.op("reshape", g.op("cast", payload, dtype="float32"), shape=(0, W, R, V))
        s = g.op("reshape", g.op("cast", scales, dtype="float32") if tdt != "float32" else scales,
                 shape=(0, W, R, 1))
        x = g.op("reshape", g.op("binary", q, s, fn="prod"), shape=(0, W, E), hint="dequantized")
    else:
        x = g.op("cast", payload, dtype="float32") if tdt != "float32" else payload
    temporal = g.input("temporal", "float32", (L, "N", n, E))
    rows = g.input("rows", "int32", ("B",))
    old = g.scalar(0.0, 3) if zero_fill else _rows_as_units(g, temporal, rows, L, n, E)
    if W:
        full = g.op("gather", x, g.constant(tab["pos_of_unit"], "int32", "pos_of_unit"), axis=1, hint="units")
    else:
        # nothing retained: every unit takes `old` (zeros, or the row as it is); a tensor of the rows'
        # shape stands in for the absent payload
        full = _rows_as_units(g, temporal, rows, L, n, E)
    kept = g.mask(tab["kept"], (1, L * n, 1), "kept")
    new = g.op("reshape", g.op("select", kept, full, old), shape=(0, L, n, E))
    g.output(_write_rows(g, temporal, rows, new), "temporal_out", "float32")
    if layout.conv_dim:
        C, Wc, cdt = layout.conv_dim, layout.conv_width, dtype_name(layout.conv_dtype)
        adt = conv_active_dtype or cdt
        conv_store = g.input("conv_store", cdt, ("B", L, C, Wc))
        conv = g.input("conv", adt, (L, "N", C, Wc))
        upd = g.op("cast", conv_store, dtype=adt) if adt != cdt else conv_store
        g.output(_write_rows(g, conv, rows, upd), "conv_out", adt)
    return g


def merge_graph(layout: StateLayout, max_batch: int, max_rows: int) -> Graph:
    """One layer per call, as the runtime merges (model.py: after the replay spans of that layer). The
    layer index is an input: the omitted-unit masks of all layers are one [L, n] constant."""
    _check(layout, max_batch, max_rows)
    L, n, E = layout.num_layers, layout.units_per_layer, layout.unit_elements
    tab = _tables(layout)
    g = Graph("dasc_merge", dims=_dims(max_batch, max_rows))
    state = g.input("temporal", "float32", ("N", n, E))
    scratch_rows = g.input("scratch_rows", "int32", ("B",))
    rows = g.input("rows", "int32", ("B",))
    layer = g.input("layer", "int32", (1,))
    sc = g.op("gather", state, scratch_rows, axis=0, hint="scratch")          # [B, n, E]
    old = g.op("gather", state, rows, axis=0, hint="rows")
    omitted_all = g.constant((1 - tab["kept"]).reshape(L, n), "int32", "omitted")
    omitted = g.op("reshape", g.op("gather", omitted_all, layer, axis=0), shape=(1, n, 1))
    omitted = g.op("binary", omitted, g.constant(np.ones((1, 1, 1)), "int32", "one"), fn="equal", hint="omitted")
    new = g.op("select", omitted, sc, old)
    idx = g.op("reshape", rows, shape=(-1, 1))
    g.output(g.op("scatter_nd", state, idx, new), "temporal_out", "float32")
    return g


def codec_graphs(layout: StateLayout, policy: str, max_batch: int, max_rows: int, max_captures: int | None = None,
                 conv_active_dtype: str | None = None) -> list[Graph]:
    """The graphs an arm uses: store (sized for one step's captures: ``max_captures`` rows of a capture
    tensor), load (zero-filling, as the runner loads; its rows are the active state's) and, for the
    replaying policies, the per-layer merge."""
    caps = max_captures or max_batch
    graphs = [store_graph(layout, caps, max(caps, max_rows), conv_active_dtype),
              load_graph(layout, max_batch, max_rows, True, conv_active_dtype)]
    if policy in ("wr", "wr-warm"):
        graphs.append(merge_graph(layout, max_batch, max_rows))
    return graphs
