"""GPU benchmark: one training step of the large quality models, short convolution by transformers' torch
fallback vs fla's Triton causal_conv1d, and where a step's GPU time goes.

The quality training (trtllm_dasc/evals/train.py, --size large: 12 layers of 384, 65,536 tokens a step)
ran at about 2.1 steps/s a model with two models on one H100 (session 29's logs, branch quality-stages),
and the prefetching batch worker (evals/prefetch.py) did not change that: the step is GPU time. transformers
logs that its short convolution falls back to a "much slower" PyTorch path (a depthwise F.conv1d) because
Tri Dao's causal_conv1d is not installed; evals/train_kernels.py can put fla's Triton kernel there instead.
This times both arms in the same run on the same GPU: for each model and batch length, the same batch,
`--warmup` untimed steps then the median of `--steps` timed steps (forward, backward, clip, AdamW, as
train.py runs them, bf16 autocast), and at `--profile-length` for each arm a profile of three steps
(benchmarks/kernel_profile.py: the kernels by time and the operators that launched them, the device's
busy time against the step's span, its idle gaps).

Target, written before the first run: with fla's convolution a step is at least 10% faster than with the
torch fallback at 4,096 tokens, for both models.

    python -m benchmarks train_step [--archs kda,gdn] [--lengths 1024,4096,8192] [--steps 20] [--warmup 5]
        [--profile-length 4096] [--commit SHA] [--out benchmarks/results/train_step.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from benchmarks.kernel_profile import print_summary
from benchmarks.results_io import provenance, write_result

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = "with fla's convolution a step is at least 10% faster than with the torch fallback at 4,096 tokens, " \
         "for both models"
ARMS = ("torch", "auto")          # TrainConfig.conv: transformers' fallback, fla where it passes its check


def one_step(model, opt, tokens, mask, cfg, amp):
    """The trainer's step (evals/train.py forward_backward, then the update), without its one read-back."""
    from trtllm_dasc.evals.train import forward_backward
    forward_backward(model, opt, tokens, mask, cfg, amp)
    opt.step()


def synchronize(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def profile_steps(model, opt, tokens, mask, cfg, amp, steps: int = 3) -> dict:
    """kernel_profile's summary of ``steps`` steps: the kernels by time with the operators that launched
    them, the device's busy time against the span, and its idle gaps (a launch-bound step shows as idle)."""
    from benchmarks.kernel_profile import kernel_trace, summarize
    device = "cuda" if tokens.is_cuda else "cpu"
    synchronize(device)
    with kernel_trace(device, attribute=True) as prof:
        for _ in range(steps):
            one_step(model, opt, tokens, mask, cfg, amp)
        synchronize(device)
    return summarize(prof, steps, device, top=25)


def run_arm(arch: str, arm: str, lengths, steps: int, warmup: int, profile_length: int, log,
            device: str = "cuda", size: str = "large", tokens_per_step: int | None = None) -> dict:
    import torch
    from trtllm_dasc.evals.mixture import TrainingMixture
    from trtllm_dasc.evals.train import SIZES, TrainConfig, autocast_for, build_model, build_optimizer, select_kernels
    from trtllm_dasc.evals.vocab import TaskVocab
    cfg = TrainConfig(arch=arch, **{**SIZES[size], "conv": arm})
    if tokens_per_step:
        cfg.tokens_per_step = tokens_per_step
    on_gpu = device.startswith("cuda")
    recurrence, conv = select_kernels(cfg, device, log)
    model = build_model(cfg).to(device).train()
    opt, amp = build_optimizer(model, cfg), autocast_for(device)
    mixture = TrainingMixture(vocab=TaskVocab(cfg.vocab_size), min_length=cfg.min_length, max_length=cfg.max_length)
    rows, profile_rows = [], None
    for length in lengths:
        batch = max(1, cfg.tokens_per_step // length)
        tokens, mask = (torch.as_tensor(a, device=device)
                        for a in mixture.batch(batch, length, np.random.default_rng([0, length])))
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        for _ in range(warmup):          # compiles and autotunes at this shape
            one_step(model, opt, tokens, mask, cfg, amp)
        times = []
        for _ in range(steps):
            synchronize(device)
            t = time.perf_counter()
            one_step(model, opt, tokens, mask, cfg, amp)
            synchronize(device)
            times.append(time.perf_counter() - t)
        ms = 1000 * statistics.median(times)
        rows.append({"length": length, "batch": batch, "median_ms": round(ms, 2),
                     "min_ms": round(1000 * min(times), 2), "steps_per_s": round(1000 / ms, 2),
                     "peak_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2) if on_gpu else None})
        log(f"{arch} conv={conv:5s} length {length:5d} x {batch:3d}: median {ms:7.1f} ms "
            f"({1000 / ms:.2f} steps/s), peak {rows[-1]['peak_gib']} GiB")
        if length == profile_length:
            profile_rows = profile_steps(model, opt, tokens, mask, cfg, amp)
            print_summary(f"{arch} conv={conv} at {length}", profile_rows, lines=12)
    del model, opt
    if on_gpu:
        torch.cuda.empty_cache()
    return {"arch": arch, "arm": arm, "conv": conv, "recurrence": recurrence, "rows": rows,
            "profile_length": profile_length, "profile": profile_rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default="kda,gdn")
    ap.add_argument("--lengths", default="1024,4096,8192")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per length (median reported)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per length first (compiles, autotuning)")
    ap.add_argument("--profile-length", type=int, default=4096, help="the length whose kernels are profiled")
    ap.add_argument("--device", default="cuda", help="cuda (the benchmark); cpu only smoke-tests this script")
    ap.add_argument("--size", default="large", help="the training preset (evals/train.py SIZES)")
    ap.add_argument("--tokens-per-step", type=int, default=None, help="default: the preset's (large: 65,536)")
    ap.add_argument("--commit", default=None, help="commit to record (a device's .git may be stale)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "train_step.json"))
    args = ap.parse_args(argv)
    import torch
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("train_step: needs a CUDA GPU (the training's fla kernels are Triton GPU kernels)", file=sys.stderr)
        return 2
    archs = [a for a in args.archs.split(",") if a]
    lengths = [int(x) for x in args.lengths.split(",") if x]
    if not archs or any(a not in ("kda", "gdn") for a in archs) or not lengths or min(lengths) < 64:
        ap.error("--archs is a comma list of kda, gdn; --lengths a comma list of lengths >= 64")
    if args.steps < 1 or args.warmup < 0:
        ap.error("need --steps >= 1 and --warmup >= 0")
    print(f"target: {TARGET}", flush=True)
    log = lambda m: print(m, flush=True)    # noqa: E731
    head = {"benchmark": "train_step", **provenance("benchmarks/train_step.py", argv, args.commit),
            "target": TARGET, "steps": args.steps, "warmup": args.warmup}
    arms = []
    for arch in archs:
        for arm in ARMS:
            arms.append(run_arm(arch, arm, lengths, args.steps, args.warmup, args.profile_length, log, args.device,
                                args.size, args.tokens_per_step))
            # each arm as it ends: a device call cut by its timeout still returns the arms it finished
            write_result(args.out, {**head, "complete": False, "arms": arms})
    speedups = {}
    for arch in archs:
        by_arm = {a["arm"]: {r["length"]: r["median_ms"] for r in a["rows"]} for a in arms if a["arch"] == arch}
        speedups[arch] = {str(n): round(by_arm["torch"][n] / by_arm["auto"][n], 3) for n in lengths}
        print(f"{arch}: step time torch / fla conv: "
              + ", ".join(f"{n}: {s:.2f}x" for n, s in speedups[arch].items()), flush=True)
    met = all(a["conv"] == "fla" for a in arms if a["arm"] == "auto") and 4096 in lengths and \
        all(speedups[a]["4096"] >= 1.10 for a in archs)
    print(f"target {'met' if met else 'not met'}: {TARGET}", flush=True)
    result = {**head, "complete": True, "target_met": met, "speedup_torch_over_fla": speedups, "arms": arms}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
