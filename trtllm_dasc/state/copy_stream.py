"""The host tier's copy stream: copies between device slots and host slots, off the compute stream.

Two implementations of one interface (queue copies in order, record an event after them, make the compute
stream wait for an event, ask whether one is done):

  CudaCopyStream      a side CUDA stream; the copies run while the compute stream runs the step
  DeferredCopyStream  the torch reference (CPU): copies are queued and run only when something waits on
                      them, the latest moment a real side stream may run them, so a missing wait shows as
                      wrong bytes in a test instead of a race that passes by luck

Both run their copies in queue order (a stream is FIFO): a promotion from a host slot that a queued
demotion is still writing reads what the demotion wrote. Both count the seconds their copies ran
(``seconds()``, the metrics' copy seconds): CUDA's timing events around each batch, read once done; the
reference's wall time in its copies.
"""
from __future__ import annotations

import threading
import time

import torch


class DeferredCopyStream:
    # queued copies beyond this run at the next queue (a real stream makes progress: memory stays bounded)
    LIMIT = 4096

    def __init__(self):
        self.queue: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.done = self.queued = 0
        self._seconds = 0.0

    def after_current(self) -> None:
        """Order the next copies after the compute stream's work so far (on a CPU that work is done)."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        # refused now what copy_ would refuse when it runs (shapes), as CUDA's copy refuses it at launch: a
        # queued copy of plain memory then cannot fail, and the tier knows which copy failed (host_tier.py)
        if torch.broadcast_shapes(dst.shape, src.shape) != dst.shape:
            raise RuntimeError(f"a copy of {tuple(src.shape)} into {tuple(dst.shape)}")
        # views: the source is read when the copy runs, not now
        self.queue.append((dst, src))
        self.queued += 1
        if len(self.queue) > self.LIMIT:
            self.wait(self.queued - self.LIMIT)

    def record(self) -> int:
        """An event: every copy queued so far."""
        return self.queued

    def wait(self, event: int) -> None:
        """The compute stream waits for the event: run the copies up to it."""
        t0 = time.perf_counter()
        while self.done < event:
            dst, src = self.queue.pop(0)
            dst.copy_(src)
            self.done += 1
        self._seconds += time.perf_counter() - t0

    def query(self, event: int) -> bool:
        return self.done >= event

    def synchronize(self) -> None:
        self.wait(self.queued)

    def seconds(self) -> float:
        """Seconds spent in copies that ran so far."""
        return self._seconds

    def reset_seconds(self) -> None:
        """Count from zero again (the engine's reset_stats: warm-up's copies are not the users')."""
        self._seconds = 0.0


class CudaCopyStream:
    def __init__(self, device):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)
        # timing: (start, end) event pairs not yet read; a batch's start is recorded after its wait on the
        # compute stream, so the span holds copies only, never the wait
        self._spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._mark = None
        self._seconds = 0.0
        # seconds() runs on the engine loop (HostTier._begin) and on the metrics thread (Engine.stats): without
        # it both could add the same finished span, or one drop a span the loop recorded meanwhile
        # (parallel/exchange_clock.py guards its events the same way)
        self._lock = threading.Lock()

    def after_current(self) -> None:
        # a demotion reads a slot the compute stream's earlier stores filled
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        self._mark = torch.cuda.Event(enable_timing=True)
        self._mark.record(self.stream)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        # pinned host memory: asynchronous in both directions
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)

    def record(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=self._mark is not None)
        event.record(self.stream)
        if self._mark is not None:
            # the next record's span starts here (demote then promote in one batch: no second count)
            with self._lock:
                self._spans.append((self._mark, event))
            self._mark = event
        return event

    def wait(self, event: torch.cuda.Event) -> None:
        # the compute stream waits on the device; the host thread does not block
        torch.cuda.current_stream(self.device).wait_event(event)

    def query(self, event: torch.cuda.Event) -> bool:
        return event.query()

    def synchronize(self) -> None:
        self.stream.synchronize()

    def seconds(self) -> float:
        """Seconds of the copies finished so far (spans still running are read on a later call)."""
        with self._lock:
            left = []
            for start, end in self._spans:
                if end.query():
                    self._seconds += start.elapsed_time(end) / 1e3
                else:
                    left.append((start, end))
            self._spans = left
            return self._seconds

    def reset_seconds(self) -> None:
        """Count from zero again: the spans recorded so far, finished or not, are the time before the reset."""
        with self._lock:
            self._spans, self._seconds = [], 0.0


def copy_stream(device):
    """The side stream of a device: CUDA's own, or the deferred reference on a CPU."""
    device = torch.device(device)
    return CudaCopyStream(device) if device.type == "cuda" else DeferredCopyStream()
