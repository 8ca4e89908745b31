"""Why the first seed of a serving phase runs slower: the matched-HBM protocol's blocks in-process, every
engine step timed, the replays profiled.

On the H200 (serve_matched_hbm_h200.json) the first of three seeds of every phase had a 1.3-2.5x higher
mean TTFT than the other two, in every arm, with the same hit rate; the excess grew with the block size.
Seeds differ only in the replay order, so something paid once per new prompt (or new shape) is inside
the first replay. This runs one phase of the protocol straight through Engine (as clients/inprocess.py,
no Triton) and records, for each fill and replay of each seed:
  - wall seconds, engine steps, the sum of ModelRunner.execute times and the slowest steps with their
    plan's shape (spans, tokens, loads, replays, longest context);
  - the CUDA caching allocator's counters (device allocations, frees, retries) over the call;
  - for the replays, a torch.profiler table of the costliest ops and CUDA runtime calls.
Seed 1 against seed 2 then says whether the excess is in the engine's steps, and where.

    python -m benchmarks first_seed_profile --model /tmp/kimi48 --arm dense --phase-arm nr16 --out OUT.json
    python -m benchmarks first_seed_profile --smoke      # CPU, the embedded tiny model
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

from benchmarks.results_io import provenance, write_result  # noqa: E402

ALLOC_KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")


def _alloc_stats(torch) -> dict:
    if not torch.cuda.is_available():
        return {}
    s = torch.cuda.memory_stats()
    return {k: s.get(k, 0) for k in ALLOC_KEYS} | {"reserved_bytes": s.get("reserved_bytes.all.current", 0)}


class TimedRunner:
    """Wraps ModelRunner.execute: each step's wall time and its plan's shape."""

    def __init__(self, runner):
        self.runner, self.steps = runner, []
        self._execute = runner.execute
        runner.execute = self.execute

    def execute(self, plan, *args, **kwargs):
        t0 = time.perf_counter()
        out = self._execute(plan, *args, **kwargs)
        self.steps.append({"ms": round((time.perf_counter() - t0) * 1e3, 3), "spans": len(plan.spans),
                           "tokens": sum(len(s.token_ids) for s in plan.spans),
                           "max_context": max((s.start + len(s.token_ids) for s in plan.spans), default=0),
                           "loads": len(plan.loads), "replays": len(plan.replays)})
        return out

    def take(self) -> list[dict]:
        steps, self.steps = self.steps, []
        return steps


def _profile_table(prof, rows: int) -> list[dict]:
    out = []
    for e in sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]:
        out.append({"name": e.key, "calls": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 3),
                    "device_ms": round(getattr(e, "self_device_time_total", 0) / 1e3, 3)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="/tmp/kimi48")
    ap.add_argument("--arm", default="dense", help="the arm to run (dense, nr16, wr16, nr16+int8, ...)")
    ap.add_argument("--phase-arm", default="nr16", help="the arm whose capacity boundary sets the block size Q")
    ap.add_argument("--dense-slots", type=int, default=16)
    ap.add_argument("--seeds", default="42,123,7")
    ap.add_argument("--prompt-only", action="store_true")
    ap.add_argument("--profile-rows", type=int, default=30)
    ap.add_argument("--work", default="/tmp/first_seed_profile")
    ap.add_argument("--kernel-cache", default=None, help="compiled-kernel cache (default WORK/kernels)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "first_seed_profile_h200.json"))
    ap.add_argument("--commit", default=None)
    ap.add_argument("--smoke", action="store_true", help="CPU, the embedded tiny model, a tiny scale")
    args = ap.parse_args(argv)

    import torch

    from clients import arms as armlib
    from clients import matched_hbm
    from clients.inprocess import EngineTarget
    from clients.protocol import make_phases, run_block
    from clients.workload import build_workload
    from trtllm_dasc.cli import _Parser

    if args.smoke:
        model = os.path.join(ROOT, "trtllm_dasc", "assets", "tiny-kimi-linear")
        base = ["--scale", "0.03", "--device", "cpu", "--dtype", "float32", "--max-batch-size", "4",
                "--concurrency", "4", "--torch-threads", "1"]
        dense_slots = 3
    else:
        model = args.model
        base = ["--scale", "1.0", "--device", "cuda", "--dtype", "bfloat16", "--max-batch-size", "64",
                "--max-num-tokens", "8192", "--concurrency", "96"]
        dense_slots = args.dense_slots
    flags = ["--model", model, "--out", args.work, "--arms", args.arm, "--phase-arms", args.phase_arm,
             "--dense-slots", str(dense_slots), "--seeds", args.seeds, "--blocks-per-phase", "1", *base]
    if args.prompt_only:
        flags.append("--prompt-only")
    parser = _Parser(prog="first_seed_profile")
    matched_hbm.add_arguments(parser)
    mh = parser.parse_args(flags)
    arms, proto, wcfg = matched_hbm.check(mh)
    arm, phase_arm = arms[0], armlib.parse_arms(args.phase_arm)[0]
    dense_bytes = armlib.dense_checkpoint_bytes(model, mh.dtype)
    budget = (dense_slots + 1) * dense_bytes
    cap = armlib.capacity(model, phase_arm, budget, mh.dtype)
    work = build_workload(wcfg)
    (phase,) = make_phases({phase_arm.spec: cap["slots"]}, len(work), proto)
    engine_dir = armlib.build_engine(model, arm, os.path.join(args.work, "engines", arm.spec), budget,
                                     matched_hbm.engine_flags(mh, wcfg, [phase], proto.output_tokens))
    armlib.share_kernels(engine_dir, args.kernel_cache or os.path.join(args.work, "kernels"))
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(engine_dir, "kernels"))
    print(f"[first-seed] arm {arm.label}, phase {phase.name}, block {phase.blocks[0]}", file=sys.stderr)

    t0 = time.perf_counter()
    target = EngineTarget(engine_dir, mh.concurrency, torch_threads=mh.torch_threads)
    ready_s = time.perf_counter() - t0
    timed = TimedRunner(target.engine.runner)
    calls = []
    inner_run = target.run

    def run(prompts, output_tokens, progress=None):
        # the third call of each block is the timed replay (fill = first-of-category, then the rest)
        kind = "replay" if len(calls) % 3 == 2 else "fill"
        before = _alloc_stats(torch)
        prof = None
        if kind == "replay":
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            from torch._C._profiler import _ExperimentalConfig
            # the engine steps run on its loop thread, not this one
            prof = profile(activities=acts, experimental_config=_ExperimentalConfig(profile_all_threads=True))
            prof.__enter__()
        timed.take()
        recs, seconds = inner_run(prompts, output_tokens, progress)
        steps = timed.take()
        if prof is not None:
            prof.__exit__(None, None, None)
        after = _alloc_stats(torch)
        entry = {"kind": kind, "requests": len(prompts), "seconds": round(seconds, 4),
                 "ttft_mean_ms": round(1e3 * sum(r.ttft_s or 0 for r in recs) / max(1, len(recs)), 3),
                 "steps": len(steps), "execute_s": round(sum(s["ms"] for s in steps) / 1e3, 4),
                 "slowest_steps": sorted(steps, key=lambda s: s["ms"], reverse=True)[:8],
                 "allocator": {k: after[k] - before[k] for k in after}}
        if prof is not None:
            entry["profile"] = _profile_table(prof, args.profile_rows)
        calls.append(entry)
        print(f"[first-seed]   {kind:6} {len(prompts):4} requests {seconds:7.3f} s, {len(steps)} steps, "
              f"execute {entry['execute_s']:.3f} s, allocator {entry['allocator']}", file=sys.stderr)
        return recs, seconds

    target.run = run
    lo, hi = phase.blocks[0]
    seeds = []
    try:
        for seed in proto.seeds:
            print(f"[first-seed] seed {seed}", file=sys.stderr)
            rec = run_block(target, work, lo, hi, seed, proto)
            seeds.append({"seed": seed, "hit_rate": rec["replay"]["hit_rate"], "calls": calls[-3:]})
    finally:
        target.close()
    result = {**provenance("benchmarks/first_seed_profile.py", argv, args.commit),
              "arm": arm.label, "phase": phase.name, "block": [lo, hi], "budget_bytes": budget,
              "prompt_only": args.prompt_only, "ready_s": ready_s, "torch": torch.__version__,
              "sdp_backends": {name: getattr(torch.backends.cuda, f"{name}_sdp_enabled")()
                               for name in ("flash", "mem_efficient", "math", "cudnn")},
              "seeds": seeds}
    write_result(args.out, result)
    for s in seeds:
        rep = s["calls"][2]
        print(f"seed {s['seed']}: replay {rep['seconds']:.3f} s, TTFT {rep['ttft_mean_ms']:.0f} ms, "
              f"{rep['steps']} steps, execute {rep['execute_s']:.3f} s, hit {s['hit_rate']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
