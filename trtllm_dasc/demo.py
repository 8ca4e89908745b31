"""`make run`: the main job on the embedded default model.

Until the serving layer lands this is the planner demo: write synthetic decay checkpoints with the
released models' shapes (Kimi-Linear-48B, Qwen3-Next-80B), plan them for W_max in {16, 64, 128, 512} at
TP8 with the paper's matched-HBM budgets, print the capacity tables and draw the horizon/capacity plots.
"""
from __future__ import annotations

import json
import os
import sys

from trtllm_dasc.plan import PlanOptions, plan_from_path
from trtllm_dasc.plan.cli import format_table
from trtllm_dasc.plan.plot import plot_plan
from trtllm_dasc.plan.synthetic import write_checkpoint

OUT = os.environ.get("DASC_DEMO_OUT", "demo_out")
WMAX = (16, 64, 128, 512)
# the paper's per-rank budgets: 128 dense TP8 slots, i.e. 127 deployable (App. C.1)
MODELS = (("kda", "Kimi-Linear-48B-shaped", 694_681_600), ("gdn", "Qwen3-Next-80B-shaped", 1_236_271_104))


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    summary = {}
    for arch, name, budget in MODELS:
        ckpt = write_checkpoint(os.path.join(OUT, f"synthetic-{arch}"), arch)
        print(f"\n=== {name} synthetic decay checkpoint ({ckpt}), TP8, hybrid placement ===", flush=True)
        reports = []
        for w in WMAX:
            plan, horizons = plan_from_path(ckpt, PlanOptions(wmax=w, tp=8, placement="hybrid"))
            reports.append(plan.report(budget))
        print(format_table(reports))
        png = os.path.join(OUT, f"plan-{arch}.png")
        plot_plan(png, plan.config, horizons, PlanOptions(wmax=16, tp=8), budget)
        print(f"plot: {png}")
        summary[arch] = [{k: r[k] for k in ("wmax", "compression_ckpt", "slots", "dense_slots",
                                             "bottleneck_slot_bytes")} for r in reports]
    with open(os.path.join(OUT, "plan-summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print("\npaper, real weights (TP-balanced): KDA 2.63x at W_max=16 ... 28.04x at 512; GDN 1.10x ... 2.48x")
    print(f"summary: {os.path.join(OUT, 'plan-summary.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
