"""Effective bandwidth of checkpoint store / load (Triton kernels) next to the device's copy bandwidth.

One TP8 rank of Kimi-Linear-48B (kda channel units) and of Qwen3-Next-80B (gdn head units); retained
masks are deterministic random at the fraction a W_max would keep (or one rank's lists from --plan),
native and int8 codecs, batch 1 and 64. Bytes = what the kernels read + write (load writes whole active
rows: retained units and the zero-filled omitted ones), timed with triton.testing.do_bench (median,
L2 flushed between reps). Usage:
  python benchmarks/state_bandwidth.py [--layout ragged|padded] [--plan plan.json] [--quick]
Writes benchmarks/results/state_bandwidth.json (and $OUT/state_bandwidth.json when $OUT is set).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from results_io import provenance, write_result  # noqa: E402

# one TP8 rank: L linear layers, n units per layer, E elements per unit, R = E // V rows, conv per layer
MODELS = {
    "kimi-linear-48b": dict(arch="kda", L=20, n=4 * 128, V=128, R=1, conv_dim=1536, conv_width=3),
    "qwen3-next-80b": dict(arch="gdn", L=36, n=4, V=128, R=128, conv_dim=1024, conv_width=3),
}
# fraction of units kept per W_max (synthetic, close to the paper's profiles)
KEEP = {"kda": {0: 1.0, 16: 0.36, 128: 0.10}, "gdn": {0: 1.0, 16: 0.90, 128: 0.60}}


def retained(L: int, n: int, frac: float, seed: int) -> list[list[int]]:
    """Exactly round(frac * L * n) units, chosen uniformly at random over (layer, unit)."""
    cells = [(l, u) for l in range(L) for u in range(n)]
    kept = sorted(random.Random(seed).sample(cells, round(frac * len(cells))))
    out = [[] for _ in range(L)]
    for l, u in kept:
        out[l].append(u)
    return out


def planner_lists(arch: str, W: int, root: str) -> list[list[int]]:
    """Rank 0's retained local units from the planner (TP8, hybrid placement) on a synthetic decay
    checkpoint with the released model's shapes and the paper's decay profile."""
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    from trtllm_dasc.plan.synthetic import write_checkpoint
    path = os.path.join(root, arch)
    if not os.path.isdir(path):
        write_checkpoint(path, arch, seed=0, shards=1)
    plan, _ = plan_from_path(path, PlanOptions(wmax=W, tp=8, placement="hybrid"))
    return plan.local_retained(0)


def bytes_moved(lay, op: str, B: int, model_bytes: int = 2) -> int:
    payload = lay.num_retained * (lay.unit_bytes())
    conv = lay.num_layers * lay.conv_dim * lay.conv_width
    if op == "store":
        return B * (lay.num_retained * lay.unit_elements * 4 + payload + conv * (model_bytes + 2))
    active = lay.num_layers * lay.units_per_layer * lay.unit_elements * 4
    return B * (payload + active + conv * (2 + model_bytes))


def measure(name: str, spec: dict, W: int, codec: str, layout: str, B: int, plan_lists, do_bench) -> dict:
    from trtllm_dasc.state import CheckpointPool, StateLayout, triton_ops
    L, n, V, R = spec["L"], spec["n"], spec["V"], spec["R"]
    lists = plan_lists if plan_lists is not None else retained(L, n, KEEP[spec["arch"]][W], seed=W + 7)
    lay = StateLayout.from_retained(lists, units_per_layer=n, unit_elements=R * V, value_dim=V, codec=codec,
                                    layout=layout, conv_dim=spec["conv_dim"], conv_width=spec["conv_width"])
    pool = CheckpointPool(lay, (B + 1) * lay.slot_bytes(), device="cuda")
    temporal = torch.randn(L, B, n * R, V, device="cuda")
    conv = torch.randn(L, B, spec["conv_dim"], spec["conv_width"], device="cuda").to(torch.bfloat16)
    rows = torch.arange(B, device="cuda")
    slots = torch.arange(1, B + 1, device="cuda")        # slot 0 is reserved
    out = []
    for op in ("store", "load"):
        if op == "store":
            fn = lambda: triton_ops.store(temporal, conv, rows, pool.payload, pool.scales, pool.conv, slots, lay)  # noqa: E731
        else:
            fn = lambda: triton_ops.load(pool.payload, pool.scales, pool.conv, slots, temporal, conv, rows, lay)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
        host_us = host_time(fn)
        ms_graph = do_bench(capture(fn).replay, warmup=25, rep=100, return_mode="median")
        nbytes = bytes_moved(lay, op, B)
        out.append({"model": name, "arch": spec["arch"], "wmax": W, "kept_fraction": round(lay.num_retained / (L * n), 4),
                    "codec": codec, "layout": layout, "op": op, "batch": B, "us": ms * 1e3,
                    "us_per_checkpoint": ms * 1e3 / B, "host_us": host_us, "us_graph": ms_graph * 1e3,
                    "us_per_checkpoint_graph": ms_graph * 1e3 / B, "bytes": nbytes, "GBps": nbytes / ms / 1e6,
                    "GBps_graph": nbytes / ms_graph / 1e6,
                    "slot_bytes": lay.slot_bytes()})
    del pool, temporal, conv
    torch.cuda.empty_cache()
    return out


def capture(fn) -> "torch.cuda.CUDAGraph":
    """fn recorded in a CUDA graph: replays cost the kernels alone, no python or launch overhead."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def host_time(fn, n: int = 200) -> float:
    """Microseconds of python + launch per call (calls queued back to back, one sync at the end): when
    it exceeds the kernel time, small checkpoints are launch-bound (CUDA graphs would hide it)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def copy_bandwidth(do_bench) -> float:
    """GB/s of torch clone of a 1 GiB fp32 tensor (read + write counted)."""
    x = torch.randn(1 << 28, device="cuda")
    x.clone()
    ms = do_bench(lambda: x.clone(), warmup=10, rep=50, return_mode="median")
    gbps = 2 * x.numel() * 4 / ms / 1e6
    del x
    torch.cuda.empty_cache()
    return gbps


def tile_sweep(layout: str, do_bench, copy_gbps: float) -> list[dict]:
    """Batch-64 W=16 arms under other tile sizes / warp counts (the defaults are restored after)."""
    from trtllm_dasc.state import triton_ops
    saved, rows = (triton_ops.TILE_ELEMS, triton_ops.NUM_WARPS), []
    try:
        for tile in (2048, 4096, 8192):
            for warps in (4, 8):
                triton_ops.TILE_ELEMS, triton_ops.NUM_WARPS = tile, warps
                for name in MODELS:
                    for codec in ("native", "int8"):
                        for a in measure(name, MODELS[name], 16, codec, layout, 64, None, do_bench):
                            rows.append({"tile": tile, "warps": warps, **a,
                                         "pct_of_copy_graph": 100 * a["GBps_graph"] / copy_gbps})
                            print(f"sweep tile {tile:5} warps {warps} {name:16} {codec:6} {a['op']:5} "
                                  f"graph {a['GBps_graph']:6.0f} GB/s {rows[-1]['pct_of_copy_graph']:5.1f}%")
    finally:
        triton_ops.TILE_ELEMS, triton_ops.NUM_WARPS = saved
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", choices=["ragged", "padded"], default="ragged")
    ap.add_argument("--plan", help="JSON with 'model' (a key of MODELS), 'wmax' and 'retained_local' "
                                   "(one rank's per-layer sorted local unit ids); replaces the synthetic masks")
    ap.add_argument("--synthetic-plans", action="store_true",
                    help="retained units from the planner on synthetic decay checkpoints (TP8 rank 0, hybrid) "
                         "instead of uniformly random masks of the KEEP fractions")
    ap.add_argument("--quick", action="store_true", help="batch 64 only, W_max 16 only")
    ap.add_argument("--sweep", action="store_true", help="also time tile sizes and warps on batch-64 arms")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "state_bandwidth.json"))
    ap.add_argument("--commit", default=None, help="commit to record (a device copy's .git may be stale)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("state_bandwidth: no CUDA device here, skipping (run it on the GPU machine)")
        return 0
    import triton
    from triton.testing import do_bench

    from trtllm_dasc.state import triton_ops
    copy_gbps = copy_bandwidth(do_bench)
    arms = []
    if args.plan:
        with open(args.plan) as f:
            plan = json.load(f)
        grid = [(plan["model"], plan["wmax"], plan["retained_local"])]
    elif args.synthetic_plans:
        import tempfile
        root = tempfile.mkdtemp()
        grid = [(m, W, planner_lists(MODELS[m]["arch"], W, root)) for m in MODELS
                for W in ((16,) if args.quick else (0, 16, 128))]
    else:
        grid = [(m, W, None) for m in MODELS for W in ((16,) if args.quick else (0, 16, 128))]
    for name, W, lists in grid:
        for codec in ("native", "int8"):
            for B in ((64,) if args.quick else (1, 64)):
                arms.extend(measure(name, MODELS[name], W, codec, args.layout, B, lists, do_bench))
    sweep = tile_sweep(args.layout, do_bench, copy_gbps) if args.sweep else []
    for a in arms:
        a["pct_of_copy"] = 100.0 * a["GBps"] / copy_gbps
        a["pct_of_copy_graph"] = 100.0 * a["GBps_graph"] / copy_gbps
    print(f"device {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    print(f"copy bandwidth (torch clone, 1 GiB fp32): {copy_gbps:.0f} GB/s")
    print("us: eager call (python + launch + kernel); graph: CUDA-graph replay (kernel only); host: python+launch")
    hdr = (f"{'model':16} {'W':>4} {'kept':>5} {'codec':6} {'op':5} {'B':>3} {'us':>8} {'us/ckpt':>8} {'graph':>7} "
           f"{'g/ckpt':>7} {'host':>6} {'GB/s':>6} {'%copy':>6} {'g%copy':>6}")
    print(hdr)
    print("-" * len(hdr))
    for a in arms:
        print(f"{a['model']:16} {a['wmax']:>4} {a['kept_fraction']:>5.2f} {a['codec']:6} {a['op']:5} {a['batch']:>3} "
              f"{a['us']:>8.1f} {a['us_per_checkpoint']:>8.1f} {a['us_graph']:>7.1f} {a['us_per_checkpoint_graph']:>7.2f} "
              f"{a['host_us']:>6.1f} {a['GBps']:>6.0f} {a['pct_of_copy']:>6.1f} {a['pct_of_copy_graph']:>6.1f}")
    result = {**provenance("benchmarks/state_bandwidth.py", argv, args.commit), "torch": torch.__version__,
              "triton": triton.__version__, "copy_GBps": copy_gbps, "layout": args.layout,
              "tile_elems": triton_ops.TILE_ELEMS, "num_warps": triton_ops.NUM_WARPS, "arms": arms, "sweep": sweep}
    paths = [args.out] + ([os.path.join(os.environ["OUT"], "state_bandwidth.json")] if os.environ.get("OUT") else [])
    for p in paths:
        write_result(p, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
