"""`make run`: the main job on the embedded default model.

Until the serving layer lands this is the planner demo plus an engine run:
1. write synthetic decay checkpoints with the released models' shapes (Kimi-Linear-48B, Qwen3-Next-80B),
   plan them for W_max in {16, 64, 128, 512} at TP8 with the paper's matched-HBM budgets, print the
   capacity tables and draw the horizon/capacity plots;
2. build the embedded default model (a small Kimi-Linear with the paper's KDA decay profile) and run a
   prefix-reuse workload through the engine for the dense and dasc arms at the same state memory.
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
    engine_demo()
    return 0


def engine_demo() -> None:
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.engine.config import EngineConfig
    from trtllm_dasc.engine.workload import prefix_reuse_workload, run_arm
    from trtllm_dasc.plan.synthetic import write_tiny_model

    model = os.path.join(OUT, "tiny-kimi-linear")
    if not os.path.isfile(os.path.join(model, "config.json")):
        write_tiny_model(model, "kda")
    work = prefix_reuse_workload(num_docs=30, doc_len=96, questions_per_doc=3)
    # state memory for 15 dense checkpoints (the conv state is kept in the model's fp32)
    budget = 16 * HybridConfig.from_path(model, conv_dtype="float32").dense_checkpoint_bytes_per_rank(1)
    print(f"\n=== engine: {len(work.replay)} replayed requests over {len(work.fill)} shared {work.doc_len}-token "
          f"prefixes, state budget {budget:,} B, model {model} ===", flush=True)
    print(f"{'arm':30} {'slots':>6} {'hit rate':>9} {'prefilled':>10} {'ms/req':>7} {'in tok/s':>9}")
    rows = []
    for arm in ({}, {"wmax": 16}, {"wmax": 16, "policy": "wr"}, {"wmax": 16, "codec": "int8"}):
        cfg = EngineConfig(model=model, state_budget_bytes=budget, interval=work.doc_len, block_size=16,
                           num_kv_blocks=4096, max_batch=4, **arm)
        r = run_arm(cfg, work)
        rows.append(r)
        print(f"{r['arm']:30} {r['checkpoint_slots']:>6} {r['hit_rate']:>9.1%} {r['prefilled_tokens']:>10} "
              f"{r['ms_per_request']:>7.1f} {r['input_tokens_per_s']:>9.0f}", flush=True)
    with open(os.path.join(OUT, "engine-summary.json"), "w") as f:
        json.dump(rows, f, indent=2)
    print(f"summary: {os.path.join(OUT, 'engine-summary.json')}")


if __name__ == "__main__":
    sys.exit(main())
