"""benchmarks/kernel_profile.py's attribution of kernels to the host operators that launched them, on
hand-made profiler events (the GPU path's input; a CPU run has no device kernels to attribute)."""
from __future__ import annotations

from types import SimpleNamespace


def _event(name, parent=None, kernels=()):
    from torch.autograd import DeviceType
    return SimpleNamespace(name=name, cpu_parent=parent, device_type=DeviceType.CPU,
                           kernels=[SimpleNamespace(name=k) for k in kernels])


def test_kernels_are_named_by_the_operators_above_their_launch():
    from benchmarks import kernel_profile
    pad = _event("aten::pad")
    copy = _event("aten::copy_", _event("aten::constant_pad_nd", pad))
    launches = [_event("cudaLaunchKernel", copy, ["copy_kernel"]), _event("cudaLaunchKernel", copy, ["copy_kernel"]),
                _event("cudaLaunchKernel", _event("aten::contiguous"), ["copy_kernel"]),
                _event("cuLaunchKernel", None, ["triton_kernel"])]
    prof = SimpleNamespace(events=lambda: [pad, copy] + launches)
    got = kernel_profile._launchers(prof)
    # outermost first, the runtime call left out, at most three levels; a launch with no operator above
    # it keeps its own name
    assert got == {"copy_kernel": {"aten::pad > aten::constant_pad_nd > aten::copy_": 2, "aten::contiguous": 1},
                   "triton_kernel": {"cuLaunchKernel": 1}}


def _timed(name, start, end):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end))


def test_idle_gaps_are_the_holes_between_device_events():
    from benchmarks import kernel_profile
    # a (0-10), b (5-30) overlapping a, a hole of 70, c (100-110), a hole of 5, d (115-200); counted by hand
    events = [_timed("d", 115, 200), _timed("a", 0, 10), _timed("c", 100, 110), _timed("b", 5, 30)]
    got = kernel_profile.idle_gaps(events, steps=1, wide_us=20)
    assert got["idle_us_per_step"] == 75 and got["wide_gaps_per_step"] == 1 and got["wide_gap_us_per_step"] == 70
    assert got["largest"][0] == {"us": 70, "at": 0.15, "after": "b", "before": "c"}
    assert got["largest"][1]["us"] == 5 and got["largest"][1]["before"] == "d"
    assert kernel_profile.idle_gaps([], steps=1)["largest"] == []
