"""Table 8 of the paper, like for like: the fixed-slot suffix-refresh cost through tritonserver (App. F.1).

Every arm has the same number of checkpoint slots (899: its budget is 900 of its own checkpoints, slot 0
reserved), so capacity plays no part; dasc-nr and dasc-wr at W_max in {16, 64, 128, 512, 1024} serve the same
multi-turn workload (200 conversations, 1,051 requests, clients/multiturn.py) in five request orders (seeds
paired across arms). Per W and seed: dTTFT = mean TTFT(wr) - mean TTFT(nr) and the cost per hit
dTTFT x 1051 / N_hit. Target (written before the measurement): at most a tenth of the paper's cost per hit
at every W_max (paper: 67.0 / 85.5 / 108.4 / 249.3 / 426.0 ms).

Resumable: a cell is (arm, seed); the manifest (DIR/manifest.json) fixes them all. A call runs, for each W
of --wmax, nr then wr on the seeds either lacks (at most --max-units seeds per W), both in the same call,
and writes each cell as it ends; the JSON holds the table of every W whose cells are all done.

    python -m benchmarks serve_wr_fixed_slots --model /tmp/kimi48 --cells-dir runs/wr_fixed [--wmax 16,64] \\
        [--max-units 2] [--commit SHA] [--out benchmarks/results/serve_wr_fixed_slots_h200.json]
    python -m benchmarks serve_wr_fixed_slots --smoke --cells-dir /tmp/wrfs   # CPU, the embedded tiny model
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SLOTS = 899
WMAXES = (16, 64, 128, 512, 1024)
SEEDS = (42, 123, 7, 1, 2)
TARGET_FRACTION = 0.1
GPU = dict(device="cuda", dtype="bfloat16", conversations=200, turns=1051, scale=1.0, concurrency=32,
           max_batch_size=64, max_num_tokens=8192, prefill_chunk=8192, torch_threads=None, seeds=SEEDS,
           wmax=WMAXES, out=os.path.join(HERE, "results", "serve_wr_fixed_slots_h200.json"))
SMOKE = dict(device="cpu", dtype="float32", conversations=4, turns=10, scale=0.02, concurrency=2, max_batch_size=4,
             max_num_tokens=None, prefill_chunk=2048, torch_threads=1, seeds=(42, 7), wmax=(16,),
             out="/tmp/serve_wr_fixed_slots_smoke.json")


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="/tmp/kimi48", help="checkpoint (the shaped one is written when missing)")
    ap.add_argument("--smoke", action="store_true", help="CPU, the embedded tiny model, a tiny workload")
    ap.add_argument("--cells-dir", required=True, help="cells directory (kept from call to call)")
    ap.add_argument("--wmax", default=None, help="comma list of W_max this call runs (default: all of the manifest)")
    ap.add_argument("--max-units", type=int, default=None, help="at most this many seeds per W in this call")
    ap.add_argument("--slots", type=int, default=SLOTS)
    ap.add_argument("--concurrency", type=int, default=None)
    ap.add_argument("--transport", choices=["http", "grpc"], default="http")
    ap.add_argument("--work", default="/tmp/serve_wr_fixed_slots", help="engines, server logs, kernel cache")
    ap.add_argument("--out", default=None, help="result JSON")
    ap.add_argument("--commit", default=None, help="commit to record (the device's .git may be stale)")
    return ap.parse_args(argv)


def manifest_of(args, mode: dict, cfg, caps: dict, flags: list[str]) -> dict:
    import hashlib
    with open(os.path.join(args.model, "config.json"), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()[:16]
    arms = [{"key": f"{p}{w}", "spec": f"{p}{w}", "wmax": w, "policy": p, "target": "triton", **caps[f"{p}{w}"]}
            for w in mode["wmax"] for p in ("nr", "wr")]
    return {"kind": "wr_fixed_slots", "slots": args.slots, "arms": arms, "seeds": list(mode["seeds"]),
            "units": [f"s{s}" for s in mode["seeds"]],
            "config": {"model": os.path.abspath(args.model), "model_config_sha256": sha, "device": mode["device"],
                       "dtype": mode["dtype"], "build_flags": flags, "concurrency": mode["concurrency"],
                       "transport": args.transport, "torch_threads": mode["torch_threads"],
                       "workload": {"conversations": cfg.conversations, "turns": cfg.turns, "scale": cfg.scale,
                                    "seed": cfg.seed, "opening": cfg.scaled(cfg.opening_tokens),
                                    "reply": cfg.scaled(cfg.reply_tokens), "user": cfg.scaled(cfg.user_tokens)}}}


def table(manifest: dict, cells: list[dict]) -> dict:
    """Per W_max whose cells are all done: Table 8's row from the nr and wr cells of the same call per seed."""
    from clients.multiturn import PAPER_COST_PER_HIT_MS, table8_row
    rows = {}
    for w in sorted({a["wmax"] for a in manifest["arms"]}):
        pairs_nr, pairs_wr = [], []
        for s in manifest["seeds"]:
            nr = {c["call"]: c for c in cells if c["arm"] == f"nr{w}" and c["unit"] == f"s{s}"}
            wr = {c["call"]: c for c in cells if c["arm"] == f"wr{w}" and c["unit"] == f"s{s}"}
            common = sorted(set(nr) & set(wr))
            if common:
                pairs_nr.append(nr[common[0]]["cell"])
                pairs_wr.append(wr[common[0]]["cell"])
        if len(pairs_nr) < len(manifest["seeds"]):
            continue
        row = table8_row(pairs_nr, pairs_wr)
        paper = PAPER_COST_PER_HIT_MS.get(w)
        row["paper_cost_per_hit_ms"] = paper
        row["target_ms"] = paper * TARGET_FRACTION if paper else None
        row["target_met"] = bool(paper) and row["cost_per_hit_ms"]["mean"] <= paper * TARGET_FRACTION
        rows[str(w)] = row
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    from clients import arms as armlib
    from clients.cells import CellStore, new_call_id
    from clients.multiturn import MultiTurnConfig, run_cell
    from clients.report import provenance, write_json
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.errors import UserError
    mode = dict(SMOKE if args.smoke else GPU)
    if args.concurrency:
        mode["concurrency"] = args.concurrency
    if args.smoke:
        args.model = os.path.join(ROOT, "trtllm_dasc", "assets", "tiny-kimi-linear")
    elif not os.path.isfile(os.path.join(args.model, "model.safetensors")):
        import torch
        from benchmarks.shaped_model import write_shaped_model
        write_shaped_model(args.model, "kda", device="cuda" if torch.cuda.is_available() else "cpu")
    out = args.out or mode["out"]
    try:
        vocab = HybridConfig.from_path(args.model).schema.network.vocab_size
        cfg = MultiTurnConfig(vocab=vocab, conversations=mode["conversations"], turns=mode["turns"],
                              scale=mode["scale"])
        per_request = cfg.max_prompt_tokens() + 1
        blocks = math.ceil(per_request / 16)
        # KV for every conversation's longest prompt: KV never decides a hit; a checkpoint at each prompt end
        flags = ["--tp", "1", "--device", mode["device"], "--dtype", mode["dtype"], "--max-batch-size",
                 mode["max_batch_size"], "--prefill-chunk", mode["prefill_chunk"], "--interval", per_request,
                 "--kv-blocks", (cfg.conversations + mode["max_batch_size"]) * blocks, "--block-size", 16,
                 "--max-context", blocks * 16, "--prompt-only",
                 *(["--max-num-tokens", mode["max_num_tokens"]] if mode["max_num_tokens"] else [])]
        flags = [str(f) for f in flags]
        caps = {}
        for w in mode["wmax"]:
            for p in ("nr", "wr"):
                arm = armlib.parse_arms(f"{p}{w}")[0]
                one = armlib.capacity(args.model, arm, 10 ** 15, mode["dtype"])["checkpoint_bytes"]
                # 899 slots for every arm: its budget is 900 of its own checkpoints (slot 0 reserved, Eq. 8)
                caps[arm.spec] = {"checkpoint_bytes": one, "budget_bytes": (args.slots + 1) * one, "slots": args.slots}
        manifest = manifest_of(args, mode, cfg, caps, flags)
        store = CellStore(args.cells_dir, manifest)
        wanted = [int(w) for w in args.wmax.split(",")] if args.wmax else list(mode["wmax"])
        if any(w not in mode["wmax"] for w in wanted):
            raise UserError(f"--wmax {args.wmax}: the manifest has W_max {list(mode['wmax'])}")
        prov = provenance(["-m", "benchmarks", "serve_wr_fixed_slots", *argv], args.commit)
        call = new_call_id()
        store.begin_call(call, {"command": prov["command"], "commit": prov["commit"], "started": time.time()})
    except UserError as e:
        print(f"serve_wr_fixed_slots: error: {e}", file=sys.stderr)
        return 2
    try:
        for w in wanted:
            seeds = [s for s in mode["seeds"] if not (store.done(f"nr{w}", f"s{s}") and store.done(f"wr{w}", f"s{s}"))]
            seeds = seeds[:args.max_units] if args.max_units else seeds
            for p in ("nr", "wr") if seeds else ():
                spec = f"{p}{w}"
                engine = armlib.build_engine(args.model, armlib.parse_arms(spec)[0],
                                             os.path.join(args.work, "engines", spec), caps[spec]["budget_bytes"], flags)
                armlib.share_kernels(engine, os.path.join(args.work, "kernels"))
                server = armlib.serve(engine, os.path.join(args.work, "servers", spec), 1800.0, mode["torch_threads"])
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
                    for s in seeds:
                        cell = run_cell(target, cfg, s)
                        store.write(spec, f"s{s}", call, prov["commit"], {"cell": cell})
                        print(f"[wr-fixed] {spec} seed {s}: mean TTFT {sum(cell['ttft_ms']) / cell['requests']:.1f} ms",
                              file=sys.stderr, flush=True)
                    target.close()
                finally:
                    server.stop()
    finally:
        cells = store.cells()
        rows = table(store.manifest, cells)
        result = {**prov, "benchmark": "benchmarks/serve_wr_fixed_slots.py", "manifest_id": store.manifest["id"],
                  "cells_dir": store.root, "slots": args.slots, **store.manifest["config"],
                  "calls": store.calls(), "cells_done": len(cells),
                  "cells_total": len(store.manifest["arms"]) * len(store.manifest["units"]),
                  "target": f"cost per hit <= {TARGET_FRACTION} x the paper's at every W_max", "table8": rows}
        write_json(out, result)
        for w, r in rows.items():
            print(f"W={w:>5}: hit nr {r['hit_rate_nr']['mean']:.3f} wr {r['hit_rate_wr']['mean']:.3f}  dTTFT "
                  f"{r['delta_ttft_ms']['mean']:.1f}±{r['delta_ttft_ms']['std']:.1f} ms  cost/hit "
                  f"{r['cost_per_hit_ms']['mean']:.2f}±{r['cost_per_hit_ms']['std']:.2f} ms (paper "
                  f"{r['paper_cost_per_hit_ms']}, target {r['target_ms']:.1f}: {'met' if r['target_met'] else 'MISSED'})")
        print(f"json: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
