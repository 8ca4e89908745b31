"""HostTier: the host-memory copies of compressed checkpoints (the cache's host tier, cache/radix.py invariant 7).

One host tensor per slot-indexed tensor of the checkpoint pool (payload, scales, conv; each codec segment's
of a mixed-precision pool; a balanced pool's own slots), [H, ...] with the same dtype and per-slot shape, so
a host slot holds exactly the encoded bytes of a device slot: the codecs never run for a tier move. Pinned
memory on a GPU (asynchronous copies), plain memory on a CPU (synchronous ones). Tensors only: which host
slot holds which checkpoint is the radix cache's bookkeeping.

Copies are asynchronous, off the compute stream (state/copy_stream.py: a side CUDA stream on a GPU, the
deferred torch reference on a CPU), in queue order: a step's demotions (device -> host), then its promotions
(host -> device). The step waits for none of them up front; ``wait_slots`` makes the compute stream wait,
per device slot, for the last copy that reads or writes it, and the runner calls it right before a load
reads a slot or a store overwrites one. So a demotion overlaps the step's forward (its slot's reuse by a
capture waits at the store, after the forward), and a slot is never reused before its copy has read it.
A promotion from a host slot a queued demotion is still writing (a hit on a checkpoint being demoted)
reads the demoted bytes: the stream is FIFO. The host thread never reads the host tensors.
"""
from __future__ import annotations

import torch

from trtllm_dasc.state.copy_stream import copy_stream
from trtllm_dasc.state.pool import PoolError


def slot_tensors(pool) -> list[torch.Tensor]:
    """The pool's tensors indexed by checkpoint slot along dim 0, in a fixed order."""
    if hasattr(pool, "segments"):
        return [t for _, p in pool.segments for t in slot_tensors(p)]
    # parallel.storage.BalancedPool keeps its slots in an inner CheckpointPool
    inner = getattr(pool, "pool", None)
    if inner is not None and not hasattr(pool, "payload"):
        return slot_tensors(inner)
    return [t for t in (pool.payload, pool.scales, pool.conv) if t is not None]


def host_slots_for(host_bytes: int, slot_bytes: int) -> int:
    """Host slots a byte budget holds (every rank the same count: the caller passes the bottleneck's bytes)."""
    if host_bytes and host_bytes < slot_bytes:
        raise PoolError(f"host cache of {host_bytes} B holds no checkpoint: one takes {slot_bytes} B")
    return host_bytes // slot_bytes


class HostTier:
    def __init__(self, pool, num_slots: int, device="cpu", stream=None, tensors=None):
        """``tensors``: the slot-indexed tensors to mirror instead of the pool's (the KV cache's blocks);
        ``stream``: a copy stream to share (the KV and checkpoint tiers queue on one: FIFO across both)."""
        if num_slots < 1:
            raise PoolError("a host tier needs at least one slot")
        self.num_slots = num_slots
        self.device = torch.device(device)
        self.tensors = slot_tensors(pool) if tensors is None else list(tensors)
        pin = self.device.type == "cuda"
        self.host = [torch.zeros((num_slots, *t.shape[1:]), dtype=t.dtype, pin_memory=pin) for t in self.tensors]
        self.stream = copy_stream(self.device) if stream is None else stream
        # device slot -> the event of the last queued copy that reads or writes it
        self.pending: dict[int, object] = {}
        # bytes queued per direction (the metrics' copy bytes): one slot is a row of every mirrored tensor
        self.slot_bytes = sum(t[0].numel() * t.element_size() for t in self.host)
        self.copied = {"to_host": 0, "to_device": 0}

    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.host)

    def _copy(self, to_host: bool, d: int, h: int) -> None:
        """Queue one slot's copy between device slot d and host slot h, every mirrored tensor."""
        for dev, host in zip(self.tensors, self.host):
            if to_host:
                self.stream.copy(host[h], dev[d])
            else:
                self.stream.copy(dev[d], host[h])
        self.copied["to_host" if to_host else "to_device"] += self.slot_bytes

    def demote(self, pairs: list[tuple[int, int]]):
        """Queue device slot d -> host slot h for each (d, h); returns their event."""
        for d, h in pairs:
            self._copy(True, d, h)
        return self.stream.record()

    def promote(self, pairs: list[tuple[int, int]]):
        """Queue host slot h -> device slot d for each (h, d), after every copy queued before; returns their event."""
        for h, d in pairs:
            self._copy(False, d, h)
        return self.stream.record()

    def _begin(self) -> None:
        """Before queueing a step's copies: forget the copies already done (on a GPU the table would otherwise
        only grow), read the finished copies' timing events (they would otherwise pile up between scrapes),
        and order the copies after the compute stream's work so far."""
        self.pending = {d: e for d, e in self.pending.items() if not self.stream.query(e)}
        self.stream.seconds()
        self.stream.after_current()

    def run(self, demotions, promotions) -> None:
        """Queue one step's copies (after the compute stream's work so far); nothing waits for them here."""
        if not demotions and not promotions:
            return
        self._begin()
        if demotions:
            done = self.demote(demotions)
            self.pending.update((d, done) for d, _ in demotions)
        if promotions:
            done = self.promote(promotions)
            self.pending.update((d, done) for _, d in promotions)

    def run_ordered(self, copies) -> None:
        """Queue ("demote", device, host) and ("promote", host, device) copies in the given order."""
        if not copies:
            return
        self._begin()
        for kind, a, b in copies:
            self._copy(kind == "demote", *((a, b) if kind == "demote" else (b, a)))
        done = self.stream.record()
        self.pending.update(((a if kind == "demote" else b), done) for kind, a, b in copies)

    def wait_slots(self, slots) -> None:
        """The compute stream waits for every queued copy that reads or writes one of these device slots."""
        for s in set(slots):
            if s in self.pending:
                self.stream.wait(self.pending.pop(s))

    def synchronize(self) -> None:
        """Every queued copy done (shutdown, tests)."""
        self.stream.synchronize()
        self.pending.clear()
