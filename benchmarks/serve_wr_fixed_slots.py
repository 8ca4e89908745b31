"""Table 8 of the paper, like for like: the fixed-slot suffix-refresh cost through tritonserver (App. F.1).

Every arm has the same number of checkpoint slots (899: its budget is 900 of its own checkpoints, slot 0
reserved), so capacity plays no part; dasc-nr and dasc-wr at W_max in {16, 64, 128, 512, 1024} serve the same
multi-turn workload (200 conversations, 1,051 requests, clients/multiturn.py; --opening-shape: lognormal openings
fitted to Table 8's replay tokens per hit, or uniform, the first shape) in five request orders (seeds
paired across arms). Per W and seed: dTTFT = mean TTFT(wr) - mean TTFT(nr) and the cost per hit
dTTFT x 1051 / N_hit. Target (written before the measurement): at most a tenth of the paper's cost per hit
at every W_max (paper: 67.0 / 85.5 / 108.4 / 249.3 / 426.0 ms).

Resumable: a cell is (arm, seed); the manifest (DIR/manifest.json) fixes them all. A call runs, for each W
of --wmax, nr then wr on the seeds that lack a pair (nr and wr of one call; at most --max-units seeds per W),
and writes each cell as it ends; the JSON holds the table of every W whose seeds all have a pair, each pair
from one call (a pair never joins cells of two calls). --call-deadline-s stops between units: nothing starts
that the estimate (clients/fixed_slots.py) says cannot end in time, and the call says what is left.

    python -m benchmarks serve_wr_fixed_slots --model tests/data/kimi-linear-48b-a3b.config.json \\
        --load-format dummy --seed 0 --memory-limit-bytes device --cells-dir DIR --call-deadline-s 520 \\
        [--wmax 16,64] [--max-units 2] [--opening-shape uniform] [--kernel-cache DIR] [--commit SHA] [--out RESULT.json]
    python -m benchmarks serve_wr_fixed_slots --cells-dir DIR ...the same flags... --plan-only   # what is left
    python -m benchmarks serve_wr_fixed_slots --merge DIR [DIR ...] --out RESULT.json     # cells of one measurement
    python -m benchmarks serve_wr_fixed_slots --smoke --cells-dir /tmp/wrfs   # CPU, the embedded tiny model
--model: a checkpoint (default /tmp/kimi48, the shaped dense-MLP one, written when missing), or with
--load-format dummy a released config.json (Kimi-Linear-48B-A3B at its full size, random weights made at load
time; scripts/gpu/wr_fixed_slots.sh is one device call of it). The released model on one H200 leaves about
13 GB beside its weights: the GPU mode's batch is 32 (the closed loop's clients, no more requests ever run)
so that W=16's 899-slot pool (15.1 GB) and the live conversations' KV fit.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time

from clients.kv_sizing import add_memory_arguments, check_memory_arguments
from clients.matched_hbm import add_weight_arguments
from clients.runner import GPU_READY_ESTIMATE_S, GPU_REQUEST_ESTIMATE_S, add_estimate_arguments

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SLOTS = 899
WMAXES = (16, 64, 128, 512, 1024)
SEEDS = (42, 123, 7, 1, 2)
TARGET_FRACTION = 0.1
# estimates before anything is measured (clients/fixed_slots.py): seconds per request of a cell (the full-size
# model did 0.04-0.06 s a request in the matched-HBM cells' longer, colder prompts), a server start with a warm
# kernel cache (31-38 s measured; cold 224-272 s: the device script passes its own), a dasc-build (~1 s)
GPU = dict(device="cuda", dtype="bfloat16", conversations=200, turns=1051, scale=1.0, concurrency=32,
           max_batch_size=32, max_num_tokens=8192, prefill_chunk=8192, torch_threads=None, seeds=SEEDS,
           wmax=WMAXES, out=os.path.join(HERE, "results", "serve_wr_fixed_slots_h200.json"),
           request_s=GPU_REQUEST_ESTIMATE_S, ready_s=GPU_READY_ESTIMATE_S, build_s=15.0)
SMOKE = dict(device="cpu", dtype="float32", conversations=4, turns=10, scale=0.02, concurrency=2, max_batch_size=4,
             max_num_tokens=None, prefill_chunk=2048, torch_threads=1, seeds=(42, 7), wmax=(16,),
             out="/tmp/serve_wr_fixed_slots_smoke.json", request_s=0.5, ready_s=30.0, build_s=10.0)


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint (default /tmp/kimi48: the shaped one, written when "
                    "missing; --smoke: the embedded tiny model), or with --load-format dummy a config.json")
    ap.add_argument("--smoke", action="store_true", help="CPU, the embedded tiny model, a tiny workload")
    ap.add_argument("--cells-dir", default=None, help="cells directory (kept from call to call; required but "
                    "with --merge)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="DIR", help="no run: the result of these cells "
                    "directories of one measurement (refused for mixed manifests or commits)")
    ap.add_argument("--wmax", default=None, help="comma list of W_max this call runs (default: all of the manifest)")
    ap.add_argument("--max-units", type=int, default=None, help="at most this many seeds per W in this call")
    ap.add_argument("--slots", type=int, default=SLOTS)
    ap.add_argument("--concurrency", type=int, default=None)
    ap.add_argument("--max-batch-size", type=int, default=None, help="the engine's batch (GPU 32, smoke 4)")
    ap.add_argument("--transport", choices=["http", "grpc"], default="http")
    # clients.multiturn.OPENING_SHAPES (not imported here: --help stays light)
    ap.add_argument("--opening-shape", choices=("lognormal", "uniform"), default="lognormal",
                    help="the conversations' openings: lognormal (default; fitted to Table 8's replay tokens per "
                    "hit, clients/multiturn.py) or uniform (the first shape, 1,500-2,500 tokens; its cells "
                    "directories resume with it)")
    add_weight_arguments(ap)
    add_memory_arguments(ap)
    ap.add_argument("--call-deadline-s", type=float, default=None, help="wall-clock seconds this call may take (from "
                    "its start): nothing starts that cannot end before it")
    add_estimate_arguments(ap)
    ap.add_argument("--kernel-cache", default=None, help="compiled-kernel cache shared by the arms "
                    "(default WORK/kernels)")
    ap.add_argument("--plan-only", action="store_true", help="print the manifest's cells, what is done and the KV "
                    "plan, then exit: nothing is built or started")
    ap.add_argument("--work", default="/tmp/serve_wr_fixed_slots", help="engines, server logs, kernel cache")
    ap.add_argument("--out", default=None, help="result JSON")
    ap.add_argument("--commit", default=None, help="commit to record (the device's .git may be stale)")
    args = ap.parse_args(argv)
    if args.merge is None and args.cells_dir is None:
        ap.error("--cells-dir is required (or --merge DIR ...)")
    return args


def manifest_of(args, mode: dict, cfg, caps: dict, flags: list[str], kv: dict | None) -> dict:
    import hashlib
    from clients.fixed_slots import model_path_record
    from clients.matched_hbm import weights_record
    with open(args.model_config, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()[:16]
    arms = [{"key": f"{p}{w}", "spec": f"{p}{w}", "wmax": w, "policy": p, "target": "triton", **caps[f"{p}{w}"]}
            for w in mode["wmax"] for p in ("nr", "wr")]
    return {"kind": "wr_fixed_slots", "slots": args.slots, "arms": arms, "seeds": list(mode["seeds"]),
            "units": [f"s{s}" for s in mode["seeds"]],
            "config": {"model": model_path_record(args.model, ROOT), "model_config_sha256": sha,
                       "device": mode["device"], "dtype": mode["dtype"], "build_flags": flags,
                       "concurrency": mode["concurrency"], "transport": args.transport,
                       "torch_threads": mode["torch_threads"], **weights_record(args),
                       **({"kv_cache": kv} if kv and kv.get("fit") is not None else {}),
                       # the workload's shape and parameters are part of the manifest's identity: cells of the
                       # first (uniform) shape keep their id and never mix with the lognormal shape's
                       "workload": cfg.record()}}


def table(manifest: dict, cells: list[dict]) -> dict:
    """Per W_max whose seeds all have a pair: Table 8's row from the nr and wr cells of one call per seed."""
    from clients.fixed_slots import paired_call
    from clients.multiturn import PAPER_COST_PER_HIT_MS, table8_row
    rows = {}
    for w in sorted({a["wmax"] for a in manifest["arms"]}):
        pairs_nr, pairs_wr = [], []
        for s in manifest["seeds"]:
            call = paired_call(cells, w, s)
            if call is None:
                break
            pick = {c["arm"]: c["cell"] for c in cells if c["call"] == call and c["unit"] == f"s{s}"}
            pairs_nr.append(pick[f"nr{w}"])
            pairs_wr.append(pick[f"wr{w}"])
        if len(pairs_nr) < len(manifest["seeds"]):
            continue
        row = table8_row(pairs_nr, pairs_wr)
        paper = PAPER_COST_PER_HIT_MS.get(w)
        row["paper_cost_per_hit_ms"] = paper
        row["target_ms"] = paper * TARGET_FRACTION if paper else None
        row["target_met"] = bool(paper) and row["cost_per_hit_ms"]["mean"] <= paper * TARGET_FRACTION
        rows[str(w)] = row
    return rows


def pending(manifest: dict, cells: list[dict]) -> dict:
    """W_max -> the seeds without a pair of one call (what is left to measure)."""
    from clients.fixed_slots import paired_call
    out = {}
    for w in sorted({a["wmax"] for a in manifest["arms"]}):
        left = [f"s{s}" for s in manifest["seeds"] if paired_call(cells, w, s) is None]
        if left:
            out[str(w)] = left
    return out


def result_of(manifest: dict, calls: list[dict], cells: list[dict], prov: dict, cells_dir) -> dict:
    """The result JSON from a measurement's cells (a call, a resumed call and --merge all write this)."""
    left = pending(manifest, cells)
    return {**prov, "benchmark": "benchmarks/serve_wr_fixed_slots.py", "manifest_id": manifest["id"],
            "cells_dir": cells_dir, "slots": manifest["slots"], **manifest["config"], "calls": calls,
            "cells_done": len({(c["arm"], c["unit"]) for c in cells}),
            "cells_total": len(manifest["arms"]) * len(manifest["units"]),
            "pairs_left": sum(len(v) for v in left.values()), "pending": left,
            "target": f"cost per hit <= {TARGET_FRACTION} x the paper's at every W_max",
            "table8": table(manifest, cells)}


def print_rows(rows: dict, out: str) -> None:
    for w, r in rows.items():
        print(f"W={w:>5}: hit nr {r['hit_rate_nr']['mean']:.3f} wr {r['hit_rate_wr']['mean']:.3f}  dTTFT "
              f"{r['delta_ttft_ms']['mean']:.1f}±{r['delta_ttft_ms']['std']:.1f} ms  cost/hit "
              f"{r['cost_per_hit_ms']['mean']:.2f}±{r['cost_per_hit_ms']['std']:.2f} ms (paper "
              f"{r['paper_cost_per_hit_ms']}, target {r['target_ms']:.1f}: {'met' if r['target_met'] else 'MISSED'})")
    print(f"json: {out}")


def merge(args, argv) -> int:
    from clients.cells import load_dirs
    from clients.report import provenance, write_json
    manifest, calls, cells = load_dirs(args.merge)
    commit = (calls or cells)[0].get("commit") if (calls or cells) else None
    prov = provenance(["-m", "benchmarks", "serve_wr_fixed_slots", *argv], commit)
    out = args.out or "serve_wr_fixed_slots_merged.json"
    result = result_of(manifest, calls, cells, prov, [os.path.abspath(d) for d in args.merge])
    write_json(out, result)
    print_rows(result["table8"], out)
    print(f"pairs left: {result['pairs_left']}"
          + "".join(f"; W={w} {','.join(v)}" for w, v in result["pending"].items()))
    return 0


def setup(args, mode: dict):
    """Everything checked and fixed before a server starts: (workload, caps, build flags, manifest)."""
    from clients import arms as armlib
    from clients import fixed_slots
    from clients.matched_hbm import check_weights, model_config
    from clients.multiturn import MultiTurnConfig
    from trtllm_dasc.engine.config import replay_tokens
    from trtllm_dasc.errors import UserError
    check_weights(args)
    model_cfg = model_config(args)
    cfg = MultiTurnConfig(vocab=model_cfg.schema.network.vocab_size, conversations=mode["conversations"],
                          turns=mode["turns"], scale=mode["scale"], opening_shape=args.opening_shape)
    mb = mode["max_batch_size"]
    for name, v in (("--slots", args.slots), ("--max-batch-size", mb), ("--concurrency", mode["concurrency"]),
                    ("--max-units", args.max_units or 1)):
        if v < 1:
            raise UserError(f"{name} must be >= 1, got {v}")
    if args.call_deadline_s is not None and not args.call_deadline_s > 0:
        raise UserError(f"--call-deadline-s must be > 0, got {args.call_deadline_s}")
    check_memory_arguments(args)
    limit = args.memory_limit_bytes
    per_request = cfg.max_prompt_tokens() + 1
    blocks = math.ceil(per_request / 16)
    caps, window = {}, 0
    for w in mode["wmax"]:
        for p in ("nr", "wr"):
            arm = armlib.parse_arms(f"{p}{w}")[0]
            planned = armlib.capacity(args.model, arm, 10 ** 15, mode["dtype"], dummy_seed=args.weights_seed)
            one = planned["checkpoint_bytes"]
            window = max(window, replay_tokens(arm.policy, planned["wr_window"], blocks * 16))
            # 899 slots for every arm: its budget is 900 of its own checkpoints (slot 0 reserved, Eq. 8)
            caps[arm.spec] = {"checkpoint_bytes": one, "budget_bytes": (args.slots + 1) * one, "slots": args.slots}
    import torch
    # the engine's largest step: in its own memory check, so in the count the KV cache is sized beside
    # (the flags below: prompt-end checkpoints, no capture cap; the wr arms' replay spans)
    from trtllm_dasc.model.workspace import step_shape, workspace_of
    step = step_shape(max_num_tokens=mode["max_num_tokens"], max_batch=mb, prefill_chunk=mode["prefill_chunk"],
                      max_context=blocks * 16, interval=per_request, prompt_only=True, replay_window=window)
    workspace = workspace_of(model_cfg.schema, step, getattr(torch, mode["dtype"]).itemsize)
    # KV for the conversations (every one's longest prompt when it fits; else the live ones'): KV never decides
    # a hit; a checkpoint at each prompt end. One block count for every arm, sized beside the largest pool
    kv = fixed_slots.size_kv(args, model_cfg, list(caps), max(c["budget_bytes"] for c in caps.values()),
                             limit=limit, device=mode["device"], headroom_gib=args.memory_headroom_gib,
                             dtype=mode["dtype"],
                             max_batch=mb, block_size=16, blocks_per_prompt=blocks, conversations=cfg.conversations,
                             concurrency=mode["concurrency"], step=step, workspace=workspace)
    flags = ["--tp", "1", "--device", mode["device"], "--dtype", mode["dtype"], "--max-batch-size", mb,
             "--prefill-chunk", mode["prefill_chunk"], "--interval", per_request, "--kv-blocks", kv["blocks"],
             "--block-size", 16, "--max-context", blocks * 16, "--prompt-only",
             *(["--max-num-tokens", mode["max_num_tokens"]] if mode["max_num_tokens"] else []),
             *(["--load-format", "dummy", "--seed", args.weights_seed] if args.dummy else []),
             *(["--memory-limit-bytes", kv["limit_bytes"]] if kv.get("fit") is not None else [])]
    flags = [str(f) for f in flags]
    return cfg, caps, flags, manifest_of(args, mode, cfg, caps, flags, kv)


def serve_arm(args, mode, store, cfg, spec: str, engine: str, seeds: list[int], call: str, commit, log: list[dict],
              budget=None) -> list[int]:
    """One arm's server through the seeds the call's deadline (``budget``, None: none) lets start; each cell
    written as it ends, the server's start and each cell told to the budget."""
    from clients import arms as armlib
    from clients.multiturn import run_cell
    t0 = time.monotonic()
    server = armlib.serve(engine, os.path.join(args.work, "servers", spec), 1800.0, mode["torch_threads"])
    entry = {"spec": spec, "ready_s": time.monotonic() - t0, "server_log": server.log_path, "seeds": []}
    log.append(entry)
    if budget is not None:
        budget.record_start(entry["ready_s"])
    w = int(spec[2:])
    try:
        if args.transport == "http":
            from clients.http_client import HttpTarget
            target = HttpTarget(server.http_url, mode["concurrency"])
        else:
            from clients.client import GrpcTarget
            target = GrpcTarget(server.grpc_url, mode["concurrency"])
        slots = target.control("stats")["checkpoint_slots"]
        if slots != args.slots:
            raise RuntimeError(f"arm {spec}: the engine has {slots} slots, not {args.slots}")
        for i, s in enumerate(seeds):
            # only nr is gated: wr then runs every seed nr ran (the deadline counted them in)
            if budget is not None and spec.startswith("nr") and not budget.fits_seed(w, s, i):
                break
            c0 = time.monotonic()
            cell = run_cell(target, cfg, s)
            wall = time.monotonic() - c0
            store.write(spec, f"s{s}", call, commit, {"wall_s": wall, "cell": cell})
            entry["seeds"].append(s)
            if budget is not None:
                budget.record_cell(spec, wall)
            print(f"[wr-fixed] {spec} seed {s}: mean TTFT {sum(cell['ttft_ms']) / cell['requests']:.1f} ms, "
                  f"{wall:.1f} s", file=sys.stderr, flush=True)
        target.close()
    finally:
        server.stop()
    return entry["seeds"]


def run_call(args, mode, store, cfg, caps, wanted, call, commit, t0) -> dict:
    """The call's units, W by W: both engines built, nr through the seeds the deadline lets start, then wr
    through exactly those (the pairs of one call). Returns what the call record adds."""
    from clients import arms as armlib
    from clients import fixed_slots
    kernels = args.kernel_cache or os.path.join(args.work, "kernels")
    budget = None
    if args.call_deadline_s is not None:
        rates = {}
        for c in store.cells():
            r = fixed_slots.cell_rate(c)
            if r:
                rates.setdefault(c["arm"], []).append(r)
        budget = fixed_slots.UnitDeadline(t0 + args.call_deadline_s, cfg.turns, rates,
                                          args.request_estimate_s or mode["request_s"],
                                          args.ready_estimate_s or mode["ready_s"], mode["build_s"])
    servers = []
    for w in wanted:
        cells = store.cells()
        seeds = [s for s in mode["seeds"] if fixed_slots.paired_call(cells, w, s) is None]
        seeds = seeds[:args.max_units] if args.max_units else seeds
        if not seeds:
            continue
        if budget is not None and not budget.fits_w(w, seeds[0]):
            break
        engines = {}
        for p in ("nr", "wr"):
            spec = f"{p}{w}"
            b0 = time.monotonic()
            engines[spec] = armlib.build_engine(args.model, armlib.parse_arms(spec)[0],
                                                os.path.join(args.work, "engines", spec), caps[spec]["budget_bytes"],
                                                store.manifest["config"]["build_flags"])
            armlib.share_kernels(engines[spec], kernels)
            if budget is not None:
                budget.record_build(time.monotonic() - b0)
        ran = serve_arm(args, mode, store, cfg, f"nr{w}", engines[f"nr{w}"], seeds, call, commit, servers, budget)
        store.update_call(call, servers=servers)
        if ran:
            # wr runs the seeds nr ran in this call, every one of them: the deadline counted them in
            serve_arm(args, mode, store, cfg, f"wr{w}", engines[f"wr{w}"], ran, call, commit, servers, budget)
            store.update_call(call, servers=servers)
        if len(ran) < len(seeds):
            break
    extra = {"servers": servers}
    if budget is not None:
        left = pending(store.manifest, store.cells())
        stop = budget.stopped
        print(f"[wr-fixed] deadline {args.call_deadline_s:.0f} s: " + (f"stopped before {stop[0]} {stop[1]} "
              f"({budget.left():.0f} s left, not enough for it and the cells it owes); " if stop else "")
              + f"{sum(map(len, left.values()))} pair(s) left: "
              + ("; ".join(f"W={w} {','.join(v)}" for w, v in left.items()) or "none"), file=sys.stderr, flush=True)
        extra.update(deadline_s=args.call_deadline_s, stopped_before=list(stop) if stop else None,
                     pairs_left=sum(map(len, left.values())))
    store.update_call(call, **extra)
    return extra


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    t0 = time.monotonic()
    args = parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    from clients.cells import CellStore, new_call_id
    from clients.report import provenance, write_json
    from trtllm_dasc.errors import UserError
    from trtllm_dasc.provenance import check_results_commit
    try:
        if args.merge:
            return merge(args, argv)
        mode = dict(SMOKE if args.smoke else GPU)
        for key in ("concurrency", "max_batch_size"):
            if getattr(args, key):
                mode[key] = getattr(args, key)
        if args.model is None:
            args.model = (os.path.join(ROOT, "trtllm_dasc", "assets", "tiny-kimi-linear") if args.smoke
                          else "/tmp/kimi48")
        if not (args.smoke or args.plan_only or args.load_format == "dummy" or os.path.isfile(args.model)
                or os.path.isfile(os.path.join(args.model, "model.safetensors"))):
            import torch
            from benchmarks.shaped_model import write_shaped_model
            write_shaped_model(args.model, "kda", device="cuda" if torch.cuda.is_available() else "cpu")
        out = args.out or mode["out"]
        cfg, caps, flags, manifest = setup(args, mode)
        wanted = [int(w) for w in args.wmax.split(",")] if args.wmax else list(mode["wmax"])
        if any(w not in mode["wmax"] for w in wanted):
            raise UserError(f"--wmax {args.wmax}: the manifest has W_max {list(mode['wmax'])}")
        if args.plan_only:
            return plan_only(args, manifest)
        store = CellStore(args.cells_dir, manifest)
        prov = provenance(["-m", "benchmarks", "serve_wr_fixed_slots", *argv], args.commit)
        # refused before any cell runs: benchmarks/results/ keeps results of a clean commit
        check_results_commit(out, prov["commit"])
        call = new_call_id()
        store.begin_call(call, {"command": prov["command"], "commit": prov["commit"], "started": time.time(),
                                "max_units": args.max_units})
    except UserError as e:
        print(f"serve_wr_fixed_slots: error: {e}", file=sys.stderr)
        return 2
    try:
        run_call(args, mode, store, cfg, caps, wanted, call, prov["commit"], t0)
    finally:
        result = result_of(store.manifest, store.calls(), store.cells(), prov, store.root)
        write_json(out, result)
        print_rows(result["table8"], out)
    return 0


def plan_only(args, manifest: dict) -> int:
    """What --plan-only prints: the manifest's id, the arms' slots and bytes, the KV plan, the pairs left (of the
    cells directory's own manifest, and whether this command's equals it)."""
    import json
    from clients.cells import MANIFEST, load_dirs, manifest_id
    stored, cells = manifest, []
    if os.path.exists(os.path.join(args.cells_dir, MANIFEST)):
        stored, _, cells = load_dirs([args.cells_dir])
    left = pending(stored, cells)
    print(json.dumps({"manifest_id": manifest_id(manifest), "cells_dir_manifest_id": stored.get("id"),
                      "slots": manifest["slots"],
                      "checkpoint_bytes": {a["key"]: a["checkpoint_bytes"] for a in manifest["arms"]},
                      "kv_cache": manifest["config"].get("kv_cache"),
                      "build_flags": " ".join(manifest["config"]["build_flags"]),
                      "pairs_total": len(stored["units"]) * len(stored["arms"]) // 2,
                      "pairs_left": sum(map(len, left.values())),
                      "pending": {w: ",".join(v) for w, v in left.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
