"""The checkpoint pool of one rank, picked from its plan: a plain CheckpointPool; parallel.storage.BalancedPool
when storage balancing moves units between ranks; state.mixed.MixedPool (one pool per codec segment, each
of those kinds) for horizon precision."""
from __future__ import annotations

from trtllm_dasc.errors import UserError
from trtllm_dasc.state import CheckpointPool
from trtllm_dasc.state.mixed import MixedPool
from trtllm_dasc.parallel.storage import BalancedPool, exchanges


def checkpoint_pool(plan, budget_bytes: int, rank: int, all_to_all=None, device="cpu"):
    if exchanges(plan) and all_to_all is None:
        raise UserError(f"placement {plan.options.placement!r} moves checkpoint units between ranks: run it "
                        "through trtllm_dasc.parallel")
    if plan.options.bands is not None:
        moving = {t.segment for t in plan.storage.transfers} if plan.storage is not None else set()

        # a segment whose units move is balanced on every rank (the all-to-all needs them all)
        def segment_pool(s):
            return BalancedPool(plan, budget_bytes, rank, all_to_all, device=device, segment=s) if s in moving else None
        return MixedPool.from_plan(plan, budget_bytes, rank, device=device, segment_pool=segment_pool)
    if exchanges(plan):
        return BalancedPool(plan, budget_bytes, rank, all_to_all, device=device)
    return CheckpointPool.from_plan(plan, budget_bytes, rank, device=device)
