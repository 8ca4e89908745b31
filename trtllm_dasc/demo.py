"""`make run`: the paper's matched-HBM serving protocol (App. C.2) on the embedded default model, with
checkpoints at prompt ends and branch points (App. C.2's SGLang keeps prompt ends only: `--prompt-only`).

Three arms at one checkpoint budget, small enough that dense holds only 6 checkpoints: dense, dasc-nr
W_max=16 and dasc-nr W_max=16 + INT8. Each is built with dasc-build, served by its own tritonserver and
driven by the same streaming workload (`python -m clients.matched_hbm`, whose exact command this prints
and records): a synthetic MMLU-Pro-shaped prompt set at a fifth of the paper's token lengths, one block
per capacity-boundary phase, three request-order seeds, concurrency 8, one output token. It prints the
table (slots, TTFT, input tokens/s, hit rate) and writes the JSON and the plot to demo_out/.

The planner's capacity tables for the released models' shapes are `dasc plan` (see the README).
"""
from __future__ import annotations

import os
import sys
import time

OUT = os.environ.get("DASC_DEMO_OUT", "demo_out")
MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "tiny-kimi-linear")

# a fifth of the paper's lengths (prefix 300-500, question 20-60 tokens) keeps three arms x three seeds in
# about two minutes on a 2-core CPU; one engine thread, since client, server and engine share the 2 cores
ARGS = ["--model", MODEL, "--out", OUT, "--arms", "dense,nr16,nr16+int8", "--dense-slots", "6",
        "--scale", "0.2", "--blocks-per-phase", "1", "--seeds", "42,123,7", "--concurrency", "8",
        "--max-batch-size", "8", "--device", "cpu", "--dtype", "bfloat16", "--torch-threads", "1"]


def main() -> int:
    # the demo is an application of the client package (it sits above the library it lives in)
    from clients.matched_hbm import main as matched_hbm

    rel = os.path.relpath(MODEL)
    print("=== make run: matched-HBM serving on the embedded tiny Kimi-Linear (CPU) ===")
    print("python -m clients.matched_hbm " + " ".join(a if a != MODEL else rel for a in ARGS), flush=True)
    t0 = time.perf_counter()
    try:
        rc = matched_hbm(ARGS)
    except KeyboardInterrupt:
        # the servers are stopped by the protocol's own cleanup on the way out; a traceback says nothing more
        print("\nmake run: interrupted; its servers were stopped (demo_out/ holds what was measured so far: "
              "its JSON says complete false)", file=sys.stderr)
        return 130
    if rc:
        return rc
    out = os.path.abspath(OUT)
    print(f"\nwall time {time.perf_counter() - t0:.0f} s. CPU figures of a tiny random-weight model: only the "
          "relative effect of the arms matters.")
    print(f"results: {os.path.join(out, 'matched_hbm.json')} (every block's per-request figures)")
    print(f"plot:    {os.path.join(out, 'matched_hbm.png')}")
    print(f"engines: {os.path.join(out, 'engines')}/<arm> (serve one with `dasc serve --model DIR`)")
    print(f"server logs: {os.path.join(out, 'servers')}/<arm>/tritonserver.log")
    return 0


if __name__ == "__main__":
    sys.exit(main())
