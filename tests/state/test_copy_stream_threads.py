"""The copy stream's seconds are read from two threads: the engine loop (HostTier._begin, before each step's
copies) and the metrics endpoint (Engine.stats -> tier_report). Each finished span counts once (the CUDA
stream's events are faked here: the bookkeeping is what is tested, so it runs without a GPU)."""
import threading

import torch

from trtllm_dasc.state.copy_stream import CudaCopyStream


class _Start:
    def elapsed_time(self, end) -> float:
        return 1000.0                       # ms: each span is one second


class _End:
    """A finished event whose first query stalls until ``go`` (the reading thread is preempted there)."""

    def __init__(self, inside: threading.Event, go: threading.Event):
        self.inside, self.go, self.calls = inside, go, 0

    def query(self) -> bool:
        self.calls += 1
        if self.calls == 1:
            self.inside.set()
            self.go.wait(5)
        return True


def test_a_span_read_by_two_threads_at_once_counts_once(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: object())
    s = CudaCopyStream("cuda")
    inside, go = threading.Event(), threading.Event()
    s._spans.append((_Start(), _End(inside, go)))
    metrics = threading.Thread(target=s.seconds)
    metrics.start()
    assert inside.wait(5)
    # the loop reads the seconds while the metrics thread is inside its read
    loop = threading.Thread(target=s.seconds)
    loop.start()
    loop.join(0.5)
    go.set()
    metrics.join(5)
    loop.join(5)
    assert not metrics.is_alive() and not loop.is_alive()
    assert s.seconds() == 1.0
