"""Evaluate a codec graph (plugins.graph) with numpy, op by op as TensorRT defines each layer.

This is how the graphs are checked where no TensorRT runtime can execute them (every machine here: the
CPU has none, TensorRT-RTX has no Hopper target). numpy has no bfloat16: such values are kept as float32
holding exactly the bf16-representable number (round to nearest even on cast), which is what a bf16
tensor would hold; the caller compares them as float32.
"""
from __future__ import annotations

import numpy as np

from plugins.graph import Graph, GraphError

_NP = {"float32": np.float32, "float16": np.float16, "int8": np.int8, "int32": np.int32, "bool": np.bool_}


def to_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), as float32."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), out)


def _cast(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return to_bfloat16(x.astype(np.float32))
    if dtype == "int8":
        # TensorRT's cast of an in-range integral float; the graph clips before it
        return x.astype(np.int8)
    return x.astype(_NP[dtype])


def _binary(a, b, fn):
    if a.ndim != b.ndim:
        raise GraphError(f"binary {fn}: ranks {a.ndim} and {b.ndim} differ (TensorRT broadcasts equal ranks)")
    if fn == "equal":
        return a == b
    out = {"sum": np.add, "sub": np.subtract, "prod": np.multiply, "div": np.divide,
           "max": np.maximum, "min": np.minimum}[fn](a, b)
    return out.astype(np.result_type(a, b))


def _reshape(x, shape):
    dims = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(dims)


def _scatter_nd(data, indices, updates):
    out = data.copy()
    idx = indices[:, 0]
    if len(set(idx.tolist())) != idx.size:
        raise GraphError("scatter_nd with repeated indices (TensorRT leaves their order undefined)")
    out[idx] = updates
    return out


def evaluate(graph: Graph, feeds: dict) -> dict:
    """``feeds``: input name -> numpy array of the input's dtype (bfloat16 inputs as float32). Returns
    output name -> array."""
    env = {}
    for inp in graph.inputs:
        if inp.name not in feeds:
            raise GraphError(f"{graph.name}: input {inp.name!r} not fed")
        x = np.asarray(feeds[inp.name])
        fixed = [(i, d) for i, d in enumerate(inp.shape) if isinstance(d, int)]
        if x.ndim != len(inp.shape) or any(x.shape[i] != d for i, d in fixed):
            raise GraphError(f"{graph.name}: input {inp.name} has shape {x.shape}, expected {inp.shape}")
        env[inp.name] = _cast(x, inp.dtype)
    env.update(graph.constants)
    for node in graph.nodes:
        a = [env[i] for i in node.inputs]
        at = node.attrs
        if node.op == "gather":
            if a[1].min(initial=0) < 0 or a[1].max(initial=-1) >= a[0].shape[at["axis"]]:
                raise GraphError(f"gather index outside axis {at['axis']} of {a[0].shape}")
            out = np.take(a[0], a[1].astype(np.int64), axis=at["axis"])
        elif node.op == "transpose":
            out = np.transpose(a[0], at["perm"])
        elif node.op == "reshape":
            out = _reshape(a[0], at["shape"])
        elif node.op == "select":
            out = np.where(a[0], a[1], a[2]).astype(np.result_type(a[1], a[2]))
        elif node.op == "unary":
            # np.round rounds half to even, as TensorRT's ROUND
            out = np.abs(a[0]) if at["fn"] == "abs" else np.round(a[0])
        elif node.op == "binary":
            out = _binary(a[0], a[1], at["fn"])
        elif node.op == "reduce":
            out = np.max(a[0], axis=tuple(at["axes"]), keepdims=at["keepdims"])
        elif node.op == "cast":
            out = _cast(a[0], at["dtype"])
        elif node.op == "scatter_nd":
            out = _scatter_nd(a[0], a[1], a[2])
        else:
            raise GraphError(f"unknown op {node.op!r}")
        env[node.output] = out
    return {name: env[t] for t, name, _ in graph.outputs}
