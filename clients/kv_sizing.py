"""The KV cache of a matched-HBM measurement, sized to fit beside the weights.

dasc-build's default KV cache is a fixed block count; clients.matched_hbm's default is enough that KV never
decides a hit (every prompt of the largest capacity-boundary block at its longest, plus the running
requests). At the full size of a released model on one GPU that is more than the device holds beside the
weights (Kimi-Linear-48B on an H200: 36 GiB of KV beside 91.5 GiB of weights, 7.8 GiB of state rows and the
checkpoint pool). With a memory limit, the KV cache is the smaller of that need and the most blocks that fit,
counted by the engine's own footprint (model/footprint.py: what the runner checks before loading, and
dasc-build checks at build with --memory-limit-bytes, which the client passes on):

    weights + state rows (2 x max batch + 1) + checkpoint pool (the budget) + the largest step's tensors
    + (blocks + 1) x block bytes <= limit

(+1: the engine's padding row and block; the step's tensors: model/workspace.py at the engine's largest_step,
as many captures as one step can take). Each phase is covered when its largest block's
prompts and the running requests fit; the manifest says which are. A limit of 'device' is the device's total
less what the engine's count leaves out: a headroom (DEFAULT_HEADROOM_GIB, measured) for the CUDA context,
workspaces and kernel modules. The step's tensors are in the engine's count (its fixed bytes), so the device
limit does not subtract them again.
"""
from __future__ import annotations

import math

from trtllm_dasc.errors import UserError

GIB = 1 << 30


def engine_fixed_and_block_bytes(cfg, source, *, dtype: str, tp: int, bundle_order, max_batch: int,
                                 block_size: int, budget: int, step=None) -> tuple[int, int]:
    """(bytes one rank takes besides its KV cache, bytes of one KV block), from the engine's footprint; with
    `step` (model/workspace.py StepShape: the engine's largest_step) the fixed bytes include its tensors."""
    from trtllm_dasc.model.footprint import model_footprint

    def at(blocks):
        return model_footprint(cfg, source, dtype=dtype, tp_rank=0, tp_size=tp, bundle_order=bundle_order,
                               state_rows=2 * max_batch + 1, kv_blocks=blocks + 1, block_size=block_size,
                               pool_bytes=budget, step=step)
    one, two = at(1), at(2)
    per_block = two.kv - one.kv
    return one.total - 2 * per_block, per_block


def blocks_that_fit(limit: int, fixed: int, per_block: int) -> int:
    """The most KV blocks with fixed + (blocks + 1) x per_block <= limit (0 when none)."""
    return max(0, (limit - fixed) // per_block - 1)


def need_blocks(q: int, max_batch: int, blocks_per_request: int) -> int:
    """KV blocks for every prompt of a block of q at its longest plus the running requests."""
    return (q + max_batch) * blocks_per_request


def plan_kv(phases: list, *, max_batch: int, blocks_per_request: int, limit: int | None, fixed: int | None,
            per_block: int | None) -> dict:
    """The KV cache for these phases: {'blocks', 'need', 'fit', 'covered' (phase names), 'not_covered'}.
    Without a limit the need (the earlier default); with one the smaller of need and fit. The full-dataset
    phase is past every arm's capacity by design and never counted in the need."""
    bounded = [p for p in phases if p.arms != ["full dataset"]] or list(phases)
    need = need_blocks(max(p.q for p in bounded), max_batch, blocks_per_request)
    fit = None if limit is None else blocks_that_fit(limit, fixed, per_block)
    blocks = need if fit is None else min(need, fit)
    covered = [p.name for p in bounded if need_blocks(p.q, max_batch, blocks_per_request) <= blocks]
    out = {"blocks": blocks, "need": need, "fit": fit, "covered": covered,
           "not_covered": [p.name for p in bounded if p.name not in covered]}
    if limit is not None:
        out.update(limit_bytes=limit, fixed_bytes=fixed, block_bytes=per_block,
                   total_bytes=fixed + (blocks + 1) * per_block)
    return out


# What `--memory-limit-bytes device` leaves beside the engine's count (which includes its largest step's
# tensors, model/workspace.py), in GiB. Measured on an H200 with Kimi-Linear-48B-A3B (dummy weights, batch 96,
# 8192-token steps, the matched-HBM cells of 12-02): with 24.0 GiB of the device outside the engine's count of
# then (weights, KV, state rows, pool; limit 125e9 B) the fill's Triton kernels ran out of memory, with 30.5 GiB
# (118e9 B) it ran; at 8 GiB the dense server died in warm-up. So about 30.55 GiB must stay outside weights, KV,
# rows and pool. The step's tensors at their bound (96 prompt-end captures in one step: 9.28 GiB of the 30.55)
# are in the engine's count now; the rest, 21.27 GiB, is not the step's activations: the CUDA context, cuBLAS /
# cuDNN workspaces, the loaded kernel modules and their local-memory reservations, which the driver allocates
# beside torch's caching allocator (it keeps what it freed, so the driver's own allocations fail first). With
# it the KV cache of that run is what it was (39,451 blocks against 39,462 when the step was counted at 6
# captures and the headroom was 28.3 GiB).
DEFAULT_HEADROOM_GIB = 21.27


def limit_from_total(total: int, headroom_gib: float) -> int:
    """A device of `total` bytes less the headroom (DEFAULT_HEADROOM_GIB's comment); the engine's count holds
    the step's tensors."""
    return total - int(math.ceil(headroom_gib * GIB))


def device_limit(device: str, headroom_gib: float) -> int:
    """This CUDA device's total memory less the headroom (the CUDA context, workspaces, kernel modules) that
    the engine's footprint does not count."""
    import torch
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise UserError("--memory-limit-bytes device needs a CUDA device: give a number of bytes instead")
    return limit_from_total(torch.cuda.get_device_properties(dev).total_memory, headroom_gib)


def add_memory_arguments(group) -> None:
    """--memory-limit-bytes and --memory-headroom-gib, as every client that sizes a KV cache takes them
    (clients.matched_hbm, benchmarks serve_wr_fixed_slots); check_memory_arguments parses them."""
    group.add_argument("--memory-limit-bytes", default=None, help="device memory one rank may take (weights, KV, "
                       "state rows, checkpoint pool, the largest step's tensors; the engine checks it at build and "
                       "load): bytes, or 'device' (this CUDA device's total less --memory-headroom-gib). Sizes the "
                       "default KV cache to fit")
    group.add_argument("--memory-headroom-gib", type=float, default=None, help="with --memory-limit-bytes device: "
                       "what is kept free beside the engine's count (weights, KV, state rows, pool, the largest "
                       "step's tensors): the CUDA context, workspaces, kernel modules; default "
                       f"{DEFAULT_HEADROOM_GIB}, from the H200 run of Kimi-Linear-48B (clients/kv_sizing.py)")


def check_memory_arguments(args) -> None:
    """args.memory_limit_bytes as None, 'device' or a positive int; args.memory_headroom_gib filled with its
    default and >= 0. Bad input: UserError, one line."""
    limit = getattr(args, "memory_limit_bytes", None)
    if limit is not None and limit != "device":
        try:
            args.memory_limit_bytes = int(limit)
        except ValueError:
            raise UserError(f"--memory-limit-bytes must be a number of bytes or 'device', got {limit!r}") from None
        if args.memory_limit_bytes < 1:
            raise UserError(f"--memory-limit-bytes must be >= 1, got {limit}")
    if getattr(args, "memory_headroom_gib", None) is None:
        args.memory_headroom_gib = DEFAULT_HEADROOM_GIB
    if args.memory_headroom_gib < 0:
        raise UserError("--memory-headroom-gib must be >= 0")
