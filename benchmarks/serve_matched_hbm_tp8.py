"""Matched-HBM serving at TP8 (the paper's configuration): placements off / storage / hybrid, W in {16, 64, 128,
512}, dasc-nr and dasc-wr, plus dense, for a Kimi-Linear-shaped and a Qwen3-Next-shaped model.

Every arm is built by dasc-build, served by its own tritonserver over mpirun (rank 0 + seven worker ranks) and
driven by `clients.matched_hbm` (the paper's App. C.2 protocol); per arm the JSON has the most loaded rank's
checkpoint bytes and the slot count (checked against what `dasc plan` prints: the run stops on a mismatch),
mean TTFT, input throughput, hit rate and the storage balance's all-to-all time per checkpoint store and load
(rank 0's clock). Phases come from the dense and hybrid nr arms' capacity boundaries (--phase-arms): with all
25 arms' boundaries every arm would replay a dozen phases.

    python -m benchmarks serve_matched_hbm_tp8 --arch kda [--model /tmp/kimi48]      # 8 GPUs (nvidia-h200-x8)
    python -m benchmarks serve_matched_hbm_tp8 --arch gdn --cpu                        # eight CPU ranks
--cpu runs the same protocol on CPU ranks (gloo) with a reduced model (benchmarks/shaped_model.py --layers 4
--hidden 256: the released linear-attention and attention heads, so each rank holds the real per-layer state
and the planner balances the real units) at a tiny scale. Any further flag goes to `clients.matched_hbm`
(e.g. --arms dense,nr16:storage to run a subset). Writes benchmarks/results/serve_matched_hbm_tp8_<kind>_<arch>.json
and .png, rewritten after every arm (a run cut by a time limit keeps what finished).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

PLACEMENTS = ("off", "storage", "hybrid")
WMAXES = (16, 64, 128, 512)
# dense first, then per W the nr arms of every placement before the wr arms (a cut run keeps the comparisons
# the paper leads with)
ARMS = ",".join(["dense"] + [f"{p}{w}:{pl}" for w in WMAXES for p in ("nr", "wr") for pl in PLACEMENTS])
PHASE_ARMS = ",".join(["dense"] + [f"nr{w}:hybrid" for w in WMAXES])
GPU = ["--dense-slots", "16", "--scale", "1.0", "--blocks-per-phase", "1", "--seeds", "42,123,7",
       "--concurrency", "96", "--max-batch-size", "64", "--max-num-tokens", "8192", "--device", "cuda",
       "--dtype", "bfloat16", "--prompt-only"]
CPU = ["--dense-slots", "3", "--scale", "0.03", "--blocks-per-phase", "1", "--seeds", "42",
       "--concurrency", "4", "--max-batch-size", "4", "--device", "cpu", "--dtype", "float32",
       "--torch-threads", "1"]
REDUCED = dict(layers=4, hidden=256, intermediate=512, vocab=4096)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", required=True, choices=["kda", "gdn"], help="kda: Kimi-Linear-shaped, gdn: Qwen3-Next")
    ap.add_argument("--cpu", action="store_true", help="eight CPU ranks, the reduced model, a tiny scale")
    ap.add_argument("--model", default=None, help="checkpoint (written here when missing; default "
                    "/tmp/{kimi48,qwen80} on GPUs, /tmp/reduced_{kda,gdn} with --cpu)")
    ap.add_argument("--out", default=None, help="result JSON (default benchmarks/results/"
                    "serve_matched_hbm_tp8_{h200x8,cpu}_<arch>.json); the plot goes beside it")
    ap.add_argument("--work", default=None, help="engines, server logs, kernel cache (default /tmp/tp8_<arch>)")
    ap.add_argument("--commit", default=None, help="commit to record (the device's .git may be stale)")
    args, rest = ap.parse_known_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))      # leave through finally: servers stopped

    import torch
    if not args.cpu and torch.cuda.device_count() < 8:
        print(f"serve_matched_hbm_tp8: {torch.cuda.device_count()} GPU(s) here, TP8 needs 8 (use --cpu for CPU "
              "ranks)", file=sys.stderr)
        return 1
    kind = "cpu" if args.cpu else "h200x8"
    default_model = f"/tmp/reduced_{args.arch}" if args.cpu else {"kda": "/tmp/kimi48", "gdn": "/tmp/qwen80"}[args.arch]
    model = args.model or default_model
    out = args.out or os.path.join(HERE, "results", f"serve_matched_hbm_tp8_{kind}_{args.arch}.json")
    if not os.path.isfile(os.path.join(model, "model.safetensors")):
        from benchmarks.shaped_model import write_shaped_model
        print(f"writing the {'reduced ' if args.cpu else ''}{args.arch}-shaped checkpoint to {model}", file=sys.stderr,
              flush=True)
        if args.cpu:
            write_shaped_model(model, args.arch, REDUCED["vocab"], "cpu", REDUCED["layers"], REDUCED["hidden"],
                               REDUCED["intermediate"])
        else:
            write_shaped_model(model, args.arch, device="cuda")
    from clients import matched_hbm
    # --keep-going: one arm's failure is recorded (failed_arms) and the grid goes on
    flags = ["--model", model, "--out", args.work or f"/tmp/tp8_{args.arch}", "--tp", "8", "--arms", ARMS,
             "--phase-arms", PHASE_ARMS, "--json", out, "--keep-going", *(CPU if args.cpu else GPU), *rest,
             *(["--commit", args.commit] if args.commit else [])]
    extra = {"benchmark": "benchmarks/serve_matched_hbm_tp8.py", "torch": torch.__version__, "kind": kind,
             "arch": args.arch, "reduced_model": REDUCED if args.cpu else None,
             "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() and not args.cpu else None}
    name = {"kda": "Kimi-Linear", "gdn": "Qwen3-Next"}[args.arch]
    return matched_hbm.drive("serve_matched_hbm_tp8", flags, argv, extra,
                             lambda result: f"matched-HBM serving at TP8, {name}-shaped"
                                            f"{' (reduced, CPU ranks)' if args.cpu else ''}, budget "
                                            f"{result['budget_bytes']:,} B per rank")

if __name__ == "__main__":
    sys.exit(main())
