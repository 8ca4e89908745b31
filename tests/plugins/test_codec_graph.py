"""The codec graphs (plugins/codec.py) evaluated by our numpy interpreter against the torch reference
(state/naive.py): store, load (zero-fill and keep) and the wr merge, for both slot layouts, both codecs,
fp32 and bf16 checkpoints, with and without conv state, and for a layout the planner made."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from plugins.codec import QMAX, SCALE_FLOOR, codec_graphs, load_graph, merge_graph, store_graph
from plugins.graph import Graph, GraphError
from plugins.numpy_eval import evaluate, to_bfloat16
from trtllm_dasc.state import naive
from trtllm_dasc.state.layout import StateLayout

RETAINED = [[0, 2, 5], [1], [], [0, 1, 2, 3, 4, 5]]


def _layout(codec, kind, tdt=torch.float32, conv=True, wide=0):
    width = None
    if wide:
        width = (sum(map(len, RETAINED)) if kind == "ragged" else len(RETAINED) * 6) + (wide if kind == "ragged" else 0)
    return StateLayout.from_retained(RETAINED, units_per_layer=6, unit_elements=8, value_dim=4, codec=codec,
                                     layout=kind, width=width, conv_dim=3 if conv else 0, conv_width=2 if conv else 0,
                                     temporal_dtype=tdt, conv_dtype=torch.bfloat16)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy() if t.dtype in (torch.bfloat16, torch.float16) else t.numpy()


def _state(L=4, N=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    temporal = torch.randn(L, N, 6, 8, generator=g)
    temporal[1, 3, 2] = 0.0                                   # an all-zero unit: the scale floor
    temporal[0, 2, 0, :4] = torch.tensor([0.5, -1.5, 2.5, 127.0]) * (1 / 127)   # exact .5 ties before rounding
    conv = torch.randn(L, N, 3, 2, generator=g).to(torch.bfloat16)
    return temporal, conv


CASES = [(c, k, t, conv, wide) for c in ("native", "int8") for k in ("ragged", "padded")
         for t in (torch.float32, torch.bfloat16) for conv in (True, False) for wide in (0, 3)]


@pytest.mark.parametrize("codec, kind, tdt, conv, wide", CASES)
def test_store_equals_naive(codec, kind, tdt, conv, wide):
    lay = _layout(codec, kind, tdt, conv, wide)
    temporal, conv_state = _state()
    rows, slots = [7, 2, 5], [3, 9, 1]
    S = 12
    payload = torch.zeros(S, lay.width, 8, dtype=torch.int8 if codec == "int8" else tdt)
    scales = torch.zeros(S, lay.width, 2, dtype=tdt) if codec == "int8" else None
    cs = torch.zeros(S, 4, 3, 2, dtype=torch.bfloat16) if conv else None
    naive.store(temporal, conv_state if conv else None, rows, payload, scales, cs, slots, lay)
    feeds = {"temporal": temporal.numpy(), "rows": np.array(rows, np.int32)}
    if conv:
        feeds["conv"] = _np(conv_state)
    out = evaluate(store_graph(lay, 4, 10), feeds)
    pos = lay.slot_pos.numpy()
    assert np.array_equal(out["payload"][:, pos], _np(payload[slots][:, pos]))
    unused = np.setdiff1d(np.arange(lay.width), pos)
    assert not out["payload"][:, unused].any()
    if codec == "int8":
        assert np.array_equal(out["scales"][:, pos], _np(scales[slots][:, pos]))
    if conv:
        assert np.array_equal(out["conv_store"], _np(cs[slots]))


@pytest.mark.parametrize("codec, kind, tdt, conv, wide", CASES)
@pytest.mark.parametrize("zero_fill", [True, False])
def test_load_equals_naive(codec, kind, tdt, conv, wide, zero_fill):
    lay = _layout(codec, kind, tdt, conv, wide)
    src, conv_src = _state(seed=1)
    S, slots, rows = 6, [4, 0, 2], [1, 8, 6]
    payload = torch.zeros(S, lay.width, 8, dtype=torch.int8 if codec == "int8" else tdt)
    scales = torch.zeros(S, lay.width, 2, dtype=tdt) if codec == "int8" else None
    cs = torch.zeros(S, 4, 3, 2, dtype=torch.bfloat16) if conv else None
    naive.store(src, conv_src if conv else None, [0, 3, 9], payload, scales, cs, slots, lay)
    temporal, conv_state = _state(seed=2)
    feeds = {"payload": _np(payload[slots]), "temporal": temporal.numpy(), "rows": np.array(rows, np.int32)}
    if codec == "int8":
        feeds["scales"] = _np(scales[slots])
    if conv:
        feeds["conv_store"], feeds["conv"] = _np(cs[slots]), _np(conv_state)
    out = evaluate(load_graph(lay, 4, 10, zero_fill=zero_fill), feeds)
    naive.load(payload, scales, cs, slots, temporal, conv_state if conv else None, rows, lay, zero_fill=zero_fill)
    assert np.array_equal(out["temporal_out"], temporal.numpy())
    if conv:
        assert np.array_equal(out["conv_out"], _np(conv_state))


@pytest.mark.parametrize("kind", ["ragged", "padded"])
def test_merge_layer_by_layer_equals_naive(kind):
    """The runtime merges per layer, scratch rows being rows of the same state: the engine run on each
    layer in turn equals naive's merge of all layers."""
    lay = _layout("native", kind)
    temporal, _ = _state(seed=4)
    srows, rows = [9, 0, 4], [2, 5, 3]
    graph = merge_graph(lay, 4, 10)
    got = temporal.numpy().copy()
    for layer in range(lay.num_layers):
        got[layer] = evaluate(graph, {"temporal": got[layer], "scratch_rows": np.array(srows, np.int32),
                                      "rows": np.array(rows, np.int32),
                                      "layer": np.array([layer], np.int32)})["temporal_out"]
    naive.replay_merge(temporal, srows, temporal, rows, lay)
    assert np.array_equal(got, temporal.numpy())
    assert not np.array_equal(got, _state(seed=4)[0].numpy())       # it did change the omitted units


@pytest.mark.parametrize("codec", ["native", "int8"])
def test_a_rank_that_keeps_nothing_stores_conv_and_zero_fills(codec):
    lay = StateLayout.from_retained([[], [], []], units_per_layer=6, unit_elements=8, value_dim=4, codec=codec,
                                    conv_dim=3, conv_width=2, conv_dtype=torch.bfloat16)
    temporal, conv = _state(L=3)
    out = evaluate(store_graph(lay, 4, 10), {"rows": np.array([1, 4], np.int32), "conv": _np(conv)})
    assert set(out) == {"conv_store"} and np.array_equal(out["conv_store"], _np(conv[:, [1, 4]].transpose(0, 1)))
    loaded = evaluate(load_graph(lay, 4, 10), {"temporal": temporal.numpy(), "rows": np.array([1, 4], np.int32),
                                               "conv_store": out["conv_store"], "conv": _np(conv)})
    expect = temporal.clone()
    naive.load(torch.zeros(1, 0, 8, dtype=torch.int8 if codec == "int8" else torch.float32),
               torch.zeros(1, 0, 2) if codec == "int8" else None, None, [0, 0], expect, None, [1, 4], lay)
    assert np.array_equal(loaded["temporal_out"], expect.numpy()) and not loaded["temporal_out"][:, [1, 4]].any()


def test_a_planned_layout_round_trips(tmp_path):
    """The planner's retained units for the embedded tiny Kimi-Linear: store then load through the graphs
    gives naive's load of naive's store."""
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    plan, _ = plan_from_path("trtllm_dasc/assets/tiny-kimi-linear", PlanOptions(wmax=16, codec="int8"))
    lay = StateLayout.from_plan(plan)
    L, n, E = lay.num_layers, lay.units_per_layer, lay.unit_elements
    g = torch.Generator().manual_seed(5)
    temporal = torch.randn(L, 8, n, E, generator=g)
    rows = np.array([6, 1], np.int32)
    stored = evaluate(store_graph(lay, 2, 8), {"temporal": temporal.numpy(), "rows": rows,
                                               "conv": np.zeros((L, 8, lay.conv_dim, lay.conv_width), np.float32)})
    loaded = evaluate(load_graph(lay, 2, 8), {"payload": stored["payload"], "scales": stored["scales"],
                                              "temporal": np.zeros_like(temporal.numpy()), "rows": np.array([0, 3], np.int32),
                                              "conv_store": stored["conv_store"],
                                              "conv": np.zeros((L, 8, lay.conv_dim, lay.conv_width), np.float32)})
    payload = torch.zeros(4, lay.width, E, dtype=torch.int8)
    scales = torch.zeros(4, lay.width, lay.rows_per_unit)
    naive.store(temporal, None, rows.tolist(), payload, scales, None, [1, 2], lay)
    expect = torch.zeros_like(temporal)
    naive.load(payload, scales, None, [1, 2], expect, None, [0, 3], lay)
    assert np.array_equal(loaded["temporal_out"], expect.numpy())
    assert [gr.name for gr in codec_graphs(lay, "nr", 2, 8)] == ["dasc_store", "dasc_load"]
    assert [gr.name for gr in codec_graphs(lay, "wr", 2, 8)] == ["dasc_store", "dasc_load", "dasc_merge"]


def test_bfloat16_cast_matches_torch():
    x = torch.randn(10000) * 100
    x[:4] = torch.tensor([1.00390625, 1.01171875, -2.00781250, 3.0e38])     # ties and a large value
    assert np.array_equal(to_bfloat16(x.numpy()), x.to(torch.bfloat16).float().numpy())


def test_bad_graphs_and_feeds_are_refused():
    g = Graph("g", dims={"B": (1, 2, 4)})
    with pytest.raises(GraphError, match="dynamic dim"):
        g.input("x", "float32", ("Q", 3))
    x = g.input("x", "float32", ("B", 3))
    with pytest.raises(GraphError, match="used twice"):
        g.input("x", "float32", (3,))
    with pytest.raises(GraphError, match="undefined"):
        g.op("unary", "nope", fn="abs")
    with pytest.raises(GraphError, match="fn"):
        g.op("unary", x, fn="sqrt")
    g.output(g.op("unary", x, fn="abs"), "y", "float32")
    with pytest.raises(GraphError, match="expected"):
        evaluate(g, {"x": np.zeros((2, 4), np.float32)})
    lay = _layout("native", "ragged", conv=False)
    with pytest.raises(GraphError, match="repeated"):
        evaluate(load_graph(lay, 4, 10), {"payload": np.zeros((2, lay.width, 8), np.float32),
                                          "temporal": np.zeros((4, 10, 6, 8), np.float32),
                                          "rows": np.array([3, 3], np.int32)})


def _boundary_values(amax: np.float32) -> np.ndarray:
    """Values x with x / s at or one or two fp32 steps from k + 0.5 for every k the scale reaches, where
    x / s and x * (1 / s) (a rounded reciprocal) round differently for some of them."""
    s = amax / np.float32(QMAX)
    ties = ((np.arange(-QMAX, QMAX, dtype=np.float64) + 0.5) * np.float64(s)).astype(np.float32)
    up, down, out = ties, ties, [ties]
    for _ in range(2):
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
        out += [up, down]
    x = np.unique(np.concatenate(out))
    return x[np.abs(x) <= amax]


def test_int8_store_divides_at_rounding_boundaries():
    """q = round(x / s) with IEEE fp32 division (paper Eq. 10; round half to even), at the values where a
    multiply by a rounded reciprocal gives another integer: the graph and naive both divide."""
    V, E = 16, 32
    rows_of_values = []
    for amax in (np.float32(1.4707843), np.float32(0.98280406), np.float32(1.2287531), np.float32(1.9010652)):
        x = _boundary_values(amax)
        x = np.concatenate([x, np.zeros((-len(x)) % (V - 1), np.float32)]).reshape(-1, V - 1)
        # the first element of every value row fixes its amax (the scale) exactly
        rows_of_values.append(np.concatenate([np.full((len(x), 1), amax, np.float32), x], 1))
    vals = np.concatenate(rows_of_values)                    # [rows, V]
    n = -(-len(vals) // (E // V))
    vals = np.concatenate([vals, np.zeros((n * (E // V) - len(vals), V), np.float32)])
    temporal = vals.reshape(1, 1, n, E)
    lay = StateLayout.from_retained([list(range(n))], units_per_layer=n, unit_elements=E, value_dim=V, codec="int8")
    # the reference by definition: numpy's correctly rounded fp32 quotient, then half-to-even
    s = np.maximum(np.abs(vals).max(1, keepdims=True), np.float32(SCALE_FLOOR)) / np.float32(QMAX)
    expect = np.clip(np.round(vals / s), -QMAX, QMAX).astype(np.int8)
    # the test is only worth something where a reciprocal multiply differs
    assert (np.round(vals * (np.float32(1) / s)) != expect).sum() >= 10
    out = evaluate(store_graph(lay, 1, 1), {"temporal": temporal, "rows": np.array([0], np.int32)})
    got = out["payload"][0][lay.slot_pos.numpy()].reshape(-1, V)
    assert np.array_equal(got, expect)
    assert np.array_equal(out["scales"][0][lay.slot_pos.numpy()].reshape(-1), s.reshape(-1))
    q, _ = naive.quantize_int8(torch.from_numpy(vals))
    assert np.array_equal(q.numpy(), expect)
