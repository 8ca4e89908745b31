"""Stage 2 of TP balancing: the TP group as one storage pool (paper Sec. 4.3).

Each rank packs its U_r kept units in compute-local order. The target per-rank slot width is
C = ceil(sum_r U_r / T). On store, a rank with U_r > C keeps its first C units and sends the tail to
ranks below C (a variable-split all-to-all); on load the inverse transfer brings them home before the
compute-local state is restored. Only remotely stored units move, each exactly once.

The ragged layout balances one segment (all layers together). The padded layout balances each layer as
its own segment, since every layer reserves the same width there.

Slot positions on a rank: its own first min(U_r, C) units at [0, min(U_r, C)), then received units in
ascending source-rank order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class Transfer:
    """``count`` consecutive units move from src's compute-local position ``src_start`` (within the
    segment) to dst's slot position ``dst_start`` (within the segment)."""

    segment: int
    src: int
    dst: int
    src_start: int
    dst_start: int
    count: int

    def to_dict(self) -> dict:
        return {"segment": self.segment, "src": self.src, "dst": self.dst,
                "src_start": self.src_start, "dst_start": self.dst_start, "count": self.count}


@dataclass(slots=True)
class StoragePlan:
    widths: list[int]          # per segment: C (slot positions every rank reserves)
    transfers: list[Transfer]  # the store direction; load applies each in reverse

    @property
    def moved_units(self) -> int:
        return sum(t.count for t in self.transfers)

    def sends(self, src: int) -> list[Transfer]:
        return [t for t in self.transfers if t.src == src]

    def receives(self, dst: int) -> list[Transfer]:
        return [t for t in self.transfers if t.dst == dst]


def balance_segment(counts: list[int], segment: int = 0) -> tuple[int, list[Transfer]]:
    """counts[r]: units rank r holds. Returns (C, transfers) moving surplus tails to deficit ranks."""
    tp = len(counts)
    width = math.ceil(sum(counts) / tp) if counts else 0
    fill = [min(c, width) for c in counts]          # next free slot position per rank
    transfers = []
    dst = 0
    for src, count in enumerate(counts):
        pos = width
        while pos < count:
            while fill[dst] >= width:
                dst += 1
            n = min(count - pos, width - fill[dst])
            transfers.append(Transfer(segment, src, dst, pos, fill[dst], n))
            fill[dst] += n
            pos += n
    # received units must follow in ascending source order on every rank (the layout promise above):
    # surplus sources are scanned in rank order and deficits filled in rank order, which gives that.
    return width, transfers


def balance_storage(counts_per_segment: list[list[int]]) -> StoragePlan:
    """counts_per_segment[s][r]: units of segment s that rank r computes."""
    widths, transfers = [], []
    for s, counts in enumerate(counts_per_segment):
        width, moves = balance_segment(counts, s)
        widths.append(width)
        transfers.extend(moves)
    return StoragePlan(widths, transfers)

