"""A codec graph: a small description of a TensorRT network that two backends read.

TensorRT-RTX (the only TensorRT that installs here) has no plugin layer and cannot run on Hopper, so the
dasc codec is written with native layers only, and once: as this graph. ``trt_network`` turns it into a
TensorRT network (``tensorrt`` or ``tensorrt_rtx``, the same API); ``numpy_eval`` evaluates it with numpy,
which is how the graph's logic is tested against ``state/naive.py`` on a machine that cannot execute a
TensorRT engine.

Every op maps to one TensorRT layer:
    gather(data, indices; axis)          IGatherLayer (default mode)
    transpose(x; perm)                   IShuffleLayer.first_transpose
    reshape(x; shape)                    IShuffleLayer.reshape_dims (0 copies the input's dim, -1 infers)
    select(cond, a, b)                   ISelectLayer (broadcast over size-1 dims)
    unary(x; fn: abs | round)            IUnaryLayer (round: half to even)
    binary(a, b; fn: sum | sub | prod | div | max | min | equal)   IElementWiseLayer (broadcast, same rank)
    reduce(x; fn: max, axes, keepdims)   IReduceLayer
    cast(x; dtype)                       ICastLayer
    scatter_nd(data, indices, updates)   IScatterLayer, ScatterMode.ND: data[indices[b, 0]] = updates[b]
Dynamic dimensions are named (e.g. "B" requests, "N" active state rows); ``dims`` gives each its
(min, opt, max) for the engine's optimization profile.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

DTYPES = ("float32", "float16", "bfloat16", "int8", "int32", "bool")
OPS = {"gather": 2, "transpose": 1, "reshape": 1, "select": 3, "unary": 1, "binary": 2, "reduce": 1, "cast": 1,
       "scatter_nd": 3}
UNARY = ("abs", "round")
BINARY = ("sum", "sub", "prod", "div", "max", "min", "equal")


class GraphError(ValueError):
    """A graph that is not well formed (an unknown op or dtype, a name used twice, an undefined input)."""


@dataclass(frozen=True, slots=True)
class Input:
    name: str
    dtype: str
    shape: tuple            # ints, or names of dynamic dims


@dataclass(slots=True)
class Node:
    op: str
    inputs: tuple[str, ...]
    output: str
    attrs: dict


@dataclass(slots=True)
class Graph:
    name: str
    dims: dict = field(default_factory=dict)          # dynamic dim -> (min, opt, max)
    inputs: list = field(default_factory=list)        # [Input]
    constants: dict = field(default_factory=dict)     # name -> np.ndarray (float32, int32)
    nodes: list = field(default_factory=list)         # [Node], in order
    outputs: list = field(default_factory=list)       # [(tensor, output name, dtype)]
    _count: int = 0

    def _fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def _known(self) -> set:
        return ({i.name for i in self.inputs} | set(self.constants) | {n.output for n in self.nodes})

    def input(self, name: str, dtype: str, shape: tuple) -> str:
        if dtype not in DTYPES:
            raise GraphError(f"input {name}: dtype {dtype!r} is not one of {DTYPES}")
        for d in shape:
            if isinstance(d, str) and d not in self.dims:
                raise GraphError(f"input {name}: dynamic dim {d!r} has no (min, opt, max) in dims")
        if name in self._known():
            raise GraphError(f"name {name!r} is used twice")
        self.inputs.append(Input(name, dtype, tuple(shape)))
        return name

    def constant(self, value, dtype: str, hint: str = "const") -> str:
        """A constant tensor (index tables, masks, scalars shaped for broadcasting)."""
        np_dtype = {"float32": np.float32, "int32": np.int32}.get(dtype)
        if np_dtype is None:
            raise GraphError(f"constants are float32 or int32 (bool masks: compare an int32 one), got {dtype!r}")
        name = self._fresh(hint)
        self.constants[name] = np.ascontiguousarray(np.asarray(value, dtype=np_dtype))
        return name

    def op(self, op: str, *inputs: str, hint: str | None = None, **attrs) -> str:
        if OPS.get(op) != len(inputs):
            raise GraphError(f"op {op!r} with {len(inputs)} inputs (known: {OPS})")
        known = self._known()
        missing = [i for i in inputs if i not in known]
        if missing:
            raise GraphError(f"op {op}: undefined input(s) {missing}")
        if op == "unary" and attrs.get("fn") not in UNARY or op == "binary" and attrs.get("fn") not in BINARY:
            raise GraphError(f"op {op}: fn {attrs.get('fn')!r}")
        if op == "cast" and attrs.get("dtype") not in DTYPES:
            raise GraphError(f"cast to {attrs.get('dtype')!r}")
        out = self._fresh(hint or op)
        self.nodes.append(Node(op, tuple(inputs), out, dict(attrs)))
        return out

    def output(self, tensor: str, name: str, dtype: str) -> None:
        """Mark ``tensor`` as the engine output ``name`` of ``dtype`` (the translator checks it)."""
        if tensor not in self._known():
            raise GraphError(f"output {name}: undefined tensor {tensor!r}")
        self.outputs.append((tensor, name, dtype))

    # ---- helpers composed of the ops above (they add nodes; nothing new for a backend) --------------
    def mask(self, flags, shape: tuple, hint: str = "mask") -> str:
        """A bool tensor from 0/1 flags: int32 constant == 1 (TensorRT takes no bool weights)."""
        ones = self.constant(np.ones([1] * len(shape)), "int32", "one")
        return self.op("binary", self.constant(np.asarray(flags).reshape(shape), "int32", hint), ones, fn="equal",
                       hint=hint)

    def scalar(self, value: float, rank: int, dtype: str = "float32") -> str:
        return self.constant(np.full([1] * rank, value), dtype, "scalar")
