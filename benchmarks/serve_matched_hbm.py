"""Matched-HBM serving on the H200 (paper App. C.2) through tritonserver, Kimi-Linear-48B-shaped checkpoint.

Arms at one checkpoint budget (16 dense checkpoints of the shaped model at TP1, 43.4 MB each): dense,
dasc-nr W=16, dasc-nr W=16 + INT8, dasc-nr W=64, dasc-wr W=16 (most telling first: a run cut short by the
time limit keeps them; the JSON is rewritten after every arm). Each arm is built with dasc-build, served by
its own tritonserver and driven by `clients.matched_hbm`: the synthetic MMLU-Pro-shaped workload at the
paper's lengths, one block per capacity-boundary phase, seeds 42/123/7, concurrency 96 (the paper's), one
output token, chunked prefill 8192. Then dasc-nr W=16 once more in this process straight through Engine:
what Triton adds (`triton_over_inprocess` in the JSON). The arms share one compiled-kernel cache.

    python -m benchmarks serve_matched_hbm [--model /tmp/kimi48] [--out benchmarks/results/serve_matched_hbm_h200.json]
    python -m benchmarks serve_matched_hbm --smoke     # the same path on the CPU, embedded tiny model, tiny scale
    python -m benchmarks serve_matched_hbm --paper --cells-dir runs/mh_kimi48 --call-arms dense,nr16 \\
        --max-units 4 [--blocks-per-phase K]          # App. C.2 as stated, one resumable 10-minute call
    python -m benchmarks serve_matched_hbm --paper --model tests/data/kimi-linear-48b-a3b.config.json \\
        --load-format dummy --cells-dir ...           # the released model at its full size, dummy weights
--paper: clients.matched_hbm --paper (127 dense slots, six phases, dense x6, concurrency 96, chunked prefill 8192,
HTTP SSE, prompt-end checkpoints; --branch-checkpoints for the engine's branch points) with the issue's eight arms (PAPER_ARMS); each call runs the cells of --call-arms not yet in --cells-dir
(dense beside them) and writes the result of every cell so far; carry the cells directory from call to call
and join copies with benchmarks/merge_matched_hbm.py --cells.
Any further flag goes to `python -m clients.matched_hbm` and overrides the one set here (e.g. --dense-slots 32).
The phases are always those of all five arms, so a run split in two (one GPU call each, e.g.
`--arms dense,nr16,nr16+int8` then `--arms dense,nr64,wr16 --inprocess none`) measures the same blocks.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

ARMS = "dense,nr16,nr16+int8,nr64,wr16"
# 16 dense slots keep the largest phase (INT8's boundary, 135 slots -> Q = 159) and the five servers
# within the ~9 minutes of one GPU call; 127 (the paper's) would give blocks of 150 to 1206 prompts
GPU = ["--dense-slots", "16", "--scale", "1.0", "--blocks-per-phase", "1", "--seeds", "42,123,7",
       "--concurrency", "96", "--max-batch-size", "64", "--max-num-tokens", "8192", "--device", "cuda",
       "--dtype", "bfloat16"]
# the arms; the phases are the paper's (dense, nr16, nr64, nr128, nr512 boundaries + the full dataset)
PAPER_ARMS = "dense,nr16,nr64,nr128,nr512,wr16,wr64,nr16+int8"
PAPER = ["--paper", "--device", "cuda", "--dtype", "bfloat16", "--max-batch-size", "96"]
SMOKE = ["--dense-slots", "3", "--scale", "0.03", "--blocks-per-phase", "1", "--seeds", "42,7",
         "--concurrency", "4", "--max-batch-size", "4", "--device", "cpu", "--dtype", "float32",
         "--torch-threads", "1"]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="/tmp/kimi48", help="shaped checkpoint (written here when missing)")
    ap.add_argument("--out", default=None, help="result JSON (default benchmarks/results/serve_matched_hbm_h200.json; "
                    "with --smoke /tmp/serve_matched_hbm_smoke.json); the plot goes beside it (.png)")
    ap.add_argument("--work", default="/tmp/serve_matched_hbm", help="engines, server logs, kernel cache")
    ap.add_argument("--commit", default=None, help="commit to record (the device's .git may be stale)")
    ap.add_argument("--smoke", action="store_true", help="CPU, the embedded tiny model, a tiny scale")
    ap.add_argument("--paper", action="store_true", help="the paper's protocol and arms, resumable (--cells-dir)")
    args, rest = ap.parse_known_args(argv)
    # `timeout` ends a long run with SIGTERM: leave through the finally blocks, so the server it started
    # is stopped (the JSON already holds every finished arm)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))

    import torch
    if args.smoke:
        model = os.path.join(ROOT, "trtllm_dasc", "assets", "tiny-kimi-linear")
        out = args.out or "/tmp/serve_matched_hbm_smoke.json"
        base = SMOKE
    else:
        name = "serve_matched_hbm_paper_h200.json" if args.paper else "serve_matched_hbm_h200.json"
        model, out, base = args.model, args.out or os.path.join(HERE, "results", name), GPU
        # --load-format dummy (passed on): --model is a released config.json, its weights made at load time
        dummy = any(a == "--load-format=dummy" or (a == "--load-format" and rest[i + 1:i + 2] == ["dummy"])
                    for i, a in enumerate(rest))
        if not dummy and not os.path.isfile(os.path.join(model, "model.safetensors")):
            from benchmarks.shaped_model import write_shaped_model
            print(f"writing the Kimi-Linear-48B-shaped checkpoint to {model}", file=sys.stderr, flush=True)
            write_shaped_model(model, "kda", device="cuda" if torch.cuda.is_available() else "cpu")
    from clients import matched_hbm
    if args.paper:
        flags = ["--model", model, "--out", args.work, "--arms", PAPER_ARMS, "--json", out, *PAPER, *rest,
                 *(["--commit", args.commit] if args.commit else [])]
    else:
        flags = ["--model", model, "--out", args.work, "--arms", ARMS, "--phase-arms", ARMS, "--inprocess", "nr16",
                 "--json", out, *base, *rest, *(["--commit", args.commit] if args.commit else [])]
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return matched_hbm.drive("serve_matched_hbm", flags, argv, {"benchmark": "benchmarks/serve_matched_hbm.py",
                                                                 "torch": torch.__version__, "gpu": gpu},
                             lambda result: f"matched-HBM serving, Kimi-Linear-48B"
                                            f"{' (dummy weights)' if result.get('load_format') == 'dummy' else '-shaped (random weights)'}, TP1, "
                                            f"budget {result['budget_bytes']:,} B, {gpu or 'cpu smoke'}")

if __name__ == "__main__":
    sys.exit(main())
