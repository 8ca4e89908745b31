"""Quality under compression: the strict warm/replay protocol for every arm, then the paired statistics.

    python -m trtllm_dasc.evals.run --model DIR --out results.json [--plot acc.png]
        [--arms dense,nr16,wr16,nr16+int8,...|paper] [--tasks all|niah_single_1,...] [--lengths 1024,4096]
        [--instances 30] [--device cuda --dtype bfloat16] [--resamples 10000]

`--arms paper` = dense, and at each W in {16, 64, 128, 512}: dasc-nr, dasc-wr, dasc-wr-warm, dasc-nr + INT8 and the five
count-matched random masks (seeds 1234, 2027, 3407, 4519, 5683). The JSON holds the command, the commit,
every replay score (per instance), the misses, the accuracy table and the comparisons; it is rewritten
after every arm, so a run cut by a time limit keeps what it finished.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from trtllm_dasc.evals.protocol import PAPER_MASK_SEEDS, ProtocolConfig, parse_arm, run_arm

PAPER_WINDOWS = (16, 64, 128, 512)


def paper_arms(windows=PAPER_WINDOWS) -> list[str]:
    arms = ["dense"]
    for w in windows:
        arms += [f"nr{w}", f"wr{w}", f"wr-warm{w}", f"nr{w}+int8"] + [f"rand{w}@{s}" for s in PAPER_MASK_SEEDS]
    return arms


def main(argv=None) -> int:
    from trtllm_dasc.evals.report import accuracy_table, comparisons, format_comparisons, plot_accuracy
    from trtllm_dasc.evals.tasks import TASKS
    from trtllm_dasc.provenance import git_commit
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, help="result JSON")
    ap.add_argument("--plot", default=None, help="accuracy vs W_max (PNG)")
    ap.add_argument("--arms", default="paper")
    ap.add_argument("--tasks", default="all")
    ap.add_argument("--lengths", default="1024,2048,4096")
    ap.add_argument("--instances", type=int, default=30)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--commit", default=None, help="commit to record (a device's .git may be stale)")
    args = ap.parse_args(argv)
    try:
        arms = paper_arms() if args.arms == "paper" else [a for a in args.arms.split(",") if a]
        for a in arms:
            parse_arm(a)
        tasks = tuple(TASKS) if args.tasks == "all" else tuple(args.tasks.split(","))
        unknown = [t for t in tasks if t not in TASKS]
        if unknown:
            raise ValueError(f"--tasks: unknown {unknown} (known: {', '.join(TASKS)})")
        lengths = tuple(int(x) for x in args.lengths.split(","))
        if args.instances < 2:
            raise ValueError("--instances must be >= 2 (the bootstrap resamples instances)")
    except ValueError as e:
        print(f"evals.run: error: {e}", file=sys.stderr)
        return 2
    cfg = ProtocolConfig(tasks=tasks, lengths=lengths, instances=args.instances, max_batch=args.max_batch,
                         device=args.device, dtype=args.dtype)
    result = {"command": " ".join(["python -m trtllm_dasc.evals.run", *(argv if argv is not None else sys.argv[1:])]),
              "commit": args.commit or git_commit(), "model": os.path.abspath(args.model), "protocol":
              "strict warm/replay, prompt-end checkpoints, misses excluded (paper App. C.3)",
              "tasks": list(tasks), "lengths": list(lengths), "instances": args.instances, "arms": []}
    t0 = time.time()
    for i, spec in enumerate(arms):
        r = run_arm(args.model, parse_arm(spec), cfg)
        result["arms"].append(r)
        acc = accuracy_table([r])[spec]
        print(f"[evals] {i + 1}/{len(arms)} {spec:16} accuracy {acc['accuracy']:.3f} over {acc['scored']} replays, "
              f"{acc['misses']} misses ({r['seconds']:.0f} s, {time.time() - t0:.0f} s total)", file=sys.stderr,
              flush=True)
        result["accuracy"] = accuracy_table(result["arms"])
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    result["comparisons"] = comparisons(result["arms"], args.resamples)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(format_comparisons(result["comparisons"]))
    if args.plot:
        plot_accuracy(result["arms"], args.plot, f"replay accuracy, {os.path.basename(args.model)}")
        print(f"plot: {args.plot}")
    print(f"json: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
