"""Markdown tables of a quality result (evals.run's JSON): accuracy per arm and W_max, and the paired
comparisons in the form of the paper's Table 5, for a quality report's README.

    python -m trtllm_dasc.evals.tables quality_kda.json [quality_gdn.json ...] [--out README.md]
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

from trtllm_dasc.evals.protocol import parse_arm
from trtllm_dasc.evals.report import accuracy_table

# the comparison families of report.comparisons, as the tables name them
FAMILIES = {"nr_vs_dense": "dasc-nr minus dense", "nr_vs_random": "dasc-nr minus random masks (mean of seeds)",
            "wr_vs_nr": "dasc-wr minus dasc-nr", "int8_vs_native": "dasc-nr + INT8 minus dasc-nr",
            "wrwarm_vs_wr": "dasc-wr-warm minus dasc-wr",
            "horizon_vs_dense": "dasc-nr + horizon minus dense", "horizon_vs_int8": "dasc-nr + horizon minus dasc-nr + INT8",
            "horizon_vs_shuffled": "dasc-nr + horizon minus its bands shuffled (mean of seeds)"}


def _pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def accuracy_rows(result: dict) -> list[str]:
    """One row per W_max: dense, nr, wr, wr-warm, nr + INT8 and the random masks' mean (sd, count)."""
    acc = accuracy_table(result["arms"])
    cells: dict[tuple, list[float]] = {}
    dense = None
    for spec, a in acc.items():
        arm = parse_arm(spec)
        if arm.wmax == 0:
            dense = a["accuracy"] if arm.codec == "native" else dense
            continue
        if arm.precision != "uniform":
            continue                        # precision_rows
        kind = "rand" if arm.mask_seed is not None else arm.policy + ("+int8" if arm.codec == "int8" else "")
        cells.setdefault((arm.wmax, kind), []).append(a["accuracy"])
    rows = ["| W_max | dense | dasc-nr | dasc-wr | dasc-wr-warm | dasc-nr + INT8 | random masks: mean (sd, n) |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    for w in sorted({w for w, _ in cells}):
        def one(kind):
            v = cells.get((w, kind))
            return _pct(v[0]) if v else "-"
        rand = cells.get((w, "rand"))
        rand_cell = "-" if not rand else (f"{100 * np.mean(rand):.1f} ({100 * np.std(rand, ddof=1):.1f}, {len(rand)})"
                                          if len(rand) > 1 else f"{100 * rand[0]:.1f} (-, 1)")
        rows.append(f"| {w} | {_pct(dense)} | {one('nr')} | {one('wr')} | {one('wr-warm')} | {one('nr+int8')} | "
                    f"{rand_cell} |")
    return rows


def precision_rows(result: dict) -> list[str]:
    """Horizon-aware precision (issue 35), one row per W_max that has it: dense, dasc-nr, + INT8, + horizon and
    the count-matched control (bands shuffled: mean (sd, n)); none when no arm has a precision."""
    acc = accuracy_table(result["arms"])
    cells: dict[tuple, list[float]] = {}
    dense = None
    for spec, a in acc.items():
        arm = parse_arm(spec)
        if arm.wmax == 0:
            dense = a["accuracy"] if arm.codec == "native" else dense
        elif arm.mask_seed is None and arm.policy == "nr":
            kind = ("shuffled" if "@" in arm.precision else "horizon") if arm.precision != "uniform" else arm.codec
            cells.setdefault((arm.wmax, kind), []).append(a["accuracy"])
    windows = sorted({w for w, kind in cells if kind == "horizon"})
    if not windows:
        return []
    rows = ["| W_max | dense | dasc-nr | dasc-nr + INT8 | dasc-nr + horizon | bands shuffled: mean (sd, n) |",
            "|---:|---:|---:|---:|---:|---:|"]
    for w in windows:
        def one(kind):
            v = cells.get((w, kind))
            return _pct(v[0]) if v else "-"
        sh = cells.get((w, "shuffled"))
        sh_cell = "-" if not sh else (f"{100 * np.mean(sh):.1f} ({100 * np.std(sh, ddof=1):.1f}, {len(sh)})"
                                      if len(sh) > 1 else f"{100 * sh[0]:.1f} (-, 1)")
        rows.append(f"| {w} | {_pct(dense)} | {one('native')} | {one('int8')} | {one('horizon')} | {sh_cell} |")
    return rows


def comparison_rows(result: dict) -> list[str]:
    """The paired comparisons: N instances, mean difference and its 95% bootstrap CI in points, p, Holm p."""
    rows = ["| comparison | W_max | N | diff (points) | 95% CI | p | p (Holm) |", "|---|---:|---:|---:|---|---:|---:|"]
    for family, label in FAMILIES.items():
        for w, c in sorted(result.get("comparisons", {}).get(family, {}).items(), key=lambda kv: int(kv[0])):
            if not c.get("n"):
                continue
            mark = " *" if c["p_holm"] < 0.05 else ""
            rows.append(f"| {label} | {w} | {c['n']} | {100 * c['diff']:+.2f} | [{100 * c['ci'][0]:+.2f}, "
                        f"{100 * c['ci'][1]:+.2f}] | {c['p']:.4f} | {c['p_holm']:.4f}{mark} |")
    return rows


def markdown(result: dict, title: str) -> str:
    acc = accuracy_table(result["arms"])
    misses = sum(a["misses"] for a in acc.values())
    scored = sum(a["scored"] for a in acc.values())
    head = [f"### {title}", "",
            f"{len(result['tasks'])} tasks x lengths {', '.join(map(str, result['lengths']))} x "
            f"{result['instances']} instances per arm; {len(acc)} arms; {scored} replays scored, {misses} misses "
            f"excluded; commit {str(result.get('commit'))[:12]}.", "",
            "Replay accuracy (%):", ""]
    resamples = result.get("resamples")
    boot = f"{resamples:,}-resample bootstrap" if resamples else "bootstrap"
    tail = ["", f"Paired comparisons (unit: the unique instance; {boot}; Holm within each family; "
                "* = Holm-adjusted p < 0.05):", ""]
    precision = precision_rows(result)
    if precision:
        precision = ["", "Horizon-aware precision (%):", ""] + precision
    return "\n".join(head + accuracy_rows(result) + precision + tail + comparison_rows(result)) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="evals.run result JSON(s)")
    ap.add_argument("--out", default=None, help="write the markdown here (default: stdout)")
    args = ap.parse_args(argv)
    parts = []
    for path in args.results:
        try:
            with open(path) as f:
                result = json.load(f)
            parts.append(markdown(result, str(result.get("model", path)).rstrip("/").rsplit("/", 1)[-1]))
        except (OSError, ValueError, KeyError) as e:
            print(f"evals.tables: error: {path}: {e}", file=sys.stderr)
            return 2
    text = "\n".join(parts)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
