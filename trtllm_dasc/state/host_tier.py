"""HostTier: the host-memory copies of compressed checkpoints (the cache's host tier, cache/radix.py invariant 7).

One host tensor per slot-indexed tensor of the checkpoint pool (payload, scales, conv; each codec segment's
of a mixed-precision pool; a balanced pool's own slots), [H, ...] with the same dtype and per-slot shape, so
a host slot holds exactly the encoded bytes of a device slot: the codecs never run for a tier move. Pinned
memory on a GPU (asynchronous copies), plain memory on a CPU (synchronous ones). Tensors only: which host
slot holds which checkpoint is the radix cache's bookkeeping.

Copies of one step: every demotion (device -> host, on the compute stream, so it reads the slot after the
stores that filled it and before this step's stores reuse it), then every promotion (host -> device, on the
tier's own CUDA stream, after the demotions; the step's loads wait on its event).
"""
from __future__ import annotations

import torch

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
    def __init__(self, pool, num_slots: int, device="cpu"):
        if num_slots < 1:
            raise PoolError("a host tier needs at least one slot")
        self.num_slots = num_slots
        self.device = torch.device(device)
        self.tensors = slot_tensors(pool)
        pin = self.device.type == "cuda"
        self.host = [torch.zeros((num_slots, *t.shape[1:]), dtype=t.dtype, pin_memory=pin) for t in self.tensors]
        self.stream = torch.cuda.Stream(self.device) if pin else None
        self.copy_seconds = 0.0

    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.host)

    def demote(self, pairs: list[tuple[int, int]]) -> None:
        """Write device slot d into host slot h for each (d, h), on the current stream (in order)."""
        for d, h in pairs:
            for dev, host in zip(self.tensors, self.host):
                host[h].copy_(dev[d], non_blocking=self.stream is not None)

    def promote(self, pairs: list[tuple[int, int]]):
        """Copy host slot h into device slot d for each (h, d). On a GPU: on the tier's stream, after
        everything queued so far on the current one (the demotions); returns the event the loads wait on
        (None on a CPU, where the copies are done on return)."""
        if self.stream is None:
            for h, d in pairs:
                for dev, host in zip(self.tensors, self.host):
                    dev[d].copy_(host[h])
            return None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for h, d in pairs:
                for dev, host in zip(self.tensors, self.host):
                    dev[d].copy_(host[h], non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        return done

    def run(self, demotions, promotions) -> None:
        """One step's copies, the current stream waiting for the promotions before anything reads a slot."""
        if demotions:
            self.demote(demotions)
        if promotions:
            done = self.promote(promotions)
            if done is not None:
                torch.cuda.current_stream(self.device).wait_event(done)
