"""Executing the codec engines: store then load on the GPU through a TensorRT runtime, against the torch
reference (state/naive.py). Runs wherever the importable TensorRT can deserialize an engine for the GPU at
hand; otherwise skips with that reason (on this project's machines it always skips: the CPU has no GPU,
and TensorRT-RTX has no Hopper target for the H200, ENVIRONMENT.md)."""
from __future__ import annotations

import pytest
import torch

from plugins.codec import load_graph, store_graph
from plugins.trt_network import build_engine, load_tensorrt
from trtllm_dasc.state import naive
from trtllm_dasc.state.layout import StateLayout

_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int8": torch.int8,
          "int32": torch.int32}


def _runtime_engine(blob):
    """(trt, engine) or pytest.skip with the reason no engine can run here."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: a TensorRT engine executes on a GPU")
    try:
        trt = load_tensorrt()
    except ImportError as e:
        pytest.skip(str(e))
    runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
    engine = runtime.deserialize_cuda_engine(blob)
    if engine is None:
        cap = ".".join(map(str, torch.cuda.get_device_capability()))
        pytest.skip(f"{trt.__name__} {getattr(trt, '__version__', '')} cannot run an engine on this GPU "
                    f"(compute capability {cap})")
    return trt, engine


def _run(trt, engine, feeds: dict) -> dict:
    ctx = engine.create_execution_context()
    keep = {}
    for name, x in feeds.items():
        x = x.contiguous().cuda()
        keep[name] = x
        ctx.set_input_shape(name, tuple(x.shape))
        ctx.set_tensor_address(name, x.data_ptr())
    outs = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        if engine.get_tensor_mode(name) == trt.TensorIOMode.OUTPUT:
            dtype = {trt.float32: "float32", trt.bfloat16: "bfloat16", trt.int8: "int8"}[engine.get_tensor_dtype(name)]
            outs[name] = torch.empty(tuple(ctx.get_tensor_shape(name)), dtype=_TORCH[dtype], device="cuda")
            ctx.set_tensor_address(name, outs[name].data_ptr())
    stream = torch.cuda.current_stream()
    assert ctx.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    return {k: v.cpu() for k, v in outs.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("codec", ["native", "int8"])
def test_store_and_load_engines_equal_naive(codec):
    lay = StateLayout.from_retained([[0, 2, 5], [1], list(range(6))], units_per_layer=6, unit_elements=8,
                                    value_dim=4, codec=codec, layout="ragged")
    trt, store = _runtime_engine(build_engine(store_graph(lay, 4, 8)))
    _, load = _runtime_engine(build_engine(load_graph(lay, 4, 8)))
    temporal = torch.randn(3, 8, 6, 8)
    rows = torch.tensor([5, 1, 6], dtype=torch.int32)
    got = _run(trt, store, {"temporal": temporal, "rows": rows})
    payload = torch.zeros(3, lay.width, 8, dtype=torch.int8 if codec == "int8" else torch.float32)
    scales = torch.zeros(3, lay.width, 2) if codec == "int8" else None
    naive.store(temporal, None, rows.tolist(), payload, scales, None, [0, 1, 2], lay)
    assert torch.equal(got["payload"], payload)
    feeds = {"payload": got["payload"], "temporal": torch.zeros_like(temporal), "rows": torch.tensor([0, 2, 7], dtype=torch.int32)}
    if codec == "int8":
        assert torch.equal(got["scales"], scales)
        feeds["scales"] = got["scales"]
    back = _run(trt, load, feeds)["temporal_out"]
    expect = torch.zeros_like(temporal)
    naive.load(payload, scales, None, [0, 1, 2], expect, None, [0, 2, 7], lay)
    assert torch.equal(back, expect)
