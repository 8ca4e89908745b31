"""Join an A/B of the store / load kernels (scripts/gpu/ab_state_bandwidth.sh: two commits, one H200, runs in
the order base, head, head, base) into one result: per codec, each run's weakest arm against a same-size copy
(CUDA-graph replays, zeroing flush: the figure the 80% target is judged on) and the head's change over the base,
pooled over the runs of each side.

    python -m benchmarks ab_state_bandwidth DIR --out benchmarks/results/state_bandwidth_ab_h200.json

DIR holds base_1.json, head_1.json, head_2.json, base_2.json (state_bandwidth.py results; a missing run, one
the call's time cut, is left out and said so). A result under benchmarks/results/ names a clean commit: the
head's, which is where this joiner must run from as well.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

RUNS = ("base_1", "head_1", "head_2", "base_2")
# the figure codec_verdicts judge (benchmarks/state_bandwidth.py): the weakest arm against a same-size copy
FIGURE = "pct_of_same_size_copy_graph"


def weakest(result: dict) -> dict[str, dict]:
    """codec -> {'min_pct', 'arm'} of one state_bandwidth result."""
    return {codec: {"min_pct": v[FIGURE]["min_pct"], "arm": v[FIGURE]["arm"]}
            for codec, v in result["codec_verdicts"].items()}


def join(runs: dict[str, dict]) -> dict:
    """``runs``: run name (RUNS) -> its state_bandwidth result. Refuses runs of one side at two commits."""
    sides: dict[str, set] = {"base": set(), "head": set()}
    for name, r in runs.items():
        sides[name.split("_")[0]].add(r["commit"])
    for side, commits in sides.items():
        if len(commits) > 1:
            raise ValueError(f"the {side} runs name several commits: {sorted(commits)}")
    per_run = {name: weakest(r) for name, r in runs.items()}
    codecs = sorted({c for w in per_run.values() for c in w})
    per_codec = {}
    for codec in codecs:
        row = {name: w[codec]["min_pct"] for name, w in per_run.items() if codec in w}
        base = [v for k, v in row.items() if k.startswith("base")]
        head = [v for k, v in row.items() if k.startswith("head")]
        entry = {"runs": row, "arm": {name: w[codec]["arm"] for name, w in per_run.items() if codec in w}}
        if base and head:
            entry["base_mean"] = sum(base) / len(base)
            entry["head_mean"] = sum(head) / len(head)
            entry["head_minus_base_points"] = entry["head_mean"] - entry["base_mean"]
        per_codec[codec] = entry
    return {"base_commit": next(iter(sides["base"]), None), "head_commit": next(iter(sides["head"]), None),
            "figure": FIGURE, "runs_present": [n for n in RUNS if n in runs],
            "runs_missing": [n for n in RUNS if n not in runs], "per_codec": per_codec,
            "commands": {name: r["command"] for name, r in runs.items()},
            "device": sorted({r.get("device") for r in runs.values()})}


def report(joined: dict) -> str:
    lines = [f"per codec, weakest arm vs a same-size copy (graph, zeroing flush); base {joined['base_commit']}, "
             f"head {joined['head_commit']}",
             f"{'codec':<10} " + " ".join(f"{n:>7}" for n in joined["runs_present"]) + "   head-base"]
    for codec, e in joined["per_codec"].items():
        cells = " ".join(f"{e['runs'][n]:>6.1f}%" if n in e["runs"] else f"{'-':>7}" for n in joined["runs_present"])
        diff = f"{e['head_minus_base_points']:+.1f} pts" if "head_minus_base_points" in e else "-"
        lines.append(f"{codec:<10} {cells}   {diff}")
    if joined["runs_missing"]:
        lines.append(f"missing (cut by the call's time): {', '.join(joined['runs_missing'])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="the call's files: base_1.json, head_1.json, head_2.json, base_2.json")
    ap.add_argument("--out", default=None, help="joined result JSON (none: print only)")
    args = ap.parse_args(argv)
    runs = {}
    for name in RUNS:
        path = os.path.join(args.dir, name + ".json")
        if os.path.exists(path):
            with open(path) as f:
                runs[name] = json.load(f)
    if not any(n.startswith("base") for n in runs) or not any(n.startswith("head") for n in runs):
        print(f"ab_state_bandwidth: error: {args.dir} needs at least one base and one head run", file=sys.stderr)
        return 2
    try:
        joined = join(runs)
    except ValueError as e:
        print(f"ab_state_bandwidth: error: {e}", file=sys.stderr)
        return 2
    print(report(joined))
    if args.out:
        from benchmarks.results_io import provenance, write_result
        result = {**provenance("benchmarks/ab_state_bandwidth.py", argv, commit=joined["head_commit"]), **joined}
        write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
