"""CPU benchmark: how long building one training batch of the quality mixture takes, per batch length.

The quality training (trtllm_dasc/evals/train.py) builds each step's batch with TrainingMixture.batch: Python
and numpy, on the CPU. Built inside the training loop, that time is GPU idle time on every step; since
3c0fc9e a worker process builds the next batch while the step runs (evals/prefetch.py). This measures the
time that moved off the step: the large preset's batches (65,536 tokens a step, vocabulary 512, examples of
1,024-8,192 tokens), at the curriculum's batch lengths, median over ``--repeats`` batches, each from its own
generator as the trainer draws them.

No target: it sizes the idle time the prefetch removes (compare it with a step's GPU time in a training log).

    python -m benchmarks batch_build [--repeats 5] [--out benchmarks/results/batch_build.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from benchmarks.results_io import provenance, write_result
from trtllm_dasc.evals.mixture import TrainingMixture
from trtllm_dasc.evals.vocab import TaskVocab

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENS_PER_STEP = 65536                          # evals/train.py SIZES["large"]
LENGTHS = (256, 512, 1024, 2048, 4096, 8192)     # the curriculum's stages, then the final range's ends


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="batches timed per length (median reported)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "batch_build.json"))
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    mixture = TrainingMixture(vocab=TaskVocab(512), min_length=1024, max_length=8192, seed=0)
    rows = []
    for length in LENGTHS:
        batch = max(1, TOKENS_PER_STEP // length)
        times = []
        for r in range(args.repeats):
            t = time.perf_counter()
            mixture.batch(batch, length, np.random.default_rng([0, length, r]), with_tasks=True)
            times.append(time.perf_counter() - t)
        rows.append({"length": length, "batch": batch, "median_ms": round(1000 * statistics.median(times), 1),
                     "max_ms": round(1000 * max(times), 1)})
        print(f"length {length:5d} x {batch:3d} rows: median {rows[-1]['median_ms']:6.1f} ms, "
              f"max {rows[-1]['max_ms']:6.1f} ms", flush=True)
    result = {"benchmark": "batch_build", **provenance("benchmarks/batch_build.py", argv),
              "tokens_per_step": TOKENS_PER_STEP, "repeats": args.repeats, "rows": rows}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
