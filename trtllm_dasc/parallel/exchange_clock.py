"""Time spent in the storage balance's all-to-all (parallel/storage.py), per checkpoint store and load.

The paper's TP8 table reports the all-to-all time per store / load; the serving benchmark reads it from the
engine's stats. On a GPU the collective is queued on the stream like any kernel, so the clock records a CUDA
event pair around it and reads the pair only once the device has passed it (``Event.query``): the step never
waits for the clock. On a CPU (gloo) the call returns when the exchange is done: a wall clock suffices.
``report()`` may come from another thread (the metrics endpoint) while the loop records: one lock.
"""
from __future__ import annotations

import threading
import time

OPS = ("store", "load")


class ExchangeClock:
    def __init__(self, device):
        import torch
        self.cuda = torch.device(device).type == "cuda"
        self._lock = threading.Lock()
        # per op: checkpoint stores / loads that exchanged, collective calls, seconds, bytes this rank sent
        self._totals = {op: {"ops": 0, "calls": 0, "seconds": 0.0, "bytes_sent": 0} for op in OPS}
        self._pending: list[tuple[str, object, object]] = []     # (op, start event, end event) not read yet

    def op(self, op: str) -> None:
        """One checkpoint store or load (of a batch of slots) that ran the exchange."""
        with self._lock:
            self._totals[op]["ops"] += 1

    def time(self, op: str, bytes_sent: int, exchange) -> None:
        """Run exchange() (one collective) and charge its time to op."""
        if self.cuda:
            import torch
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            exchange()
            end.record()
            with self._lock:
                self._add(op, bytes_sent, 0.0)
                self._pending.append((op, start, end))
                if len(self._pending) > 256:         # never grow: fold what the device has finished
                    self._fold(wait=False)
            return
        t = time.perf_counter()
        exchange()
        with self._lock:
            self._add(op, bytes_sent, time.perf_counter() - t)

    def report(self, wait: bool = False) -> dict:
        """Per op: ops, calls, seconds, bytes_sent and ms_per_op (events the device has not reached yet are
        left for the next report unless ``wait``)."""
        with self._lock:
            self._fold(wait)
            out = {op: dict(t) for op, t in self._totals.items()}
        for t in out.values():
            t["ms_per_op"] = 1e3 * t["seconds"] / t["ops"] if t["ops"] else None
        return out

    # ---- under the lock ---------------------------------------------------------------------------
    def _add(self, op: str, bytes_sent: int, seconds: float) -> None:
        t = self._totals[op]
        t["calls"] += 1
        t["bytes_sent"] += bytes_sent
        t["seconds"] += seconds

    def _fold(self, wait: bool) -> None:
        keep = []
        for op, start, end in self._pending:
            if wait:
                end.synchronize()
            if end.query():
                self._totals[op]["seconds"] += start.elapsed_time(end) / 1e3
            else:
                keep.append((op, start, end))
        self._pending = keep
