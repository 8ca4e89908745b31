"""A codec graph (plugins.graph) as a TensorRT network, and its serialized engine.

Works with whichever of ``tensorrt`` (full TensorRT, where installed) or ``tensorrt_rtx`` (pip
``tensorrt-rtx``: builds engines on the CPU, no plugin layer, no Hopper target) is importable; both expose
the same network API. Only native layers are used (ENVIRONMENT.md: no plugin layer in TensorRT-RTX).
"""
from __future__ import annotations

import importlib

import numpy as np

from plugins.graph import Graph, GraphError

MODULES = ("tensorrt", "tensorrt_rtx")


def load_tensorrt(prefer: str | None = None):
    """The TensorRT module to use: ``prefer`` if given, else the first of MODULES that imports.
    Raises ImportError naming what was tried and why."""
    tried = []
    for name in ([prefer] if prefer else MODULES):
        try:
            return importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - a broken install is as unusable as a missing one
            tried.append(f"{name}: {type(e).__name__}: {e}")
    raise ImportError("no TensorRT Python module is importable (" + "; ".join(tried) + "); "
                      "`pip install tensorrt-rtx` builds codec engines on the CPU")


def _dtype(trt, name: str):
    return {"float32": trt.float32, "float16": trt.float16, "bfloat16": trt.bfloat16, "int8": trt.int8,
            "int32": trt.int32, "bool": trt.bool}[name]


def _shape(inp) -> tuple:
    return tuple(-1 if isinstance(d, str) else d for d in inp.shape)


def to_network(graph: Graph, trt, builder):
    """The graph as an INetworkDefinition of ``builder`` (explicit batch, strongly typed where offered)."""
    flags = 0
    if hasattr(trt, "NetworkDefinitionCreationFlag") and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        # the graph states every dtype (casts are explicit): let nothing be re-typed by the builder
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    net = builder.create_network(flags)
    t = {}
    for inp in graph.inputs:
        t[inp.name] = net.add_input(inp.name, _dtype(trt, inp.dtype), _shape(inp))
    for name, value in graph.constants.items():
        layer = net.add_constant(value.shape, trt.Weights(value)) if value.size else None
        if layer is None:
            raise GraphError(f"{graph.name}: constant {name} of shape {value.shape} was refused (empty?)")
        layer.name = name
        t[name] = layer.get_output(0)
    unary = {"abs": trt.UnaryOperation.ABS, "round": trt.UnaryOperation.ROUND}
    binary = {"sum": trt.ElementWiseOperation.SUM, "sub": trt.ElementWiseOperation.SUB,
              "prod": trt.ElementWiseOperation.PROD, "div": trt.ElementWiseOperation.DIV,
              "max": trt.ElementWiseOperation.MAX, "min": trt.ElementWiseOperation.MIN,
              "equal": trt.ElementWiseOperation.EQUAL}
    for node in graph.nodes:
        a, at = [t[i] for i in node.inputs], node.attrs
        if node.op == "gather":
            layer = net.add_gather(a[0], a[1], at["axis"])
        elif node.op == "transpose":
            layer = net.add_shuffle(a[0])
            layer.first_transpose = tuple(at["perm"])
        elif node.op == "reshape":
            layer = net.add_shuffle(a[0])
            layer.reshape_dims = tuple(at["shape"])
        elif node.op == "select":
            layer = net.add_select(a[0], a[1], a[2])
        elif node.op == "unary":
            layer = net.add_unary(a[0], unary[at["fn"]])
        elif node.op == "binary":
            layer = net.add_elementwise(a[0], a[1], binary[at["fn"]])
        elif node.op == "reduce":
            layer = net.add_reduce(a[0], trt.ReduceOperation.MAX, sum(1 << ax for ax in at["axes"]), at["keepdims"])
        elif node.op == "cast":
            layer = net.add_cast(a[0], _dtype(trt, at["dtype"]))
        elif node.op == "scatter_nd":
            layer = net.add_scatter(a[0], a[1], a[2], trt.ScatterMode.ND)
        else:
            raise GraphError(f"unknown op {node.op!r}")
        if layer is None:
            raise GraphError(f"{graph.name}: TensorRT refused {node.op} -> {node.output}")
        layer.name = node.output
        t[node.output] = layer.get_output(0)
    for tensor, name, dtype in graph.outputs:
        out = t[tensor]
        out.name = name
        net.mark_output(out)
        if out.dtype != _dtype(trt, dtype):
            raise GraphError(f"{graph.name}: output {name} is {out.dtype}, the graph says {dtype}")
    return net


def build_engine(graph: Graph, trt=None) -> bytes:
    """The serialized engine of ``graph`` with one optimization profile over its dynamic dims."""
    trt = trt or load_tensorrt()
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    net = to_network(graph, trt, builder)
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for inp in graph.inputs:
        if any(isinstance(d, str) for d in inp.shape):
            lo, opt, hi = ([graph.dims[d][k] if isinstance(d, str) else d for d in inp.shape] for k in range(3))
            profile.set_shape(inp.name, lo, opt, hi)
    config.add_optimization_profile(profile)
    blob = builder.build_serialized_network(net, config)
    if blob is None:
        raise RuntimeError(f"{trt.__name__} could not build {graph.name} (its log says why above)")
    return bytes(blob)


def network_io(graph: Graph, trt=None) -> list[dict]:
    """What the TensorRT network of ``graph`` declares: name, direction, dtype and shape (-1 dynamic),
    read back from the network object (not from the graph), for the tests and the engine's I/O file."""
    trt = trt or load_tensorrt()
    builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    net = to_network(graph, trt, builder)
    names = {v: k for k, v in {"float32": trt.float32, "float16": trt.float16, "bfloat16": trt.bfloat16,
                               "int8": trt.int8, "int32": trt.int32, "bool": trt.bool}.items()}
    io = []
    for direction, count, get in (("input", net.num_inputs, net.get_input), ("output", net.num_outputs, net.get_output)):
        for i in range(count):
            x = get(i)
            io.append({"name": x.name, "direction": direction, "dtype": names[x.dtype], "shape": list(x.shape)})
    return io
