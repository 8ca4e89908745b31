"""The codec graphs as TensorRT engines (tensorrt or tensorrt-rtx, which builds on the CPU): they build,
their I/O is what the engine expects (names, dtypes, shapes written out here from the layout), and
`dasc-build --tensorrt` puts them in the engine directory. Executing an engine needs a TensorRT runtime for
the GPU at hand: tests/plugins/test_trt_runtime.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from plugins.codec import load_graph, merge_graph, store_graph
from plugins.trt_network import build_engine, load_tensorrt, network_io
from trtllm_dasc.state.layout import StateLayout

try:
    trt = load_tensorrt()
    WHY = None
except ImportError as e:
    trt, WHY = None, str(e)
pytestmark = pytest.mark.skipif(trt is None, reason=f"no TensorRT module: {WHY}")

TINY = "trtllm_dasc/assets/tiny-kimi-linear"


def _layout(codec, kind, tdt=torch.float32):
    return StateLayout.from_retained([[0, 2, 5], [1], [], list(range(6))], units_per_layer=6, unit_elements=8,
                                     value_dim=4, codec=codec, layout=kind, conv_dim=3, conv_width=2,
                                     temporal_dtype=tdt, conv_dtype=torch.bfloat16)


def _io(graph):
    return {(x["direction"], x["name"]): (x["dtype"], x["shape"]) for x in network_io(graph, trt)}


@pytest.mark.parametrize("codec", ["native", "int8"])
@pytest.mark.parametrize("kind", ["ragged", "padded"])
@pytest.mark.parametrize("tdt", [torch.float32, torch.bfloat16])
def test_engines_build_with_the_expected_io(codec, kind, tdt):
    lay = _layout(codec, kind, tdt)
    W, t = lay.width, {torch.float32: "float32", torch.bfloat16: "bfloat16"}[tdt]
    pay = "int8" if codec == "int8" else t
    store, load, merge = store_graph(lay, 4, 8, "bfloat16"), load_graph(lay, 4, 8), merge_graph(lay, 4, 8)
    expect_store = {("input", "temporal"): ("float32", [4, -1, 6, 8]), ("input", "rows"): ("int32", [-1]),
                    ("input", "conv"): ("bfloat16", [4, -1, 3, 2]), ("output", "payload"): (pay, [-1, W, 8]),
                    ("output", "conv_store"): ("bfloat16", [-1, 4, 3, 2])}
    expect_load = {("input", "payload"): (pay, [-1, W, 8]), ("input", "temporal"): ("float32", [4, -1, 6, 8]),
                   ("input", "rows"): ("int32", [-1]), ("input", "conv_store"): ("bfloat16", [-1, 4, 3, 2]),
                   ("input", "conv"): ("bfloat16", [4, -1, 3, 2]),
                   ("output", "temporal_out"): ("float32", [4, -1, 6, 8]), ("output", "conv_out"): ("bfloat16", [4, -1, 3, 2])}
    if codec == "int8":
        expect_store[("output", "scales")] = (t, [-1, W, 2])
        expect_load[("input", "scales")] = (t, [-1, W, 2])
    assert _io(store) == expect_store
    assert _io(load) == expect_load
    assert _io(merge) == {("input", "temporal"): ("float32", [-1, 6, 8]), ("input", "scratch_rows"): ("int32", [-1]),
                          ("input", "rows"): ("int32", [-1]), ("input", "layer"): ("int32", [1]),
                          ("output", "temporal_out"): ("float32", [-1, 6, 8])}
    for g in (store, load, merge):
        assert len(build_engine(g, trt)) > 1000


def _build(tmp_path, *flags):
    out = tmp_path / "engine"
    proc = subprocess.run([sys.executable, "-m", "build_scripts.dasc_build", "--model", TINY, "--output", str(out),
                           "--device", "cpu", "--dtype", "float32", "--tensorrt", *flags],
                          capture_output=True, text=True, timeout=600)
    return out, proc


@pytest.mark.parametrize("policy, names", [("nr", ["dasc_store", "dasc_load"]),
                                           ("wr", ["dasc_store", "dasc_load", "dasc_merge"])])
def test_dasc_build_writes_the_codec_engines(tmp_path, policy, names):
    out, proc = _build(tmp_path, "--policy", policy, "--codec", "int8", "--max-batch-size", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads((out / "tensorrt" / "codec.json").read_text())
    assert info["module"] == trt.__name__ and info["max_batch"] == 3 and info["max_rows"] == 6
    assert info["max_captures"] == 3 * (2048 // 256 + 1)             # one step's captures at the defaults
    assert [e["name"] for e in info["engines"]] == names
    plan = json.loads((out / "plan.json").read_text())
    for e in info["engines"]:
        assert (out / "tensorrt" / e["file"]).stat().st_size == e["bytes"]
        if e["name"] == "dasc_store":
            assert e["dims"]["B"][2] == info["max_captures"] == e["dims"]["N"][2]
        else:
            assert e["dims"]["B"] == [1, 1, 3] and e["dims"]["N"] == [1, 6, 6]
        if e["name"] == "dasc_store":
            payload = next(x for x in e["io"] if x["name"] == "payload")
            # the slot width the planner accounted for (its slot bytes), int8 payload
            assert payload["dtype"] == "int8" and payload["shape"][1] == plan["slot_units_per_rank"][0]


def test_dasc_build_tensorrt_at_tp2_writes_each_rank(tmp_path):
    out, proc = _build(tmp_path, "--tp", "2", "--placement", "off")
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads((out / "tensorrt" / "codec.json").read_text())
    assert sorted({e["rank"] for e in info["engines"]}) == [0, 1]
    assert all(os.path.isfile(out / "tensorrt" / e["file"]) for e in info["engines"])


def test_tensorrt_with_a_placement_that_moves_units_is_one_line(tmp_path):
    out, proc = _build(tmp_path, "--tp", "2", "--placement", "storage")
    if proc.returncode == 0:
        pytest.skip("this tiny model's plan moves no unit under placement storage")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("dasc-build: error: --tensorrt")
    assert not out.exists()


def test_no_tensorrt_module_is_a_clear_error():
    with pytest.raises(ImportError, match="no TensorRT Python module"):
        load_tensorrt("tensorrt_that_does_not_exist")


def test_a_plan_that_keeps_no_unit_builds(tmp_path):
    """W_max above every horizon: the checkpoint is the conv state only (no temporal payload)."""
    out, proc = _build(tmp_path, "--wmax", "100000000")
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads((out / "tensorrt" / "codec.json").read_text())
    store = next(e for e in info["engines"] if e["name"] == "dasc_store")
    assert [x["name"] for x in store["io"] if x["direction"] == "output"] == ["conv_store"]
