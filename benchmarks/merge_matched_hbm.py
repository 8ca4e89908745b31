"""Join matched-HBM runs that were split across device calls (one call holds at most 10 minutes) into one
result: the arms side by side, each marked with the run it came from.

An arm may appear in several runs (each half of a run split over two GPUs has its own dense arm): both
are kept, the later one labelled with its run, and every arm without within-seed ratios gets them against
the dense arm of its own run.
Runs join only when they measured the same thing: same model, budget, workload, phases (their blocks),
seeds, concurrency and build flags, at one commit. Otherwise the join is refused, naming the first field that
differs. --allow-mixed-commits joins runs of different commits all the same: the result then says so
(`mixed_commits`) and every arm records its run's commit, so no ratio hides that its two arms ran different code.

    python -m benchmarks merge_matched_hbm RUN.json RUN.json ... --out benchmarks/results/merged.json [--title T]
        [--allow-mixed-commits]
    python -m benchmarks merge_matched_hbm --cells DIR [DIR ...] --out RESULT.json [--title T]

--cells: the cells directories of one resumable measurement (clients.matched_hbm --cells-dir, possibly several
copies from several machines): the result equals one unsplit run's. Refused when the directories hold
different manifests, a cell of another manifest, or cells measured at different commits.
"""
from __future__ import annotations

import argparse
import os
import sys

# what must agree for arms of two runs to be compared as if measured in one
# (the transport too: gRPC and HTTP SSE measure TTFT to different events; and the model's config by its hash)
SAME = ("model", "device", "dtype", "budget_bytes", "dense_checkpoint_bytes", "build_flags", "workload", "seeds",
        "concurrency", "output_tokens", "target_fill", "phases", "transport", "model_config_sha256")
RUN_FIELDS = ("command", "commit", "gpu", "torch", "python", "cpus")


def merge(runs: list[tuple[str, dict]], allow_mixed_commits: bool = False) -> dict:
    """``runs``: (name, result) pairs; the merged result (arms in the order given, a 'run' on each).
    ``allow_mixed_commits``: join runs of different commits, each arm marked with its run's commit."""
    from clients.report import ratios
    from trtllm_dasc.errors import UserError
    if not runs:
        raise UserError("no runs to merge")
    first_name, first = runs[0]
    for name, r in runs:
        if "manifest" in r:
            # a cells measurement's result (clients/assemble.py): its ratios pair each cell with the baseline
            # cell of the same call, weigh sampled phases and are withheld while cells are pending; joining it
            # here would pair whatever blocks each arm has (an unfinished one's dense can hold a phase nr16
            # lacks) and judge the target on them
            raise UserError(f"{name} is the result of a cells measurement (manifest {r['manifest'].get('id')}): "
                            "merge its cells directories instead (--cells DIR [DIR ...])")
    for name, r in runs[1:]:
        for key in SAME:
            if r.get(key) != first.get(key):
                raise UserError(f"{name} and {first_name} differ in {key!r}: not the same measurement")
    commits = {name: r.get("commit") for name, r in runs}
    mixed = len(set(commits.values())) > 1
    if mixed and not allow_mixed_commits:
        raise UserError(f"the runs were measured at different commits ("
                        + ", ".join(f"{n}: {c}" for n, c in commits.items())
                        + "): one measurement, one commit (--allow-mixed-commits to join them, each arm marked)")
    merged = {k: v for k, v in first.items() if k not in ("arms", *RUN_FIELDS)}
    merged["runs"] = [{"name": name, **{k: r.get(k) for k in RUN_FIELDS}} for name, r in runs]
    if mixed:
        merged["mixed_commits"] = (f"joins runs of {len(set(commits.values()))} commits (--allow-mixed-commits): "
                                   "each arm's 'commit' is its run's; its ratios are to the dense arm of that run")
    merged["arms"] = []
    seen = set()
    for name, r in runs:
        base = next((a for a in r["arms"] if a["spec"] == "dense" and a["target"] == "triton"), None)
        for arm in r["arms"]:
            key = (arm["spec"], arm["target"], name)
            if key in seen:
                raise UserError(f"arm {arm['spec']} ({arm['target']}) is in {name} twice")
            seen.add(key)
            entry = {**arm, "run": name, **({"commit": commits[name]} if mixed else {})}
            if any(a["spec"] == arm["spec"] and a["target"] == arm["target"] for a in merged["arms"]):
                # the same arm in two runs (each half of a split run has its own dense): both kept, told apart
                entry["label"] = f"{arm['label']} [{name}]"
            if (base is not None and arm is not base and "vs_dense" not in entry
                    and not arm.get("pending") and not base.get("pending") and not arm.get("unpaired_cells")):
                # within-seed ratios to the dense arm of the same run (a run cut short never wrote them)
                entry["vs_dense"] = ratios(arm, base)
            merged["arms"].append(entry)
    from clients.targets import TARGET, verdict
    merged["target"], merged["target_verdict"] = TARGET, verdict(merged["arms"], merged.get("model"))
    return merged


def main(argv=None) -> int:
    import json
    from clients.matched_hbm import report
    from clients.report import write_json
    from trtllm_dasc.errors import UserError
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", help="result JSONs of clients.matched_hbm / serve_matched_hbm.py")
    ap.add_argument("--cells", nargs="+", default=None, metavar="DIR", help="cells directories of one measurement")
    ap.add_argument("--out", required=True, help="merged JSON (the plot goes beside it, .png)")
    ap.add_argument("--title", default=None)
    ap.add_argument("--allow-mixed-commits", action="store_true", help="join runs of different commits (refused "
                    "otherwise); the output records each arm's commit and says it joins several")
    args = ap.parse_args(argv)
    try:
        if args.cells:
            return _merge_cells(args, sys.argv[1:] if argv is None else list(argv))
        if not args.runs:
            raise UserError("give result JSONs, or --cells DIR")
        runs = []
        for path in args.runs:
            try:
                with open(path) as f:
                    runs.append((os.path.basename(path), json.load(f)))
            except (OSError, ValueError) as e:
                raise UserError(f"cannot read {path}: {e}") from None
        merged = merge(runs, args.allow_mixed_commits)
        merged["json_path"] = args.out
        write_json(args.out, merged)
    except UserError as e:
        print(f"merge_matched_hbm: error: {e}", file=sys.stderr)
        return 2
    report(merged, os.path.splitext(args.out)[0] + ".png",
           args.title or f"matched-HBM serving, budget {merged['budget_bytes']:,} B ({len(runs)} runs joined)")
    return 0


def _merge_cells(args, argv: list[str]) -> int:
    from clients.cells import load_dirs
    from clients.matched_hbm import report, result_of
    from clients.report import provenance, write_json
    manifest, calls, cells = load_dirs(args.cells)
    commit = (calls or cells)[0].get("commit") if (calls or cells) else None
    prov = provenance(["-m", "benchmarks", "merge_matched_hbm", *argv], commit)
    # 'commit' is the cells' (the measurement's); the code that assembled them may be later: recorded too
    from trtllm_dasc.provenance import git_commit
    result = result_of(manifest, calls, cells, prov,
                       {"assembled_by": {"script": "benchmarks/merge_matched_hbm.py --cells",
                                         "commit": git_commit(os.path.dirname(os.path.abspath(__file__)))}})
    # as given (a committed cells directory is named relative to the repository)
    result["cells_dirs"] = list(args.cells)
    result["json_path"] = args.out
    write_json(args.out, result)
    report(result, os.path.splitext(args.out)[0] + ".png",
           args.title or f"matched-HBM serving, budget {result['budget_bytes']:,} B ({len(calls)} calls joined)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
