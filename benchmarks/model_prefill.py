"""Prefill throughput of a Kimi-Linear-shaped stack on the GPU, with the time split by layer kind.

Stack: hidden 2304, 27 layers (20 KDA with 32 heads x 128, 7 MLA at Kimi-Linear-48B's full_attn_layers),
random weights built in memory (no checkpoint). The MLP is dense, 9216 wide = the active width of
Kimi-Linear's MoE (8 routed + 1 shared expert of 1024), so the FLOPs per token match the real model.
Timing: CUDA events around every linear-attention mixer, attention mixer and MLP; a warm-up run per
length first (fla's Triton autotuning stays out of the timed runs). Writes a table to stdout and JSON to
benchmarks/results/model_prefill.json (and to $OUT when set).

    python benchmarks/model_prefill.py [--tokens 4096 16384] [--reps 3] [--smoke]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from results_io import provenance, write_result  # noqa: E402

from trtllm_dasc.config import HybridConfig  # noqa: E402
from trtllm_dasc.model import HybridModel, RandomWeights  # noqa: E402
from trtllm_dasc.model.direct import DirectRunner  # noqa: E402

KIMI_FULL_ATTN = [4, 8, 12, 16, 20, 24, 27]      # 1-indexed, as in Kimi-Linear-48B's config.json


def kimi_config(smoke: bool) -> dict:
    layers = 27
    raw = {"model_type": "kimi_linear", "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216,
           "num_hidden_layers": layers, "num_attention_heads": 32, "num_key_value_heads": 32,
           "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "v_head_dim": 128, "rms_norm_eps": 1e-5, "hidden_act": "silu", "mlp_layer_types": ["dense"] * layers,
           "linear_attn_config": {"head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
                                  "full_attn_layers": KIMI_FULL_ATTN,
                                  "kda_layers": [i for i in range(1, layers + 1) if i not in KIMI_FULL_ATTN]}}
    if smoke:
        raw.update(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                   num_key_value_heads=2, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
        raw["linear_attn_config"].update(head_dim=16, num_heads=2)
    return raw


class EventTimer:
    """timer(kind) context manager recording CUDA event pairs (wall clock on the CPU)."""

    def __init__(self, cuda: bool):
        self.cuda, self.spans = cuda, {}

    @contextlib.contextmanager
    def __call__(self, kind: str):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            yield
            b.record()
            self.spans.setdefault(kind, []).append((a, b))
        else:
            t = time.perf_counter()
            yield
            self.spans.setdefault(kind, []).append(time.perf_counter() - t)

    def totals_ms(self) -> dict:
        if self.cuda:
            torch.cuda.synchronize()
            return {k: sum(a.elapsed_time(b) for a, b in v) for k, v in self.spans.items()}
        return {k: 1e3 * sum(v) for k, v in self.spans.items()}


def run_once(model, ids, cuda: bool, timed: bool):
    runner = DirectRunner(model, rows=1, max_tokens=ids.numel(), block_size=64)
    timer = EventTimer(cuda) if timed else None
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    runner.run(ids, logits="last", timer=timer)
    if cuda:
        torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t), (timer.totals_ms() if timer else {})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--backend", default="fla", choices=["fla", "torch", "auto"])
    p.add_argument("--smoke", action="store_true", help="tiny shapes on whatever device exists (CI check)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                 "model_prefill.json"))
    p.add_argument("--commit", default=None, help="commit to record (a device copy's .git may be stale)")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("model_prefill: no CUDA device (use --smoke for a CPU check)", file=sys.stderr)
        return 1
    device = "cuda" if cuda else "cpu"
    backend = args.backend if cuda else "torch"
    raw = kimi_config(args.smoke)
    cfg = HybridConfig.from_dict(raw, conv_dtype=args.dtype)
    t = time.perf_counter()
    model = HybridModel.from_source(cfg, RandomWeights(seed=0, device=device), dtype=args.dtype, device=device,
                                    backend=backend)
    build_s = time.perf_counter() - t
    print(f"built {cfg.num_linear_layers} KDA + {len(cfg.full_attention_layers)} MLA layers in {build_s:.1f}s; "
          f"backend={model.backend.__name__.rsplit('.', 1)[-1]} device={device} dtype={args.dtype}", flush=True)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for T in args.tokens:
        ids = torch.randint(0, raw["vocab_size"], (T,), generator=gen)
        run_once(model, ids, cuda, timed=False)               # warm-up: autotune, allocator
        totals, splits = [], []
        for _ in range(args.reps):
            total, split = run_once(model, ids, cuda, timed=True)
            totals.append(total)
            splits.append(split)
        best = min(range(args.reps), key=lambda i: totals[i])
        total, split = statistics.median(totals), splits[best]
        row = {"tokens": T, "total_ms": round(total, 3), "tokens_per_s": round(T / total * 1e3, 1),
               "reps_ms": [round(x, 3) for x in totals]}
        for kind in ("linear_attn", "attention", "mlp", "head"):
            row[f"{kind}_ms"] = round(split.get(kind, 0.0), 3)
        row["other_ms"] = round(max(0.0, totals[best] - sum(split.values())), 3)
        rows.append(row)
        print(f"T={T}: {row['tokens_per_s']:.0f} tok/s", flush=True)
    hdr = f"{'tokens':>7} {'total ms':>10} {'tok/s':>10} {'lin-attn ms':>12} {'attn ms':>9} {'mlp ms':>9} {'head ms':>8}"
    print(hdr)
    for r in rows:
        print(f"{r['tokens']:>7} {r['total_ms']:>10.2f} {r['tokens_per_s']:>10.0f} {r['linear_attn_ms']:>12.2f} "
              f"{r['attention_ms']:>9.2f} {r['mlp_ms']:>9.2f} {r['head_ms']:>8.2f}")
    result = {"benchmark": "model_prefill", **provenance("benchmarks/model_prefill.py", argv, args.commit),
              "torch": torch.__version__,
              "backend": model.backend.__name__, "dtype": args.dtype, "smoke": args.smoke,
              "shape": {"hidden": raw["hidden_size"], "layers": raw["num_hidden_layers"],
                        "kda_layers": cfg.num_linear_layers, "mla_layers": len(cfg.full_attention_layers),
                        "kda_heads": cfg.num_key_heads, "kda_head_dim": cfg.key_head_dim,
                        "mlp": f"dense {raw['intermediate_size']}", "vocab": raw["vocab_size"]},
              "timing": "median total over reps (wall, synchronized); split = CUDA events of the fastest rep",
              "results": rows}
    try:
        import fla
        result["fla"] = getattr(fla, "__version__", "unknown")
    except ImportError:
        result["fla"] = None
    paths = [args.out] + ([os.path.join(os.environ["OUT"], "model_prefill.json")] if os.environ.get("OUT") else [])
    for path in paths:
        write_result(path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
