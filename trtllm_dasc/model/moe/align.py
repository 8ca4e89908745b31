"""Tokens sorted and block-aligned by expert, on the device, without a host synchronisation (the step
before the grouped GEMMs of kernel.py; vLLM's moe_align_block_size in torch ops).

Every (token, slot) pair of the routing is one row id r = t * top_k + j. The rows are grouped by expert,
each expert's group padded with the sentinel N = T * top_k up to a multiple of BLOCK_M, so a block of
BLOCK_M rows belongs to one expert. The buffers have a size fixed by (T, top_k, E, BLOCK_M) (max_blocks):
a CUDA graph can hold them, and the kernels' grid covers max_blocks, blocks past num_post_padded exiting.
Only ops that keep their results on the device: scatter_add (not bincount, which reads its input's max on
the host), a stable sort, cumsum, searchsorted, scatter.
"""
from __future__ import annotations

import torch


def max_blocks(T: int, top_k: int, E: int, block_m: int) -> int:
    """The most blocks an alignment can need: each of the at most min(E, T*top_k) experts in use pads at
    most BLOCK_M - 1 rows."""
    n = T * top_k
    return (n + min(E, n) * (block_m - 1) + block_m - 1) // block_m


def moe_align(idx: torch.Tensor, E: int, block_m: int):
    """idx [T, top_k] expert ids -> (sorted_ids [max_blocks * BLOCK_M] int32: row ids grouped by expert in
    row order, padding = T * top_k; block_expert [max_blocks] int32: each block's expert, E past the end;
    num_post_padded [1] int32: the rows in use (a multiple of BLOCK_M); counts [E] int64: rows per expert)."""
    T, k = idx.shape
    n, dev = T * k, idx.device
    nb = max_blocks(T, k, E, block_m)
    flat = idx.reshape(-1).long()
    counts = torch.zeros(E, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends_padded = padded.cumsum(0)
    starts_padded, starts = ends_padded - padded, counts.cumsum(0) - counts
    # stable: within an expert rows keep their order (the kernels' result does not depend on it, tests'
    # reading of the buffers does)
    sorted_e, rows = torch.sort(flat, stable=True)
    rank = torch.arange(n, device=dev) - starts[sorted_e]
    sorted_ids = torch.full((nb * block_m,), n, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, starts_padded[sorted_e] + rank, rows.to(torch.int32))
    block_start = torch.arange(nb, device=dev) * block_m
    block_expert = torch.searchsorted(ends_padded, block_start, right=True).to(torch.int32)
    return sorted_ids, block_expert, ends_padded[-1:].to(torch.int32), counts
