"""Per-checkpoint store and load latency at TP with placement off / storage / hybrid (paper Sec. 4.3, App. C.2's
three placements), batches 1 and 64, on the released Kimi-Linear-48B (or Qwen3-Next-80B) state shapes with
the paper's decay profile; every placement in the same run.

A store encodes the captured states of B requests into B checkpoint slots on every rank (with storage
balancing: the variable-split all-to-all of the units a rank keeps for another); a load is the inverse.
Latency is the slowest rank's (a step waits for it), timed between barriers, median of --reps.

    python -m benchmarks tp_storage --tp 2 --device cuda [--arch kda] [--wmax 16] [--batches 1,64]
        [--out benchmarks/results/tp_storage_h200x2.json]
It starts its own mpirun when not already under one.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

PLACEMENTS = ("off", "storage", "hybrid")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--arch", default="kda", choices=["kda", "gdn"])
    ap.add_argument("--wmax", type=int, default=16)
    ap.add_argument("--codec", default="native", choices=["native", "int8"])
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "tp_storage.json"))
    ap.add_argument("--commit", default=None, help="commit to record (the device's .git may be stale)")
    return ap


def _timed(group, fn, reps: int, sync) -> float:
    """Median ms of fn over reps, each between barriers (the slowest rank decides when all may go on)."""
    times = []
    for i in range(reps + 2):
        group.comm.Barrier()
        t0 = time.perf_counter()
        fn()
        sync()
        group.comm.Barrier()
        if i >= 2:          # two warm-up rounds: kernels compiled, buffers touched
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure(args) -> dict | None:
    import torch

    from trtllm_dasc.parallel.group import TPGroup
    from trtllm_dasc.parallel.storage import BalancedPool, exchanges
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    from trtllm_dasc.plan.synthetic import write_checkpoint
    from trtllm_dasc.state import CheckpointPool
    group = TPGroup.from_mpi(args.device)
    device = f"cuda:{torch.cuda.current_device()}" if args.device.startswith("cuda") else "cpu"
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    # the decay-only checkpoint the planner reads, written once by rank 0
    ckpt = group.broadcast(write_checkpoint(tempfile.mkdtemp(prefix="tp-storage-"), args.arch)
                           if group.rank == 0 else None)
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for placement in PLACEMENTS:
        plan, _ = plan_from_path(ckpt, PlanOptions(wmax=args.wmax, tp=args.tp, placement=placement, codec=args.codec))
        cfg, shard = plan.config, plan.config.shard(args.tp)
        budget = (2 * max(batches) + 2) * plan.bottleneck_slot_bytes()
        if exchanges(plan):
            pool = BalancedPool(plan, budget, group.rank, group.all_to_all, device=device)
        else:
            pool = CheckpointPool.from_plan(plan, budget, group.rank, device=device)
        n = max(batches)
        g = torch.Generator(device=device).manual_seed(group.rank)
        temporal = torch.randn(cfg.num_linear_layers, n, shard.value_heads, cfg.key_head_dim, cfg.value_head_dim,
                               generator=g, device=device)
        conv = torch.randn(cfg.num_linear_layers, n, shard.conv_dim, cfg.conv_kernel - 1, generator=g,
                           device=device).to(torch.bfloat16)
        for B in batches:
            rws, slots = list(range(B)), list(range(1, B + 1))
            store = _timed(group, lambda: pool.store(temporal, conv, rws, slots), args.reps, sync)
            load = _timed(group, lambda: pool.load(slots, temporal, conv, rws), args.reps, sync)
            rows.append({"placement": placement, "batch": B, "store_ms": store, "load_ms": load,
                         "moved_units": plan.moved_units, "slot_bytes_per_rank": plan.slot_bytes_per_rank(),
                         "bottleneck_slot_bytes": plan.bottleneck_slot_bytes(),
                         "permutation_optimal": plan.permutation_optimal})
            if group.rank == 0:
                print(f"[tp-storage] {placement:8} B={B:<3} store {store:8.3f} ms  load {load:8.3f} ms  "
                      f"moved units {plan.moved_units}  slot {plan.bottleneck_slot_bytes():,} B (slowest rank)",
                      flush=True)
        del pool, temporal, conv
    gathered = group.gather(rows)
    group.close()
    if group.rank != 0:
        return None
    # every rank timed between the same barriers: the figures agree to the barrier's skew; keep rank 0's and
    # the spread
    for i, row in enumerate(rows):
        row["store_ms_ranks"] = [g[i]["store_ms"] for g in gathered]
        row["load_ms_ranks"] = [g[i]["load_ms"] for g in gathered]
    return {"rows": rows}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    from trtllm_dasc.parallel.launch import relaunch, under_mpirun
    if not under_mpirun():
        return relaunch(args.tp, [os.path.abspath(__file__), *argv])
    result = measure(args)
    if result is None:
        return 0
    import torch

    from benchmarks.results_io import provenance, write_result
    result = {**provenance("benchmarks/tp_storage.py", argv, args.commit), "tp": args.tp, "arch": args.arch,
              "wmax": args.wmax, "codec": args.codec, "reps": args.reps, "torch": torch.__version__,
              "note": "median ms between barriers, slowest rank; store = encode B checkpoints (+ all-to-all of "
                      "remotely stored units), load = the inverse", **result}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
