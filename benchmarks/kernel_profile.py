"""What a GPU step spends its time on, kernel by kernel: a torch.profiler trace summarised.

Used by decode_step.py --profile: a decode step's time against its weight-bandwidth bound says how far it
is from the bound, not why; this says how many kernels a step launches, how long the device is busy with
them and which ones take the time (a step of many short kernels is bound by their count, one of few long
ones by the kernels themselves).
"""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def kernel_trace(device: str, attribute: bool = False):
    """Profile the block's device work (CUDA kernels, copies and sets; on the CPU, its operators).
    attribute: on a GPU record the host operators too, so summarize() can name the operators that
    launched each kernel (a copy kernel says nothing of which copy it was)."""
    from torch.profiler import ProfilerActivity, profile
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    if cuda and attribute:
        activities.append(ProfilerActivity.CPU)
    with profile(activities=activities) as prof:
        yield prof


def _launcher(event, depth: int = 3) -> str:
    """The chain of host operators above a kernel launch, outermost first ("aten::pad > aten::copy_")."""
    names, e = [], event.cpu_parent
    while e is not None:
        if not e.name.startswith("cu"):        # the runtime call itself (cudaLaunchKernel, cuLaunchKernelEx)
            names.append(e.name)
        e = e.cpu_parent
    return " > ".join(reversed(names[:depth])) or event.name


def _launchers(prof) -> dict[str, dict[str, int]]:
    """kernel name -> {operator chain: launches}, from the host events that launched kernels."""
    from torch.autograd import DeviceType
    out: dict[str, dict[str, int]] = {}
    for e in prof.events():
        if e.device_type == DeviceType.CPU:
            for k in e.kernels:
                chains = out.setdefault(k.name, {})
                chain = _launcher(e)
                chains[chain] = chains.get(chain, 0) + 1
    return out


def idle_gaps(events, steps: int, largest: int = 15, wide_us: float = 20.0) -> dict:
    """Where the device sat idle between its events: per step the idle time inside the span, the count and
    sum of gaps wider than ``wide_us``, and the ``largest`` gaps with the events on either side and where in
    the trace they fall (0 = its start, 1 = its end). A step of many kernels loses a launch gap per kernel
    (small, everywhere); the host waiting on the device or the device on the host shows as few wide ones."""
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in events)
    if not spans:
        return {"idle_us_per_step": 0.0, "wide_gaps_per_step": 0.0, "wide_gap_us_per_step": 0.0, "largest": []}
    first, last = spans[0][0], max(end for _, end, _ in spans)
    gaps, reach, before = [], spans[0][1], spans[0][2]
    for start, end, name in spans[1:]:
        if start > reach:
            gaps.append((start - reach, reach, before, name))
        if end >= reach:
            reach, before = end, name
    wide = [g for g in gaps if g[0] > wide_us]
    where = lambda t: round((t - first) / max(last - first, 1e-9), 4)  # noqa: E731
    return {"idle_us_per_step": sum(g[0] for g in gaps) / steps, "wide_gap_us": wide_us,
            "wide_gaps_per_step": len(wide) / steps, "wide_gap_us_per_step": sum(g[0] for g in wide) / steps,
            "largest": [{"us": g[0], "at": where(g[1]), "after": g[2][:80], "before": g[3][:80]}
                        for g in sorted(gaps, key=lambda g: -g[0])[:largest]]}


def summarize(prof, steps: int, device: str, top: int = 40) -> dict:
    """Per step: device events, their summed time (busy) and the span from the first start to the last end;
    the ``top`` names by summed time with their count per step; the idle gaps (idle_gaps). Times in
    microseconds."""
    from torch.autograd import DeviceType
    cuda = device.startswith("cuda")
    events = [e for e in prof.events() if (e.device_type == DeviceType.CUDA) == cuda]
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
    busy = sum(sum(v) for v in by_name.values())
    span = (max(e.time_range.end for e in events) - min(e.time_range.start for e in events)) if events else 0
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    launchers = _launchers(prof) if cuda else {}
    rows = []
    for n, v in ranked:
        row = {"name": n[:120], "us_per_step": sum(v) / steps, "count_per_step": len(v) / steps}
        if n in launchers:          # recorded with attribute=True: the three commonest chains, launches per step
            row["launched_by"] = [(chain, k / steps) for chain, k in
                                  sorted(launchers[n].items(), key=lambda kv: -kv[1])[:3]]
        rows.append(row)
    return {"steps": steps, "events_per_step": len(events) / steps, "busy_us_per_step": busy / steps,
            "span_us_per_step": span / steps, "top": rows, "gaps": idle_gaps(events, steps)}


def print_summary(label: str, s: dict, lines: int = 15) -> None:
    """The summary's head on stdout (the JSON keeps all of ``top``)."""
    print(f"  profile {label}: {s['events_per_step']:.0f} device events per step, busy {s['busy_us_per_step']:.0f} us, "
          f"span {s['span_us_per_step']:.0f} us")
    g = s.get("gaps")
    if g:
        print(f"  idle {g['idle_us_per_step']:.0f} us per step, {g['wide_gaps_per_step']:.1f} gaps over "
              f"{g.get('wide_gap_us', 20):g} us ({g['wide_gap_us_per_step']:.0f} us); largest: "
              + ", ".join(f"{x['us']:.0f} us at {x['at']:.2f} before {x['before'][:40]}" for x in g["largest"][:5]))
    for t in s["top"][:lines]:
        by = "; ".join(f"{chain} x{n:g}" for chain, n in t.get("launched_by", []))
        print(f"    {t['us_per_step']:>9.1f} us  x{t['count_per_step']:>5.1f}  {t['name'][:90]}"
              + (f"\n{'':>24}from {by[:160]}" if by else ""))
