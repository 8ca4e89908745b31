"""What a GPU step spends its time on, kernel by kernel: a torch.profiler trace summarised.

Used by decode_step.py --profile: a decode step's time against its weight-bandwidth bound says how far it
is from the bound, not why; this says how many kernels a step launches, how long the device is busy with
them and which ones take the time (a step of many short kernels is bound by their count, one of few long
ones by the kernels themselves).
"""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def kernel_trace(device: str):
    """Profile the block's device work (CUDA kernels, copies and sets; on the CPU, its operators)."""
    from torch.profiler import ProfilerActivity, profile
    activity = ProfilerActivity.CUDA if device.startswith("cuda") else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        yield prof


def summarize(prof, steps: int, device: str, top: int = 40) -> dict:
    """Per step: device events, their summed time (busy) and the span from the first start to the last end;
    the ``top`` names by summed time with their count per step. Times in microseconds."""
    from torch.autograd import DeviceType
    cuda = device.startswith("cuda")
    events = [e for e in prof.events() if (e.device_type == DeviceType.CUDA) == cuda]
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
    busy = sum(sum(v) for v in by_name.values())
    span = (max(e.time_range.end for e in events) - min(e.time_range.start for e in events)) if events else 0
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {"steps": steps, "events_per_step": len(events) / steps, "busy_us_per_step": busy / steps,
            "span_us_per_step": span / steps,
            "top": [{"name": n[:120], "us_per_step": sum(v) / steps, "count_per_step": len(v) / steps}
                    for n, v in ranked]}


def print_summary(label: str, s: dict, lines: int = 15) -> None:
    """The summary's head on stdout (the JSON keeps all of ``top``)."""
    print(f"  profile {label}: {s['events_per_step']:.0f} device events per step, busy {s['busy_us_per_step']:.0f} us, "
          f"span {s['span_us_per_step']:.0f} us")
    for t in s["top"][:lines]:
        print(f"    {t['us_per_step']:>9.1f} us  x{t['count_per_step']:>5.1f}  {t['name'][:90]}")
