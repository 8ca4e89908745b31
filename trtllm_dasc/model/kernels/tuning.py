"""Tile choices of the decode's streaming kernels, measured on the device they run on, at warm-up.

A batch-1 decode step is bound by how fast its few-row products stream their weights (kernels/gemv.py, the
small MoE path in moe/small.py), and which tiles stream fastest depends on the shape and the GPU: on the
H200 the batch-1 products read their weights at 56-72% of copy bandwidth with the tiles that won an offline
sweep. So on a GPU these kernels go through Triton's autotuner over a few candidates around that choice,
keyed on the shape: the first call of each shape times the candidates (the engine's warm-up makes those
calls before it reports ready, and before any CUDA graph capture), later calls and graph replays use the
winner, which Triton keeps in the kernel cache for the next process (cache_results). Under Triton's interpreter (the CPU) and wherever a caller passes its own tiles, the fixed
heuristic runs instead: the interpreter's timings mean nothing, and the tests check every candidate's
results against the torch references anyway.
"""
from __future__ import annotations

import inspect
import os

import triton


def on_device() -> bool:
    """Whether kernels run compiled (autotuning means something), not in Triton's interpreter."""
    return os.environ.get("TRITON_INTERPRET") != "1"


def autotuned(fn, candidates: list[tuple[dict, int, int]], key: list[str], prune=None):
    """fn wrapped in Triton's autotuner over candidates [(meta-parameters, num_warps, num_stages)], keyed on
    the argument names in key; prune(configs, args) drops the candidates a shape cannot take (args: the
    launch's named arguments, constexprs included) and raises if none is left."""
    configs = [triton.Config(meta, num_warps=w, num_stages=s) for meta, w, s in candidates]
    # the winner is kept in Triton's cache dir (as fla keeps its own): a later process on the same kind of GPU
    # takes it without timing the candidates again, and engine/kernel_cache.py can ship it
    cache = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
    early = None
    if prune is not None:
        def early(configs, named_args, **kwargs):
            return prune(configs, {**named_args, **kwargs})
    return triton.autotune(configs=configs, key=key,
                           prune_configs_by={"early_config_prune": early} if early else None, **cache)(fn)
