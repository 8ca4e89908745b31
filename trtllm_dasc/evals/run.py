"""Quality under compression: the strict warm/replay protocol for every arm, then the paired statistics.

    python -m trtllm_dasc.evals.run --model DIR --out results.json [--plot acc.png]
        [--arms dense,nr16,wr16,nr16+int8,...|paper] [--tasks all|niah_single_1,...] [--lengths 1024,4096]
        [--instances 30] [--device cuda --dtype bfloat16] [--resamples 10000]
        [--shard I/N]                       (only arms I, I+N, I+2N, ... of the list: parallel processes)
        [--replay-window R]                 (every wr arm's hit replays R tokens, not W_max: a diagnostic)
    python -m trtllm_dasc.evals.run --merge part0.json part1.json ... --out results.json [--plot acc.png]
        (the parts: shards of one run, and/or runs of the same arms at disjoint lengths: one result over all)

`--paper`: the paper's RULER protocol (App. C.3) in one command: all 13 subtasks, N = 30 unique instances per
subtask, length and arm, one warm-up pass and three measured replay rounds averaged per instance, lengths 4k and
8k (`--lengths 4096,8192,16384` adds 16k), arms `paper_protocol_arms()`: dense, dasc-nr and dasc-wr at W = 16 /
64 / 128 / 512, dasc-nr + INT8 at W = 16, and the count-matched random masks (five seeds) at every W; then the
paper-style tables (evals/paper_tables.py) beside the JSON (OUT.md). `--smoke`: the same protocol shrunk to run
on a CPU in about a minute (a random-weight tiny model unless --model, 2 subtasks x 256 tokens x 3 instances,
W = 16 only); any flag given explicitly overrides either preset.

`--arms paper` = dense, and at each W in {16, 64, 128, 512}: dasc-nr, dasc-wr, dasc-wr-warm, dasc-nr + INT8 and the five
count-matched random masks (seeds 1234, 2027, 3407, 4519, 5683). `--arms precision` (issue 35) = dense, and at
W = 16 and 64: dasc-nr, + INT8, + horizon (--precision horizon) and its control with the bands shuffled (the
same five seeds). The JSON holds the command, the commit,
every replay score (per instance), the misses, the accuracy table and the comparisons; it is rewritten
after every arm, so a run cut by a time limit keeps what it finished. It also records the whole run's arm list
(`planned_arms`, before `--shard` takes its part): `--merge` expects exactly those arms from its parts (the union
over the parts; for files written before the record, derived from each part's command) and lists the ones no part
holds (`missing_arms`).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time

from trtllm_dasc.evals.protocol import PAPER_MASK_SEEDS, ProtocolConfig, parse_arm, run_arm
from trtllm_dasc.plan.synthetic import write_tiny_model
from trtllm_dasc.evals.tasks import TASKS
from trtllm_dasc.errors import UserError
from trtllm_dasc.spec import DEFAULT_CONV_CODEC
from trtllm_dasc.provenance import check_results_commit, git_commit
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.evals.report import accuracy_table, comparisons, format_comparisons, plot_accuracy
from trtllm_dasc.evals.paper_tables import write_markdown
from trtllm_dasc.evals.result_file import load_result, write_result

PAPER_WINDOWS = (16, 64, 128, 512)


def paper_arms(windows=PAPER_WINDOWS) -> list[str]:
    arms = ["dense"]
    for w in windows:
        arms += [f"nr{w}", f"wr{w}", f"wr-warm{w}", f"nr{w}+int8"] + [f"rand{w}@{s}" for s in PAPER_MASK_SEEDS]
    return arms


def paper_protocol_arms(windows=PAPER_WINDOWS, int8_windows=(16,)) -> list[str]:
    """The issue-34 / App. C.3 arm set: dense; nr, wr and the five random masks at every W; INT8 at W=16."""
    arms = ["dense"]
    for w in windows:
        arms += [f"nr{w}", f"wr{w}"]
        if w in int8_windows:
            arms.append(f"nr{w}+int8")
        arms += [f"rand{w}@{s}" for s in PAPER_MASK_SEEDS]
    return arms


def precision_arms(windows=(16, 64)) -> list[str]:
    """Issue 35's quality arms: dense; at each W, dasc-nr, + INT8, + horizon (each kept unit's codec from its
    horizon band) and its count-matched control, the bands shuffled within each layer (five seeds)."""
    arms = ["dense"]
    for w in windows:
        arms += [f"nr{w}", f"nr{w}+int8", f"nr{w}+horizon"] + [f"nr{w}+horizon@{s}" for s in PAPER_MASK_SEEDS]
    return arms


def _one_band_set_per_window(specs: list[str]) -> None:
    """The report pairs one horizon arm per W_max with dense, INT8 and its shuffled controls (report.py): two
    band sets at one W in a run would be paired with each other's controls. ValueError, one line."""
    bands: dict[int, set] = {}
    for arm in map(parse_arm, specs):
        if arm.precision_kind is not None:
            bands.setdefault(arm.wmax, set()).add(arm.precision.partition("@")[0])
    for w, found in sorted(bands.items()):
        if len(found) > 1:
            raise ValueError(f"--arms: horizon arms at W={w} name {len(found)} band sets ({', '.join(sorted(found))}): "
                             "the report pairs one set per W with its controls; run the others separately")


def _one_conv_arm_per_window(specs: list[str]) -> None:
    """Likewise one arm with a changed conv codec per W_max, which the report pairs with dense and its
    native-conv twin. ValueError, one line."""
    conv: dict[int, list[str]] = {}
    for arm in map(parse_arm, specs):
        if arm.conv_codec != DEFAULT_CONV_CODEC:
            conv.setdefault(arm.wmax, []).append(arm.spec)
    for w, found in sorted(conv.items()):
        if len(found) > 1:
            raise ValueError(f"--arms: {len(found)} arms at W={w} change the conv codec ({', '.join(found)}): "
                             "the report pairs one per W with dense and its native-conv twin; "
                             "run the others separately")


# the presets' settings; explicit flags win (their argparse defaults are None)
PRESETS = {
    "paper": dict(arms=",".join(paper_protocol_arms()), tasks="all", lengths="4096,8192", instances=30, rounds=3),
    "smoke": dict(arms=",".join(paper_protocol_arms(windows=(16,))[:5] + ["rand16@2027"]),
                  tasks="niah_single_1,niah_multikey_1", lengths="256", instances=3, rounds=3, resamples=500),
}
DEFAULTS = dict(arms="paper", tasks="all", lengths="1024,2048,4096", instances=30, rounds=1, resamples=10_000)


def _smoke_model(out: str) -> str:
    """A random-weight tiny Kimi-Linear beside the result (plan/synthetic.py: the paper's decay profile)."""
    path = os.path.splitext(out)[0] + "_smoke_model"
    if not os.path.isfile(os.path.join(path, "config.json")):
        write_tiny_model(path, "kda", seed=0)
    return path


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint directory (save_pretrained)")
    ap.add_argument("--out", required=True, help="result JSON (NAME.json.gz: gzip-compressed)")
    ap.add_argument("--plot", default=None, help="accuracy vs W_max (PNG)")
    ap.add_argument("--arms", default=None, help="comma list of arm specs, or paper (the 37-arm sweep), or precision "
                    "(dense; nr, nr+int8, nr+horizon and five shuffled-band controls at W 16 and 64)")
    ap.add_argument("--tasks", default=None, help="all (the 13 RULER subtasks, the default) or a comma list")
    ap.add_argument("--lengths", default=None, help="default 1024,2048,4096 (--paper: 4096,8192)")
    ap.add_argument("--instances", type=int, default=None, help="unique instances per task and length (30)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="measured replay rounds per instance, averaged (default 1; --paper: 3)")
    ap.add_argument("--paper", action="store_true", help="the paper's RULER protocol (App. C.3), see above")
    ap.add_argument("--smoke", action="store_true", help="the --paper protocol shrunk to a minute on the CPU")
    ap.add_argument("--max-batch", type=int, default=16, help="requests the engine runs at once (default 16)")
    ap.add_argument("--replay-window", type=int, default=None,
                    help="tokens every wr arm's hit replays instead of its W_max (a diagnostic: how far back the "
                         "units W omits still matter; recorded in the result, and a merge keeps runs of one window)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="model dtype (default float32)")
    ap.add_argument("--resamples", type=int, default=None, help="bootstrap resamples (10,000)")
    ap.add_argument("--commit", default=None, help="commit to record (a device's .git may be stale)")
    ap.add_argument("--shard", default=None, help="I/N: run only every N-th arm of the list, from the I-th")
    ap.add_argument("--merge", nargs="+", default=None, metavar="PART",
                    help="join the result JSONs of shards (same model, tasks, lengths, instances), or of runs at other "
                         "lengths (disjoint length lists: one result over every length), instead of running")
    return ap


def _parse(argv) -> argparse.Namespace:
    """The arguments with the preset's settings (explicit flags win) and the defaults filled in."""
    args = _parser().parse_args(argv)
    preset = PRESETS["smoke"] if args.smoke else PRESETS["paper"] if args.paper else {}
    for key, value in {**DEFAULTS, **preset}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def arm_list(arms: str) -> list[str]:
    """--arms as the list of arm specs of the whole run (before --shard takes its part)."""
    return paper_arms() if arms == "paper" else precision_arms() if arms == "precision" else \
        [a for a in arms.split(",") if a]


def main(argv=None) -> int:
    args = _parse(argv)
    try:
        return _main(args, argv)
    except UserError as e:          # a refused write (provenance.check_results_commit), in one line
        print(f"evals.run: error: {e}", file=sys.stderr)
        return 2


def _main(args, argv) -> int:
    if args.merge:
        return merge(args.merge, args.out, args.plot, args.resamples)
    # a run into benchmarks/results/ at an unclean commit is refused before it computes anything
    check_results_commit(args.out, args.commit or git_commit())
    try:
        if args.paper and args.smoke:
            raise ValueError("--paper and --smoke are two presets: give one")
        if args.rounds < 1:
            raise ValueError("--rounds must be >= 1")
        if not args.model and args.smoke:
            args.model = _smoke_model(args.out)
        if not args.model:
            raise ValueError("--model is required (or --merge, or --smoke)")
        arms = planned = arm_list(args.arms)
        if args.shard:
            i, n = (int(x) for x in args.shard.split("/"))
            if not 0 <= i < n:
                raise ValueError(f"--shard {args.shard}: need 0 <= I < N")
            arms = arms[i::n]
        for a in arms:
            parse_arm(a)
        _one_band_set_per_window(planned)
        _one_conv_arm_per_window(planned)
        tasks = tuple(TASKS) if args.tasks == "all" else tuple(args.tasks.split(","))
        unknown = [t for t in tasks if t not in TASKS]
        if unknown:
            raise ValueError(f"--tasks: unknown {unknown} (known: {', '.join(TASKS)})")
        lengths = tuple(int(x) for x in args.lengths.split(","))
        if args.instances < 2:
            raise ValueError("--instances must be >= 2 (the bootstrap resamples instances)")
        if args.replay_window is not None and args.replay_window < 1:
            raise ValueError("--replay-window must be >= 1 (tokens)")   # in the flag's words; ProtocolConfig checks too
        cfg = ProtocolConfig(tasks=tasks, lengths=lengths, instances=args.instances, max_batch=args.max_batch,
                             device=args.device, dtype=args.dtype, rounds=args.rounds,
                             replay_window=args.replay_window)
    except ValueError as e:
        print(f"evals.run: error: {e}", file=sys.stderr)
        return 2
    result = {"arch": HybridConfig.from_path(args.model).arch, "command": " ".join(["python -m trtllm_dasc.evals.run", *(argv if argv is not None else sys.argv[1:])]),
              "commit": args.commit or git_commit(), "model": os.path.abspath(args.model), "protocol":
              "strict warm/replay, prompt-end checkpoints, misses excluded (paper App. C.3)",
              "tasks": list(tasks), "lengths": list(lengths), "instances": args.instances, "rounds": args.rounds,
              "replay_window": args.replay_window,
              "preset": "paper" if args.paper else "smoke" if args.smoke else None,
              # the arms of the whole run, every shard's: what --merge expects the parts to hold together
              "planned_arms": planned, "arms": []}
    t0 = time.time()
    if args.shard:
        result["shard"] = args.shard
    for i, spec in enumerate(arms):
        r = run_arm(args.model, parse_arm(spec), cfg)
        result["arms"].append(r)
        acc = accuracy_table([r])[spec]
        print(f"[evals] {i + 1}/{len(arms)} {spec:16} accuracy {acc['accuracy']:.3f} over {acc['scored']} instances "
              f"(each the mean of its rounds), {acc['misses']} missed ({r['seconds']:.0f} s, "
              f"{time.time() - t0:.0f} s total)", file=sys.stderr, flush=True)
        result["accuracy"] = accuracy_table(result["arms"])
        _write(args.out, result)
    _finish(result, args.out, args.plot, args.resamples)
    if args.paper or args.smoke:
        md = os.path.splitext(args.out)[0] + ".md"
        write_markdown([result], md, resamples=args.resamples)
        print(f"tables: {md}")
    return 0


def _finish(result: dict, out: str, plot: str | None, resamples: int) -> None:
    result["accuracy"] = accuracy_table(result["arms"])
    result["comparisons"] = comparisons(result["arms"], resamples)
    result["resamples"] = resamples
    _write(out, result)
    print(format_comparisons(result["comparisons"]))
    if plot:
        plot_accuracy(result["arms"], plot, f"replay accuracy, {os.path.basename(result['model'])}")
        print(f"plot: {plot}")
    print(f"json: {out}")


def _write(path: str, result: dict) -> None:
    """Whole or not at all: a run stopped by a time limit leaves the arms it finished, readable. Into
    benchmarks/results/ only at a clean commit (provenance.check_results_commit)."""
    check_results_commit(path, result)
    write_result(path, result)               # NAME.json.gz: compressed (evals/result_file.py: why)


# what every part of a merge must share: the same instances, scored the same way
SHARED = ("model", "tasks", "lengths", "instances", "protocol", "rounds", "replay_window")


def planned_arms(part: dict) -> list[str]:
    """The arms of the run a result (or one entry of a merge's "parts") belongs to: as recorded ("planned_arms"),
    else from the entries of its own parts (a merge), else from its command (the run's flags and preset: files
    written before the record), else the arms it holds."""
    if part.get("planned_arms"):
        return list(part["planned_arms"])
    if part.get("parts"):
        out = []
        for q in part["parts"]:
            out += [a for a in planned_arms(q) if a not in out]
        return out
    words = str(part.get("command") or "").split()
    if "trtllm_dasc.evals.run" in words and "--merge" not in words:
        try:
            with contextlib.redirect_stderr(io.StringIO()):      # a command we cannot parse: no usage text
                return arm_list(_parse(words[words.index("trtllm_dasc.evals.run") + 1:]).arms)
        except SystemExit:
            pass
    return [a if isinstance(a, str) else a["arm"] for a in part.get("arms", [])]


def _join_arm(into: dict, more: dict) -> None:
    """One arm's results at other lengths added to its results at these: the per-instance scores (keyed by
    task, then length), the misses and the seconds."""
    for task, by_length in more["scores"].items():
        into["scores"].setdefault(task, {}).update(by_length)
    into["misses"] = list(into.get("misses", [])) + list(more.get("misses", []))
    into["round_misses"] = list(into.get("round_misses", [])) + list(more.get("round_misses", []))
    into["seconds"] = into.get("seconds", 0.0) + more.get("seconds", 0.0)


def _lengths_held(arm: dict) -> list[int]:
    """The lengths an arm entry holds scores for (a cell exists once an arm ran a length, even when every
    instance missed): what a part really brings, whatever length list it declares."""
    return sorted({int(n) for by_length in arm["scores"].values() for n in by_length})


def merge(parts: list[str], out: str, plot: str | None, resamples: int) -> int:
    """Join shards' result JSONs (arms run in parallel processes) into one, with the statistics over all.
    Parts may also be runs of the same arms at other lengths (a run per length, so a time limit costs the
    last length only), or an earlier merge topped up with what a later call ran: they are joined cell by cell,
    a cell being one arm at one length, into one result over every length (the paper's tables span 4k / 8k /
    16k); a cell two parts both hold is refused, never counted twice.
    A part that cannot be read (a shard killed before its first arm finished) is skipped with a warning;
    the arms of the run (planned_arms: what the shards were run with) that lack a length are listed in the
    result (missing_arms; missing_at: at which lengths) and said."""
    try:
        loaded, read = [], []
        for p in parts:
            try:
                loaded.append(load_result(p))
                read.append(p)
            except (OSError, EOFError, ValueError) as e:      # ValueError: not JSON, or not UTF-8
                print(f"evals.run: warning: --merge: skipping {p}: {e}", file=sys.stderr)
        if not loaded:
            raise ValueError("no part could be read")
        parts = read
        first = loaded[0]
        for p, r in zip(parts, loaded):
            diff = [k for k in SHARED if k != "lengths" and r.get(k) != first.get(k)]
            if diff:
                raise ValueError(f"{p} differs from {parts[0]} in {', '.join(diff)}")
        arms, cells = {}, {}          # arm -> joined entry; (arm, length) -> the part that holds that cell
        for p, r in zip(parts, loaded):
            for a in r["arms"]:
                held = _lengths_held(a)
                twice = [n for n in held if (a["arm"], n) in cells]
                if twice:
                    raise ValueError(f"arm {a['arm']} at {','.join(map(str, twice))} tokens is in both "
                                     f"{cells[a['arm'], twice[0]]} and {p}")
                cells.update({(a["arm"], n): p for n in held})
                if a["arm"] in arms:
                    _join_arm(arms[a["arm"]], a)
                else:
                    arms[a["arm"]] = {**a, "scores": {t: dict(v) for t, v in a["scores"].items()}}
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"evals.run: error: --merge: {e}", file=sys.stderr)
        return 2
    # the arm set the parts were run for, recorded in each (or derived from its command): a complete
    # --paper or --arms precision run is complete, whatever arms other presets would have had
    expected = []
    for r in loaded:
        expected += [a for a in planned_arms(r) if a not in expected]
    order = {a: i for i, a in enumerate(expected)}
    joined = sorted(arms.values(), key=lambda a: order.get(a["arm"], len(order)))
    lengths = sorted({int(n) for r in loaded for n in r["lengths"]})
    result = {**{k: first.get(k) for k in SHARED}, "lengths": lengths, "commit": first.get("commit"),
              # the code that joined the parts (the parts' commits ran them): a "commit" key, so a merge
              # into benchmarks/results/ is refused from a tree with uncommitted changes too
              "merged_by": {"commit": git_commit()},
              "arch": first.get("arch"), "preset": first.get("preset"),
              "command": "python -m trtllm_dasc.evals.run --merge " + " ".join(parts),
              # a part that is itself a merge (an earlier call's result joined with the arms a later call
              # added) contributes its own parts, so every entry is one process's command
              "parts": [q for r in loaded for q in (r.get("parts") or [
                  {"command": r.get("command"), "commit": r.get("commit"), "shard": r.get("shard"),
                   "lengths": r.get("lengths"), "planned_arms": planned_arms(r),
                   "arms": [a["arm"] for a in r["arms"]]}])],
              "planned_arms": expected, "arms": joined}
    absent = {a: [n for n in lengths if (a, n) not in cells] for a in expected}
    result["missing_arms"] = [a for a in expected if absent[a]]
    result["missing_at"] = {a: absent[a] for a in result["missing_arms"]}
    if result["missing_arms"]:
        where = "" if len(lengths) == 1 else " (" + "; ".join(
            f"{a} at {','.join(map(str, absent[a]))}" for a in result["missing_arms"]) + ")"
        print(f"evals.run: --merge: {len(result['missing_arms'])} of the run's {len(expected)} arms are in no part: "
              f"{', '.join(result['missing_arms'])}{where}", file=sys.stderr)
    _finish(result, out, plot, resamples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
