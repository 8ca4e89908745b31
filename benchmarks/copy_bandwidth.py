"""The device's copy bandwidth, the roofline every memory-bound figure is set against (decode_step's weight
bound, state_bandwidth's store/load fraction): bytes read + written per second of a device-to-device copy
of ``nbytes``, median over ``reps`` copies after two untimed ones (page faults, allocator)."""
from __future__ import annotations

import statistics
import time

GIB = 1 << 30


def copy_bandwidth(device: str = "cuda", nbytes: int = GIB, reps: int = 10) -> float:
    import torch
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(reps + 2):
        if device.startswith("cuda"):
            # device time alone: a 1 GiB copy is ~0.5 ms, where host timer and sync overhead would show
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - t0
        if i >= 2:
            times.append(seconds)
    del src, dst
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times)


def device_ms(torch, fn, reps: int = 20) -> float:
    """Milliseconds of device time per call of fn() (a launch, or a CUDA graph's replay), reps calls back to
    back between two events after one untimed call: the device's time, launch gaps between the calls included,
    none of the host's waiting."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps
