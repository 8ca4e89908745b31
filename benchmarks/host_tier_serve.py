"""H200: serving with the host tier of checkpoints at equal GPU memory vs without (issue 36 item 5), and its copies.

Parts (``--parts``, all by default), every engine in this process (clients.protocol's blocks straight into an
Engine, timed like the gRPC clients: TTFT from submit to the first token), Kimi-Linear-48B-shaped checkpoint:
  serve   the paper's protocol phases past GPU capacity: the W=512 capacity boundary's block and the
          full-dataset phase (``--prompts`` prompts in one block), flush -> fill -> shuffled replay, one
          output token, prompt-end checkpoints. Arms at one GPU checkpoint budget (``--dense-slots`` dense
          checkpoints): dense, dasc-nr W=16, + INT8, each without and with a host tier of ``--host-factor``
          x that budget (LRU, write-back), and dasc-nr W=16 with cost-aware eviction, GPU-only and + host
          (the simulation, host_tier_sim.json, saw the two rules differ GPU-only, where slots are scarce),
          and + host write-through (copied at store time: no copy on an eviction). Per arm and
          phase: token hit rate (Eq. 9), mean / p50 / p90 TTFT, input throughput, promotions and demotions.
  copies  on the nr16+host arm's engine: (a) bandwidth device <-> pinned host of one large copy and of the
          tier's own per-slot copies; (b) one promotion (host -> device, one checkpoint) against the
          uncached prefill of a prompt of the workload's mean length, the cost a hit saves; (c) overlap: a
          prefill step alone, a demotion of ``--overlap-slots`` checkpoints alone, and the two at once (the
          demotion queued on the copy stream just before the step): step slowdown and overlap fraction
          (t_step + t_copy - t_both) / min(t_step, t_copy), 1 = fully hidden.

Targets (issue 36, written before any run): on the full-dataset phase, nr16+host reaches a token hit rate
>= 2x nr16's (GPU-only) and a lower mean TTFT; a promotion costs <= 10% of the prefill it saves. Not a
target but recorded: the copies overlap the step (overlap fraction near 1, slowdown near 1).

The JSON is rewritten after every arm; run again with the same --out and the arms already there are kept
(a run split over calls: --arms A,B then --arms C,D).

    python -m benchmarks host_tier_serve --commit SHA [--arms ...] [--parts serve,copies] [--out PATH]
    python -m benchmarks host_tier_serve --smoke      # the CPU path: embedded tiny model, tiny scale
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# name -> engine overrides (the host tier's size is --host-factor x the GPU budget)
ARMS = {"nr16": dict(wmax=16), "nr16+host": dict(wmax=16, host=True), "dense": dict(wmax=0),
        "dense+host": dict(wmax=0, host=True), "nr16+host+cost": dict(wmax=16, host=True, eviction="cost"),
        "nr16+cost": dict(wmax=16, eviction="cost"),
        "nr16+host+wt": dict(wmax=16, host=True, host_write_policy="write-through"),
        "nr16+int8": dict(wmax=16, codec="int8"), "nr16+int8+host": dict(wmax=16, codec="int8", host=True)}
RESUMABLE = ("arms", "parts", "commit", "out")
TARGET_HIT_RATIO = 2.0
TARGET_PROMOTION_OVER_PREFILL = 0.10
GPU = dict(model="/tmp/kimi48", device="cuda", dtype="bfloat16", dense_slots=16, prompts=512, scale=1.0,
           seeds="42", concurrency=32, max_batch=32, max_num_tokens=8192, bandwidth_bytes=256 << 20,
           overlap_slots=64, repeats=5)
SMOKE = dict(model=os.path.join(ROOT, "trtllm_dasc", "assets", "tiny-kimi-linear"), device="cpu",
             dtype="float32", dense_slots=1, prompts=16, scale=0.03, seeds="42", concurrency=4, max_batch=4,
             max_num_tokens=None, bandwidth_bytes=1 << 20, overlap_slots=4, repeats=2)


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, the embedded tiny model, a tiny scale")
    ap.add_argument("--arms", default=None, help=f"comma list of {','.join(ARMS)} (default: all; smoke: nr16 two)")
    ap.add_argument("--parts", default="serve,copies")
    ap.add_argument("--host-factor", type=int, default=8, help="host tier bytes = this x the GPU checkpoint budget")
    ap.add_argument("--out", default=None)
    ap.add_argument("--commit", default=None, help="commit to record (the device's .git may be stale)")
    for key, value in GPU.items():
        ap.add_argument("--" + key.replace("_", "-"), type=type(value) if value is not None else int, default=None)
    args = ap.parse_args(argv)
    for key, value in (SMOKE if args.smoke else GPU).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.arms = args.arms or ("nr16,nr16+host" if args.smoke else ",".join(ARMS))
    unknown = [a for a in args.arms.split(",") if a not in ARMS]
    if unknown:
        ap.error(f"unknown arms {unknown}: choose from {','.join(ARMS)}")
    args.out = args.out or ("/tmp/host_tier_serve_smoke.json" if args.smoke
                            else os.path.join(HERE, "results", "host_tier_serve_h200.json"))
    return args


def budgets(args) -> tuple[int, dict]:
    """The GPU checkpoint budget and each arm's device slots (the planner's accounting at that budget)."""
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    from trtllm_dasc.plan.accounting import slots_for_budget
    conv = "float32" if args.dtype == "float32" else "bfloat16"
    cfg = HybridConfig.from_path(args.model, conv_dtype=conv)
    budget = (args.dense_slots + 1) * cfg.dense_checkpoint_bytes_per_rank(1)
    slots = {}
    for name, (wmax, codec) in {"dense": (0, "native"), "nr16": (16, "native"), "nr16+int8": (16, "int8"),
                                "nr512": (512, "native")}.items():
        plan, _ = plan_from_path(args.model, PlanOptions(wmax=wmax, tp=1, placement="off", codec=codec),
                                 conv_dtype=conv)
        slots[name] = {"slot_bytes": plan.bottleneck_slot_bytes(),
                       "slots": slots_for_budget(budget, plan.bottleneck_slot_bytes())}
    return budget, slots


def engine_config(args, arm: str, budget: int, kv_blocks: int, max_context: int):
    from trtllm_dasc.engine.config import EngineConfig
    over = dict(ARMS[arm])
    host = over.pop("host", False)
    return EngineConfig(model=args.model, device=args.device, dtype=args.dtype, state_budget_bytes=budget,
                        host_cache_bytes=args.host_factor * budget if host else 0, prompt_only=True,
                        max_batch=args.max_batch, max_num_tokens=args.max_num_tokens, block_size=16,
                        num_kv_blocks=kv_blocks, max_context=max_context, policy="nr", **over)


def target(engine, concurrency: int):
    """clients.inprocess.EngineTarget over an engine built here (that one builds its own from an engine dir)."""
    import itertools

    from clients.inprocess import EngineTarget
    t = EngineTarget.__new__(EngineTarget)
    t.engine, t.concurrency, t.timeout, t._ids = engine, concurrency, 600.0, itertools.count()
    return t


def summary(block: dict) -> dict:
    r = block["replay"]
    ttft = sorted(r["ttft_ms"])
    return {"phase": block["phase"], "q": block["q"], "seed": block["seed"], "hit_rate": r["hit_rate"],
            "server_hit_rate": block["server"]["hit_rate"], "ttft_ms_mean": statistics.fmean(ttft),
            "ttft_ms_p50": ttft[len(ttft) // 2], "ttft_ms_p90": ttft[int(0.9 * (len(ttft) - 1))],
            "input_tokens_per_s": r["input_tokens_per_s"], "requests": r["requests"]}


def serve_arm(args, arm, budget, phases, work, kv_blocks) -> dict:
    from clients.protocol import ProtocolConfig, run_block
    from trtllm_dasc.engine.engine import Engine
    engine = Engine(engine_config(args, arm, budget, kv_blocks, work.cfg.max_prompt_tokens + 16))
    t0 = time.time()
    engine.warmup()
    engine.start()
    proto = ProtocolConfig(seeds=tuple(int(s) for s in args.seeds.split(",")), output_tokens=1)
    try:
        tgt, blocks = target(engine, args.concurrency), []
        for phase in phases:
            for seed in proto.seeds:
                for lo, hi in phase.blocks:
                    before = engine.stats()
                    rec = run_block(tgt, work, lo, hi, seed, proto)
                    after = engine.stats()
                    rec["phase"], rec["q"] = phase.name, phase.q
                    rec["tier"] = {k: after.get(k, 0) - before.get(k, 0) for k in
                                   ("checkpoint_promotions", "checkpoint_demotions", "checkpoint_host_evictions",
                                    "checkpoints_dropped")}
                    rec["tier"]["hits"] = {t: after["checkpoint_hits"][t] - before["checkpoint_hits"][t]
                                           for t in after["checkpoint_hits"]}
                    blocks.append({**summary(rec), "tier": rec["tier"]})
                    print(json.dumps({"arm": arm, **blocks[-1]}), flush=True)
        st = engine.stats()
        return {"blocks": blocks, "checkpoint_slots": st["checkpoint_slots"],
                "host_checkpoint_slots": st["host_checkpoint_slots"], "host_tier": st.get("host_tier"),
                "wall_s": time.time() - t0}
    finally:
        engine.shutdown(drain=False, timeout=60)


def _timed(fn, device: str) -> float:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t


def _median(fn, n, device) -> float:
    return statistics.median(_timed(fn, device) for _ in range(n))


def copies(args, budget, work, kv_blocks) -> dict:
    import torch

    from trtllm_dasc.engine.engine import Engine
    from trtllm_dasc.engine.request import GenerationRequest
    engine = Engine(engine_config(args, "nr16+host", budget, kv_blocks, work.cfg.max_prompt_tokens + 16))
    engine.warmup()
    # nothing cached: the copies below write device and host slots that no prefix owns
    engine.flush()
    tier, dev = engine.runner.host_tier, args.device
    n = args.bandwidth_bytes
    # (a) one large copy each way, pinned host memory, on the tier's copy stream kind
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    host = torch.empty(n, dtype=torch.uint8, pin_memory=dev.startswith("cuda"))
    bw = {"bytes": n, "to_host_GBps": n / _median(lambda: host.copy_(src, non_blocking=True), args.repeats, dev) / 1e9,
          "to_device_GBps": n / _median(lambda: src.copy_(host, non_blocking=True), args.repeats, dev) / 1e9}
    del src, host
    k = min(args.overlap_slots, tier.num_slots, engine.stats()["checkpoint_slots"])
    demote = [(1 + i, i) for i in range(k)]

    def run_demotion():
        tier.run(demote, [])
        tier.synchronize()
    t_copy = _median(run_demotion, args.repeats, dev)
    bw.update(slot_bytes=tier.slot_bytes, slots=k, slot_copies_to_host_GBps=k * tier.slot_bytes / t_copy / 1e9)
    t_promote = _median(lambda: (tier.run([], [(0, 1)]), tier.synchronize()), args.repeats * 4, dev)
    # (b) the prefill a hit saves: an uncached prompt of the workload's mean length, one output token
    mean_len = round(statistics.fmean(len(work.prompt(i)) for i in range(len(work))))
    prompt = [int(t) for t in work.prompt(0)][:mean_len]
    prompt += [int(t) for t in work.prompt(1)][:mean_len - len(prompt)]

    def prefill():
        engine.generate([GenerationRequest(("prefill", time.perf_counter_ns()), prompt, 1, use_cache=False)])
    prefill()
    t_prefill = _median(prefill, args.repeats, dev)
    # (c) the step with a demotion queued on the copy stream just before it
    def both():
        tier.run(demote, [])
        prefill()
        tier.synchronize()
    t_both = _median(both, args.repeats, dev)
    engine.shutdown(drain=False, timeout=60)
    # a CPU's reference stream runs its copies when waited on: the overlap figures mean something on CUDA only
    return {"overlap_meaningful": dev.startswith("cuda"), "bandwidth": bw, "promotion_s": t_promote, "prefill_s": t_prefill, "prefill_tokens": len(prompt),
            "promotion_over_prefill": t_promote / t_prefill,
            "overlap": {"step_s": t_prefill, "demotion_s": t_copy, "both_s": t_both, "slots": k,
                        "step_slowdown": t_both / t_prefill,
                        "overlap_fraction": (t_prefill + t_copy - t_both) / min(t_prefill, t_copy)}}


def verdict(result: dict) -> dict:
    arms, out = result.get("arms", {}), {}
    full = {a: [b for b in r["blocks"] if "full dataset" in b["phase"]] for a, r in arms.items()}
    if full.get("nr16") and full.get("nr16+host"):
        mean = lambda a, key: statistics.fmean(b[key] for b in full[a])      # noqa: E731
        gpu, hosted = mean("nr16", "hit_rate"), mean("nr16+host", "hit_rate")
        # no GPU-only hit at all: any host hit meets the target (None keeps the JSON standard)
        out["hit_rate_ratio"] = hosted / gpu if gpu else None
        out["hit_rate_target_met"] = hosted >= TARGET_HIT_RATIO * gpu and hosted > 0
        out["ttft_target_met"] = mean("nr16+host", "ttft_ms_mean") < mean("nr16", "ttft_ms_mean")
    if "copies" in result:
        out["promotion_target_met"] = result["copies"]["promotion_over_prefill"] <= TARGET_PROMOTION_OVER_PREFILL
    return out


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    import torch

    from benchmarks.results_io import provenance, write_result
    from clients.protocol import Phase
    from clients.workload import WorkloadConfig, block_size, build_workload, phase_blocks
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("host_tier_serve: no CUDA device (--smoke runs the CPU path)")
    if not args.smoke and not os.path.isfile(os.path.join(args.model, "model.safetensors")):
        from benchmarks.shaped_model import write_shaped_model
        print(f"writing the Kimi-Linear-48B-shaped checkpoint to {args.model}", file=sys.stderr, flush=True)
        write_shaped_model(args.model, "kda", device=args.device)
    budget, slots = budgets(args)
    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    work = build_workload(WorkloadConfig(vocab=vocab,
                                         prompts=args.prompts, scale=args.scale))
    q512 = block_size(slots["nr512"]["slots"])
    phases = [Phase(["nr512"], q512, phase_blocks(args.prompts, q512, 1)),
              Phase(["full dataset"], args.prompts, [(0, args.prompts)])]
    # KV never decides a hit: every prompt of the full dataset at its longest, plus the running requests
    kv_blocks = (args.prompts + args.max_batch) * (-(-(work.cfg.max_prompt_tokens + 2) // 16))
    result = {}
    if os.path.isfile(args.out):
        with open(args.out) as f:
            old = json.load(f)
        # the arms of an earlier call with the same measurement (arms, parts and commit may differ)
        if all(old.get("config", {}).get(k) == v for k, v in vars(args).items() if k not in RESUMABLE):
            result = old
    run = provenance("benchmarks/host_tier_serve.py", argv, commit=args.commit)
    # a run split over calls: the top-level command is the last call's, so every call is listed with what it
    # measured (the arms it ran, the copies), and every arm names the command that measured it
    result.setdefault("calls", []).append({"command": run["command"], "commit": run["commit"],
                                           "device": run["device"], "arms": [], "parts": args.parts})
    result.update(run, torch=torch.__version__,
                  config=vars(args), budget_bytes=budget, slots=slots, kv_blocks=kv_blocks,
                  phases=[{"name": p.name, "q": p.q, "blocks": p.blocks} for p in phases],
                  targets={"hit_rate_ratio_min": TARGET_HIT_RATIO, "ttft": "nr16+host mean < nr16 mean",
                           "promotion_over_prefill_max": TARGET_PROMOTION_OVER_PREFILL})
    result.setdefault("arms", {})
    parts = args.parts.split(",")
    if "serve" in parts:
        for arm in args.arms.split(","):
            if arm in result["arms"]:
                print(f"{arm}: already in {args.out}", flush=True)
                continue
            result["arms"][arm] = serve_arm(args, arm, budget, phases, work, kv_blocks)
            result["arms"][arm]["command"] = run["command"]
            result["calls"][-1]["arms"].append(arm)
            result["verdict"] = verdict(result)
            write_result(args.out, result)
    if "copies" in parts:
        result["copies"] = copies(args, budget, work, kv_blocks)
        result["copies"]["command"] = run["command"]
        print(json.dumps(result["copies"]), flush=True)
    result["verdict"] = verdict(result)
    write_result(args.out, result)
    print(json.dumps(result["verdict"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
