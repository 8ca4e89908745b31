"""MixedPool: one checkpoint of horizon precision (issue 35) as one pool per codec segment.

A horizon-precision plan (plan/precision.py) gives every kept unit a codec from its horizon band and packs
each rank's units ragged by codec: segment s holds the units of codec_segments[s] at its own slot positions
(payload [S, width_s, unit bytes of that codec], its scales), and one segment, plan.conv_segment, also the
conv state. Each segment is an ordinary uniform-codec pool whose layout marks the other segments' units
*foreign* (StateLayout.foreign): its store reads only its own units, its load writes only its own units and
zeroes only the omitted ones. So a load is: the first segment with the caller's zero_fill (omitted units
zeroed once), every other segment without; the slot ids are shared, slot s of every segment together is
checkpoint s.

The segment pools are CheckpointPools, or (storage balancing with transfers in that segment)
parallel.storage.BalancedPool segments built by the engine; this module only composes them (state/ does not
import dist/). Bytes: sum over segments of width_s * unit_bytes(codec_s) + conv = the planner's
mixed_slot_bytes_per_rank (Eq. 8 with mixed widths), so N from the bottleneck rank fits the budget.
"""
from __future__ import annotations

from trtllm_dasc.state.layout import StateLayout
from trtllm_dasc.state.pool import CheckpointPool, PoolError
from trtllm_dasc.plan.accounting import slots_for_budget


class MixedPool:
    """The CheckpointPool interface (store/load/num_slots/slot_bytes/sanity_check/memory_report) over
    ``segments``: (codec, pool) per present codec segment, in plan order."""

    def __init__(self, segments: list[tuple[str, object]], budget_bytes: int):
        if not segments:
            raise PoolError("a mixed-precision checkpoint with no segment: no unit and no conv state to store")
        n = {p.num_slots for _, p in segments}
        if len(n) != 1:
            raise PoolError(f"codec segments disagree on the slot count: {sorted(n)}")
        self.segments = segments
        self.budget_bytes = budget_bytes
        self.num_slots = n.pop()
        self.slot_bytes = sum(p.slot_bytes for _, p in segments)

    @classmethod
    def from_plan(cls, plan, budget_bytes: int, rank: int = 0, device="cpu", segment_pool=None) -> "MixedPool":
        """Rank ``rank``'s pools. segment_pool(s) -> pool or None overrides segment s (the engine passes the
        storage all-to-all's BalancedPool for segments whose units move between ranks)."""
        n = slots_for_budget(budget_bytes, plan.bottleneck_slot_bytes())
        segments = []
        for s, codec in enumerate(plan.codec_segments):
            pool = segment_pool(s) if segment_pool is not None else None
            if pool is None:
                layout = StateLayout.from_plan(plan, rank, segment=s)
                # a segment without units or conv state on this rank costs nothing and stores nothing
                if layout.slot_bytes() == 0:
                    continue
                pool = CheckpointPool(layout, budget_bytes, device=device, max_slots=n)
            segments.append((codec, pool))
        return cls(segments, budget_bytes)

    def sanity_check(self) -> None:
        for _, p in self.segments:
            p.sanity_check()
        assert self.allocated_bytes() == (self.num_slots + 1) * self.slot_bytes <= self.budget_bytes

    def allocated_bytes(self) -> int:
        return sum(p.allocated_bytes() for _, p in self.segments)

    # ---- data movement ------------------------------------------------------------------------------
    def store(self, temporal, conv, rows, slots, backend: str = "auto") -> None:
        """Checkpoint active rows[b] into slots[b]: each segment encodes its own units."""
        for _, p in self.segments:
            p.store(temporal, conv if _has_conv(p) else None, rows, slots, backend=backend)

    def load(self, slots, temporal, conv, rows, zero_fill: bool = True, backend: str = "auto") -> None:
        """Restore slots[b] into rows[b]: omitted units zeroed once (the first segment), foreign ones each
        written by the segment that stores them."""
        for i, (_, p) in enumerate(self.segments):
            p.load(slots, temporal, conv if _has_conv(p) else None, rows, zero_fill=zero_fill and i == 0,
                   backend=backend)

    # ---- accounting ---------------------------------------------------------------------------------
    def memory_report(self) -> dict:
        parts = [dict(p.memory_report(), codec=c) for c, p in self.segments]
        out = {"slots": self.num_slots, "physical_slots": self.num_slots + 1, "slot_bytes": self.slot_bytes,
               "codec": "mixed", "layout": "ragged", "budget_bytes": self.budget_bytes,
               "total_bytes": self.allocated_bytes(), "segments": parts}
        for key in ("width", "temporal_bytes_per_slot", "scale_bytes_per_slot", "conv_bytes_per_slot",
                    "temporal_bytes", "scale_bytes", "conv_bytes"):
            out[key] = sum(p.get(key, 0) for p in parts)
        units = sum(p["width"] for p in parts)
        out["unit_bytes"] = (out["temporal_bytes_per_slot"] + out["scale_bytes_per_slot"]) / units if units else None
        return out


def _has_conv(pool) -> bool:
    layout = getattr(pool, "staging", None) or pool.layout
    return layout.conv_dim > 0
