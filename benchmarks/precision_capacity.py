"""Checkpoint capacity of horizon-aware precision (issue 35): slots at the paper's budgets, TP8, per band choice.

The planner's accounting (plan/accounting.py, Eq. 8 with mixed widths) on the paper-profile checkpoints of
Kimi-Linear-48B and Qwen3-Next-80B (plan/synthetic.py: the released shapes, the paper's decay profile,
seed 0; the same decay tensors `dasc-build --load-format dummy` and `dasc plan` on a synthetic checkpoint
use), at the paper's per-rank budgets (694,681,600 B and 1,236,271,104 B: 127 dense slots each). Each row:
a precision (uniform codec or horizon bands) and a conv codec; capacity = slots / dense slots.

    python -m benchmarks precision_capacity [--wmax 16] [--tp 8] [--json OUT]
Pure accounting, no weights and no device: under a minute on a CPU.
"""
from __future__ import annotations

import argparse
import json
import sys

from benchmarks.results_io import provenance, write_result

BUDGETS = {"kda": 694_681_600, "gdn": 1_236_271_104}
SPECS = ["uniform:native", "uniform:int8", "horizon:1024,8192:int4,int8,native", "horizon:256,4096:int4,int8,fp8",
         "horizon:64,1024:int4,int8,int8", "horizon:128,1024:int4,fp8,int8", "horizon:4096:int4,int8",
         "horizon:17:int4,int4"]


def capacity_rows(wmax: int, tp: int, specs: list[str], conv_codecs: list[str]) -> list[dict]:
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.plan import PlanOptions
    from trtllm_dasc.plan.plan import plan_from_params
    from trtllm_dasc.plan.synthetic import KIMI_48B, QWEN3_NEXT_80B, profile_decay_params
    rows = []
    for arch, raw in (("kda", KIMI_48B), ("gdn", QWEN3_NEXT_80B)):
        cfg = HybridConfig.from_dict(raw)
        params = profile_decay_params(cfg, 0)
        for spec in specs:
            for conv in conv_codecs:
                kind, _, rest = spec.partition(":")
                opts = (dict(codec=rest) if kind == "uniform" else dict(precision=spec))
                plan, _ = plan_from_params(cfg, params, PlanOptions(wmax=wmax, tp=tp, conv_codec=conv, **opts))
                r = plan.report(BUDGETS[arch])
                rows.append({"arch": arch, "model_type": cfg.model_type, "precision": spec, "conv_codec": conv,
                             "bottleneck_slot_bytes": r["bottleneck_slot_bytes"], "conv_bytes_per_rank": r["conv_bytes_per_rank"],
                             "compression_ckpt": r["compression_ckpt"], "slots": r["slots"],
                             "dense_slots": r["dense_slots"], "capacity_ratio": r["capacity_ratio"],
                             "bands": [{k: b[k] for k in ("codec", "horizon_from", "horizon_below", "units")}
                                       for b in r.get("bands", [])]})
    return rows


def _upper(hi) -> str:
    return "inf" if hi is None else f"{hi:g}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wmax", type=int, default=16)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--specs", nargs="+", default=SPECS, help="uniform:CODEC or a --precision horizon spec")
    ap.add_argument("--conv-codecs", nargs="+", default=["native", "int8"], choices=["native", "int8"])
    ap.add_argument("--json", default=None, help="also write the rows (with provenance) to this JSON file")
    args = ap.parse_args(argv)
    rows = capacity_rows(args.wmax, args.tp, args.specs, args.conv_codecs)
    print(f"W_max {args.wmax}, TP{args.tp}, paper budgets (Kimi 694,681,600 B, Qwen 1,236,271,104 B per rank)")
    print(f"{'model':>5} {'precision':>36} {'conv':>6} {'B/rank':>11} {'ckpt x':>7} {'slots':>6} {'capacity':>8}  bands "
          "(codec [from, below): units)")
    for r in rows:
        bands = ", ".join(f"{b['codec']} [{b['horizon_from']:g},{_upper(b['horizon_below'])}): {b['units']}"
                          for b in r["bands"])
        print(f"{r['arch']:>5} {r['precision']:>36} {r['conv_codec']:>6} {r['bottleneck_slot_bytes']:>11,} "
              f"{r['compression_ckpt']:>7.2f} {r['slots']:>6} {r['capacity_ratio']:>7.2f}x  {bands}")
    if args.json:
        write_result(args.json, {**provenance("benchmarks/precision_capacity.py", argv), "wmax": args.wmax,
                                 "tp": args.tp, "budgets": BUDGETS, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
