"""What one TP rank's model takes in device memory, counted before anything is loaded.

The loader itself runs on PyTorch's meta device (shapes, no storage) with a source that hands out empty
meta tensors under the real source's names, so the count is the loader's own (every slice, stack and
concatenation it makes at this rank and TP degree), costs no memory and reads no weight. A model that
does not fit is refused here in one line, naming what it needs and what the device has, instead of
failing with an out-of-memory error minutes into loading 96 GB of weights. The count includes the largest
step's transient tensors (model/workspace.py), so a limit that holds the model but not a step is refused too.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from trtllm_dasc.errors import UserError
from trtllm_dasc.model.model import HybridModel
from trtllm_dasc.model.workspace import StepShape, workspace_of

GIB = 1 << 30


class MetaSource:
    """The names and shapes of `src` (any weight source), as meta tensors: nothing is read or made."""

    def __init__(self, src):
        self.src = src

    def has(self, name: str) -> bool:
        return self.src.has(name)

    def get(self, name: str, shape) -> torch.Tensor:
        # the decay tensors and the router stay fp32 like the real ones; the loader casts the rest
        return torch.empty(tuple(shape), dtype=torch.float32, device="meta")


class _MetaConcat(TorchFunctionMode):
    """torch.cat of meta tensors as its shape alone. PyTorch's meta kernel for cat is a Python reference whose
    first call imports torch._dynamo, which nothing else on the serving path needs: 3-7 s of every engine
    start on a 2-core CPU (the server's ready time was mostly this) for a shape that is a sum of sizes."""

    CATS = (torch.cat, torch.concat, torch.concatenate)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.CATS and kwargs.get("out") is None:
            tensors = list(args[0] if args else kwargs["tensors"])
            dim = args[1] if len(args) > 1 else kwargs.get("dim", kwargs.get("axis", 0))
            if tensors and isinstance(dim, int) and all(t.device.type == "meta" for t in tensors):
                # cat skips 1-D empty tensors (its legacy rule); the rest agree off `dim` (the loader's own
                # cat on real devices checks that)
                parts = [t for t in tensors if t.shape != (0,)] or tensors[:1]
                shape = list(parts[0].shape)
                if shape:
                    d = dim % len(shape)
                    shape[d] = sum(t.shape[d] for t in parts)
                    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
                    return torch.empty(shape, dtype=dtype, device="meta")
        return func(*args, **kwargs)


def tensor_bytes(root, elements: bool = False) -> int:
    """Bytes (elements=True: elements) of the distinct tensors reachable from root (dicts, lists, tuples,
    objects' attributes); a view counts as its base, a tensor reached twice (tied embeddings) once."""
    seen_obj, seen_base, total = set(), set(), 0
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen_obj:
            continue
        seen_obj.add(id(obj))
        if isinstance(obj, torch.Tensor):
            base = obj if obj._base is None else obj._base
            if id(base) not in seen_base:
                seen_base.add(id(base))
                total += base.numel() * (1 if elements else base.element_size())
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif type(obj).__module__.startswith("trtllm_dasc."):
            attrs = getattr(obj, "__dict__", None) or {}
            slots = [getattr(obj, s) for c in type(obj).__mro__ for s in getattr(c, "__slots__", ())
                     if hasattr(obj, s)]
            stack.extend([*attrs.values(), *slots])
    return total


@dataclass(slots=True)
class Footprint:
    weights: int            # this rank's weights
    kv: int                 # the paged KV cache of the full-attention layers
    state: int              # the running requests' recurrent-state rows
    pool: int               # the checkpoint pool (its budget)
    workspace: int = 0      # the largest step's transient tensors (model/workspace.py; 0: not counted)

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.state + self.pool + self.workspace

    def describe(self) -> str:
        parts = [f"weights {self.weights / GIB:.2f}", f"KV cache {self.kv / GIB:.2f}",
                 f"state rows {self.state / GIB:.2f}", f"checkpoint pool {self.pool / GIB:.2f}",
                 f"step workspace {self.workspace / GIB:.2f}"]
        return f"{self.total:,} B ({self.total / GIB:.2f} GiB: {' + '.join(parts)} GiB)"


def model_footprint(cfg, src, *, dtype: str, tp_rank: int, tp_size: int, bundle_order, state_rows: int,
                    kv_blocks: int, block_size: int, pool_bytes: int, step: StepShape | None = None) -> Footprint:
    """The bytes one rank's model, state rows, KV cache and checkpoint pool take (HybridConfig cfg, any
    weight source src: only its names are asked), and the transient tensors of a step of `step`'s shape
    (model/workspace.py largest_step: the engine's paths pass its largest; None: not counted)."""
    # the torch recurrence: the backend choice reads the device, and meta has no kernels to pick
    with _MetaConcat():
        model = HybridModel.from_source(cfg, MetaSource(src), dtype=dtype, device="meta", tp_rank=tp_rank,
                                        tp_size=tp_size, bundle_order=bundle_order, backend="torch")
    state = model.new_state(state_rows)
    kv = model.new_kv_cache(kv_blocks, block_size)
    workspace = 0 if step is None else workspace_of(cfg.schema, step, getattr(torch, dtype).itemsize, tp_size)["total"]
    return Footprint(weights=tensor_bytes((model.w, model.layers)), kv=tensor_bytes(kv.pools),
                     state=tensor_bytes((state.temporal, state.conv)), pool=pool_bytes, workspace=workspace)


def device_free_bytes(device: str) -> int | None:
    """Free memory of a CUDA device now (what a load can still take); None for the CPU (not checked)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(dev)
    return int(free)


def check_fits(need: Footprint, has: int | None, where: str) -> None:
    """One-line refusal when `need` is more than `has` bytes (None: nothing to check against)."""
    if has is not None and need.total > has:
        raise UserError(f"the model does not fit {where}: it needs {need.describe()} per rank and {where} has "
                        f"{has:,} B ({has / GIB:.2f} GiB); use more TP ranks, fewer --kv-blocks, a smaller "
                        f"--state-budget-bytes or a smaller step (--max-num-tokens, --max-batch-size)")
