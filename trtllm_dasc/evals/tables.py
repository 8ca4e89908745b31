"""Markdown tables of a quality result (evals.run's JSON): accuracy per arm and W_max, and the paired
comparisons in the form of the paper's Table 5, for a quality report's README.

    python -m trtllm_dasc.evals.tables quality_kda.json [quality_gdn.json ...] [--out README.md]
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from trtllm_dasc.evals.protocol import parse_arm
from trtllm_dasc.evals.report import accuracy_table
from trtllm_dasc.evals.result_file import load_for_tables
from trtllm_dasc.spec import DEFAULT_CONV_CODEC

# the comparison families of report.comparisons, as the tables name them
FAMILIES = {"nr_vs_dense": "dasc-nr minus dense", "nr_vs_random": "dasc-nr minus random masks (mean of seeds)",
            "wr_vs_nr": "dasc-wr minus dasc-nr", "int8_vs_native": "dasc-nr + INT8 minus dasc-nr",
            "wrwarm_vs_wr": "dasc-wr-warm minus dasc-wr",
            "horizon_vs_dense": "dasc-nr + horizon minus dense",
            "horizon_vs_int8": "dasc-nr + horizon minus dasc-nr + INT8",
            "horizon_vs_shuffled": "dasc-nr + horizon minus its bands shuffled (mean of seeds)",
            "conv8_vs_dense": "the 8-bit conv arm minus dense",
            "conv8_vs_native_conv": "the 8-bit conv arm minus its native-conv twin"}


def _pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def _arm_cells(result: dict, kind_of) -> tuple[float | None, dict[tuple, list[float]]]:
    """(dense's accuracy, {(W_max, kind): [accuracy of each arm of that kind]}) for the dasc arms kind_of(arm)
    names (None: not in this table). Arms with a changed conv codec are conv_rows' alone."""
    dense, cells = None, {}
    for spec, a in accuracy_table(result["arms"]).items():
        arm = parse_arm(spec)
        if arm.conv_codec != DEFAULT_CONV_CODEC:
            continue
        if arm.wmax == 0:
            dense = a["accuracy"] if arm.codec == "native" else dense
        elif (kind := kind_of(arm)) is not None:
            cells.setdefault((arm.wmax, kind), []).append(a["accuracy"])
    return dense, cells


def _one(cells: dict, w: int, kind: str) -> str:
    v = cells.get((w, kind))
    return _pct(v[0]) if v else "-"


def _spread(values: list[float] | None) -> str:
    """Seeded arms of one kind: "mean (sd, n)" in percent."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{100 * values[0]:.1f} (-, 1)"
    return f"{100 * np.mean(values):.1f} ({100 * np.std(values, ddof=1):.1f}, {len(values)})"


def accuracy_rows(result: dict) -> list[str]:
    """One row per W_max: dense, nr, wr, wr-warm, nr + INT8 and the random masks' mean (sd, count)."""
    def kind_of(arm):
        if arm.precision_kind is not None:
            return None                     # precision_rows
        suffix = "+int8" if arm.codec == "int8" else ""
        # INT8 random masks are their own kind: the column shows the native masks, as report.comparisons pairs them
        return ("rand" if arm.mask_seed is not None else arm.policy) + suffix
    dense, cells = _arm_cells(result, kind_of)
    rows = ["| W_max | dense | dasc-nr | dasc-wr | dasc-wr-warm | dasc-nr + INT8 | random masks: mean (sd, n) |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    for w in sorted({w for w, _ in cells}):
        rows.append(f"| {w} | {_pct(dense)} | {_one(cells, w, 'nr')} | {_one(cells, w, 'wr')} | "
                    f"{_one(cells, w, 'wr-warm')} | {_one(cells, w, 'nr+int8')} | {_spread(cells.get((w, 'rand')))} |")
    return rows


def precision_rows(result: dict) -> list[str]:
    """Horizon-aware precision (issue 35), one row per W_max that has it: dense, dasc-nr, + INT8, + horizon and
    the count-matched control (bands shuffled: mean (sd, n)); none when no arm has a precision."""
    def kind_of(arm):
        if arm.mask_seed is not None or arm.policy != "nr":
            return None
        return arm.precision_kind or arm.codec
    dense, cells = _arm_cells(result, kind_of)
    windows = sorted({w for w, kind in cells if kind == "horizon"})
    if not windows:
        return []
    rows = ["| W_max | dense | dasc-nr | dasc-nr + INT8 | dasc-nr + horizon | bands shuffled: mean (sd, n) |",
            "|---:|---:|---:|---:|---:|---:|"]
    for w in windows:
        rows.append(f"| {w} | {_pct(dense)} | {_one(cells, w, 'native')} | {_one(cells, w, 'int8')} | "
                    f"{_one(cells, w, 'horizon')} | {_spread(cells.get((w, 'shuffled')))} |")
    return rows


def conv_rows(result: dict) -> list[str]:
    """The arms with a changed conv codec (+conv-int8), one row each: its accuracy beside its native-conv twin's
    (the same spec without the suffix, when the run has it); none when no arm changes it."""
    acc = accuracy_table(result["arms"])
    rows = []
    for spec, a in acc.items():
        arm = parse_arm(spec)
        if arm.conv_codec != DEFAULT_CONV_CODEC:
            twin = acc.get(arm.native_conv_twin, {}).get("accuracy")
            rows.append(f"| {arm.wmax} | `{spec}` | {_pct(a['accuracy'])} | {_pct(twin)} |")
    return ["| W_max | arm | accuracy | native-conv twin |", "|---:|---|---:|---:|"] + rows if rows else []


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


def _replays(arm: dict) -> tuple[int, int]:
    """(replays scored, replays that missed) of one arm entry. With rounds > 1 an instance is several replays:
    its "rounds" list holds the ones that loaded, "round_misses" every one that did not (files without them: one
    replay an instance, and its misses)."""
    scored = sum(len(v.get("rounds", [v["score"]])) for by_len in arm["scores"].values()
                 for cell in by_len.values() for v in cell.values())
    return scored, len(arm["round_misses"] if "round_misses" in arm else arm["misses"])


def markdown(result: dict, title: str) -> str:
    acc = accuracy_table(result["arms"])
    # replays, not instances (accuracy_table's "scored"): the paper's protocol replays each instance 3 times
    counts = [_replays(arm) for arm in result["arms"]]
    scored, misses = sum(c[0] for c in counts), sum(c[1] for c in counts)
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
    conv = conv_rows(result)
    if conv:
        conv = ["", "The 8-bit conv state (%):", ""] + conv
    return "\n".join(head + accuracy_rows(result) + precision + conv + tail + comparison_rows(result)) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="evals.run result JSON(s)")
    ap.add_argument("--out", default=None, help="write the markdown here (default: stdout)")
    args = ap.parse_args(argv)
    parts = []
    for path in args.results:
        try:
            result = load_for_tables(path)
            parts.append(markdown(result, str(result.get("model", path)).rstrip("/").rsplit("/", 1)[-1]))
        except (OSError, EOFError, ValueError, KeyError) as e:
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
