"""Storage all-to-all round trip, on every rank of ``mpirun -np T python tests/tp/storage_job.py``:
random states -> BalancedPool.store (own units kept, the tail sent away) -> BalancedPool.load into other
rows (the tail comes home). The reference is the same rank's unbalanced pool (placement 'off': all U_r
units in its own slot) given the same states: the loaded rows must be equal bit for bit. Rank 0 writes
the JSON: per rank, bitwise equality and the units it sent and received."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--wmax", type=int, required=True)
    ap.add_argument("--placement", default="storage")
    ap.add_argument("--codec", default="native")
    ap.add_argument("--out", required=True)
    return ap


def main() -> None:
    args = parser().parse_args()
    from trtllm_dasc.parallel.group import TPGroup
    group = TPGroup.from_mpi("cpu")
    try:
        result = round_trip(args, group)
    finally:
        group.close()
    if result is not None:
        Path(args.out).write_text(json.dumps(result))


def round_trip(args, group) -> dict | None:
    """The round trip on every rank of ``group``; rank 0 gets the JSON-able result, the others None."""
    import torch

    from trtllm_dasc.parallel.storage import BalancedPool
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    from trtllm_dasc.state import CheckpointPool
    plan, _ = plan_from_path(args.model, PlanOptions(wmax=args.wmax, tp=group.size, placement=args.placement,
                                                     codec=args.codec))
    cfg, shard = plan.config, plan.config.shard(group.size)
    budget = 40 * plan.bottleneck_slot_bytes()
    pool = BalancedPool(plan, budget, group.rank, group.all_to_all)
    ref = CheckpointPool(pool.staging, 40 * pool.staging.slot_bytes())
    g = torch.Generator().manual_seed(100 + group.rank)
    L, rows = cfg.num_linear_layers, 6
    temporal = torch.randn(L, rows, shard.value_heads, cfg.key_head_dim, cfg.value_head_dim, generator=g)
    conv = torch.randn(L, rows, shard.conv_dim, cfg.conv_kernel - 1, generator=g).to(torch.bfloat16)
    slots = [7, 3, 12]
    results = {}
    for name, p in (("balanced", pool), ("reference", ref)):
        p.store(temporal, conv, [0, 2, 4], slots)
        t_out, c_out = torch.full_like(temporal, 9.0), torch.full_like(conv, 9.0)
        p.load([12, 7, 3], t_out, c_out, [5, 1, 3])
        results[name] = (t_out, c_out)
    (tb, cb), (tr, cr) = results["balanced"], results["reference"]
    mine = {"rank": group.rank, "temporal_equal": bool(torch.equal(tb, tr)), "conv_equal": bool(torch.equal(cb, cr)),
            "loaded_rows_nonzero": bool(tb[:, [5, 1, 3]].abs().sum() > 0),
            "sent": sum(c for _, _, c in pool.sends), "received": sum(c for _, _, c in pool.recvs),
            "slot_bytes": pool.slot_bytes, "exchange": pool.exchange_report(),
            # one unit's encoding: its elements (fp32, or int8 with an fp32 scale per row)
            "unit_bytes": pool.staging.unit_elements * (1 if args.codec == "int8" else 4)
            + (4 * pool.staging.rows_per_unit if args.codec == "int8" else 0)}
    everyone = group.gather(mine)
    if group.rank != 0:
        return None
    return {"ranks": everyone, "planner_slot_bytes": plan.slot_bytes_per_rank(), "moved_units": plan.moved_units}


if __name__ == "__main__":
    main()
