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

A copy that cannot be queued (an ordinary exception: a bad slot id, a view or shape the copy refuses, host
memory) is that copy's alone: ``run`` and ``run_ordered`` queue the rest and return, per copy, why it failed,
so the engine fails only the requests that read what it was to write (engine/scheduler.py). A CUDA error is
raised instead (``corrupts_device``). A copy that fails once queued fails the step: on a GPU that is an
asynchronous, sticky CUDA error; the CPU reference refuses when queued what its later ``copy_`` would.
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


def corrupts_device(e: BaseException) -> bool:
    """Whether a failed copy may have broken more than its own slot: a CUDA error (an illegal address, a
    launch failure, a device-side assert) is sticky, so every later call on the device fails and no device
    memory can be trusted; that fails the whole step (under TP, the job). Any other exception is the copy's."""
    accel = getattr(torch, "AcceleratorError", None)
    if (accel is not None and isinstance(e, accel)) or isinstance(e, torch.cuda.CudaError):
        return True
    return "CUDA error" in str(e) or "CUDA driver error" in str(e)


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

    def reset_stats(self, stream: bool = True) -> None:
        """Zero the bytes copied (and, with ``stream``, the copy stream's seconds: tiers sharing one stream
        reset it once)."""
        self.copied = {d: 0 for d in self.copied}
        if stream:
            self.stream.reset_seconds()

    def _copy(self, to_host: bool, d: int, h: int) -> None:
        """Queue one slot's copy between device slot d and host slot h, every mirrored tensor."""
        for dev, host in zip(self.tensors, self.host):
            if to_host:
                self.stream.copy(host[h], dev[d])
            else:
                self.stream.copy(dev[d], host[h])
        self.copied["to_host" if to_host else "to_device"] += self.slot_bytes

    def _queue(self, to_host: bool, d: int, h: int) -> str | None:
        """Queue one copy (``_copy``); None, or why it could not be queued."""
        try:
            self._copy(to_host, d, h)
        except Exception as e:  # noqa: BLE001 - a copy that cannot be queued is its own requests' failure
            if corrupts_device(e):
                raise
            return f"{type(e).__name__}: {e}"
        return None

    def _begin(self) -> None:
        """Before queueing a step's copies: forget the copies already done (on a GPU the table would otherwise
        only grow), read the finished copies' timing events (they would otherwise pile up between scrapes),
        and order the copies after the compute stream's work so far."""
        self.pending = {d: e for d, e in self.pending.items() if not self.stream.query(e)}
        self.stream.seconds()
        self.stream.after_current()

    def run(self, demotions, promotions) -> list[str | None]:
        """Queue one step's copies (after the compute stream's work so far): device slot d -> host slot h for
        each demotion (d, h), then host slot h -> device slot d for each promotion (h, d); nothing waits for
        them here. Returns, per copy in that order, None or why it could not be queued."""
        if not demotions and not promotions:
            return []
        self._begin()
        errors = []
        # two events: a store into a demoted slot waits for the demotions alone
        for to_host, pairs in ((True, demotions), (False, [(d, h) for h, d in promotions])):
            if pairs:
                errors += [self._queue(to_host, d, h) for d, h in pairs]
                # a copy that failed halfway may have queued some tensors' rows: its slot waits for it too
                done = self.stream.record()
                self.pending.update((d, done) for d, _ in pairs)
        return errors

    def run_ordered(self, copies) -> list[str | None]:
        """Queue ("demote", device, host) and ("promote", host, device) copies in the given order; returns,
        per copy, None or why it could not be queued."""
        if not copies:
            return []
        self._begin()
        errors = [self._queue(kind == "demote", *((a, b) if kind == "demote" else (b, a))) for kind, a, b in copies]
        done = self.stream.record()
        self.pending.update(((a if kind == "demote" else b), done) for kind, a, b in copies)
        return errors

    def wait_slots(self, slots) -> None:
        """The compute stream waits for every queued copy that reads or writes one of these device slots."""
        for s in set(slots):
            if s in self.pending:
                self.stream.wait(self.pending.pop(s))

    def synchronize(self) -> None:
        """Every queued copy done (shutdown, tests)."""
        self.stream.synchronize()
        self.pending.clear()
