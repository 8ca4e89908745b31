"""Prefill throughput of a Kimi-Linear-48B- or Qwen3-Next-80B-shaped stack on the GPU, with the time split by
layer kind, the fraction of the bf16 matmul peak, and each linear-attention mixer next to fla's own layer.

Stacks (random weights built in memory, no checkpoint; shapes from plan/synthetic.py, as
benchmarks/shaped_model.py writes them):
  kda  hidden 2304, 27 layers: 20 KDA (32 heads x 128) and 7 MLA at the released positions, a dense MLP of
       9216 = the active width of Kimi-Linear's MoE (8 routed + 1 shared expert of 1024);
  gdn  hidden 2048, 48 layers: 36 GDN (16 key / 32 value heads x 128) and 12 gated attention (16 heads x 256,
       2 KV heads), a dense MLP of 5632 = Qwen3-Next's active width (10 experts x 512 + a 512 shared one).
So the FLOPs per token match the real models. FLOPs counted per token: 2 x every matmul weight a token
passes through (the embedding is a lookup; the LM head runs on the last token only, so it counts 1/T),
causal attention 2 x (T+1)/2 x heads x (d_qk + d_v) per attention layer (QK^T and PV), and the chunked
delta rule's 6 K V + 2 C (3 K + 2 V) per linear head (C = 64: W S, Q S, K^T V' against the state; K K^T,
the WY products, Q K^T and P V' inside a chunk); the fraction of peak divides by --peak-tflops (790: the
bf16 GEMM rate measured on the H200, ENVIRONMENT.md).
Timing: CUDA events around every linear-attention mixer, attention mixer and MLP, and around the forward's
prologue (prologue_ms: its host work before the first layer, while the device waits, and the embedding); a
warm-up run per length first (fla's Triton autotuning stays out of the timed runs). With --compare-fla (needs the
flash-linear-attention package: fla.layers), fla's KimiDeltaAttention / GatedDeltaNet of the same shapes
is timed on the same tokens, so our mixer per layer stands next to fla's own layer in the same run; with
--compare-unfused the same model also runs with the mixers' conv, gate and norm in torch (backend
fla-unfused, the mixers before fusion), so the fusion's gain is measured in the same run too. --profile adds
one profiled forward per length (kernel_profile.py): which kernels a prefill spends its time in.
Writes a table to stdout and JSON to benchmarks/results/model_prefill_<arch>.json (and to $OUT).

    python -m benchmarks model_prefill [--arch kda|gdn] [--tokens 4096 16384] [--reps 3] [--compare-fla]
                                       [--compare-unfused] [--profile] [--smoke]
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time

import torch

from benchmarks.kernel_profile import kernel_trace, print_summary, summarize  # noqa: E402
from benchmarks.results_io import provenance, write_result  # noqa: E402
from benchmarks.shaped_model import Recorder, shaped_config  # noqa: E402

from trtllm_dasc.config import HybridConfig  # noqa: E402
from trtllm_dasc.model import HybridModel  # noqa: E402
from trtllm_dasc.model.direct import DirectRunner  # noqa: E402
from trtllm_dasc.model.recurrence import get_backend  # noqa: E402
from trtllm_dasc.plan.synthetic import KIMI_48B, QWEN3_NEXT_80B  # noqa: E402

CHUNK = 64                                      # fla's chunk size: the recurrence's intra-chunk work


def stack_config(arch: str, smoke: bool) -> dict:
    """The full-size shapes (dense MLP of the active width, the released vocabulary), or tiny ones."""
    raw = shaped_config(arch, vocab=KIMI_48B["vocab_size"] if arch == "kda" else QWEN3_NEXT_80B["vocab_size"])
    if smoke and arch == "kda":
        raw.update(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                   num_key_value_heads=2, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
        raw["linear_attn_config"].update(head_dim=16, num_heads=2)
    elif smoke:
        raw.update(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2,
                   linear_key_head_dim=16, linear_value_head_dim=16)
    return raw


def flops_per_token(raw: dict, cfg: HybridConfig, shapes: dict, tokens: int) -> dict:
    """Matmul, attention and recurrence FLOPs per token of a causal prefill of ``tokens`` (see the docstring)."""
    def params(name_has):
        return sum(math.prod(s) for n, s in shapes.items() if len(s) == 2 and name_has(n))
    head = params(lambda n: n.startswith("lm_head"))
    matmul = 2 * params(lambda n: "embed_tokens" not in n and not n.startswith("lm_head")) + 2 * head / tokens
    ctx = (tokens + 1) / 2                                         # mean causal context
    if raw["model_type"] == "kimi_linear":                         # MLA: nope + rope query/key dims
        d_qk, d_v = raw["qk_nope_head_dim"] + raw["qk_rope_head_dim"], raw["v_head_dim"]
    else:
        d_qk = d_v = raw["head_dim"]
    attention = 2 * ctx * raw["num_attention_heads"] * (d_qk + d_v) * len(cfg.full_attention_layers)
    K, V, HV = cfg.key_head_dim, cfg.value_head_dim, cfg.num_value_heads
    recurrence = (6 * K * V + 2 * CHUNK * (3 * K + 2 * V)) * HV * cfg.num_linear_layers
    return {"matmul": matmul, "attention": attention, "recurrence": recurrence,
            "total": matmul + attention + recurrence}


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


def host_syncs(fn) -> list[dict]:
    """The host synchronisations inside fn() (torch's sync debug mode: .item(), copies from or to pageable
    host memory, ...), counted by the code that asked (the innermost frames of ours and of the libraries).
    Each stalls the launch queue: the GPU idles until the host has launched the next kernels."""
    import collections
    import traceback
    import warnings
    hits = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1]
                  if ("site-packages" in f.filename or "trtllm_dasc" in f.filename)
                  and "/torch/" not in f.filename and "warnings" not in f.filename]
        where = " < ".join(f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno} {f.name}"
                           for f in reversed(frames[-3:]))
        hits[where or str(message)[:80]] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return [{"where": w, "count": n} for w, n in hits.most_common()]


def fla_layer(raw: dict, device: str, dtype):
    """fla's own mixer with this stack's shapes (KimiDeltaAttention / GatedDeltaNet), or None without
    the flash-linear-attention package (fla-core alone has no layers)."""
    try:
        from fla.layers import GatedDeltaNet, KimiDeltaAttention
    except Exception as e:              # not installed, or its imports fail: say so, time our side anyway
        print(f"model_prefill: fla.layers unavailable ({type(e).__name__}: {e})", file=sys.stderr)
        return None
    if raw["model_type"] == "kimi_linear":
        la = raw["linear_attn_config"]
        layer = KimiDeltaAttention(hidden_size=raw["hidden_size"], head_dim=la["head_dim"], num_heads=la["num_heads"],
                                   conv_size=la["short_conv_kernel_size"], norm_eps=raw["rms_norm_eps"])
    else:
        K, V = raw["linear_key_head_dim"], raw["linear_value_head_dim"]
        layer = GatedDeltaNet(hidden_size=raw["hidden_size"], head_dim=K, num_heads=raw["linear_num_key_heads"],
                              num_v_heads=raw["linear_num_value_heads"], expand_v=V / K,
                              conv_size=raw["linear_conv_kernel_dim"], norm_eps=raw["rms_norm_eps"])
    return layer.to(device=device, dtype=dtype).eval()


def time_fla_layer(layer, hidden: int, tokens: int, reps: int, dtype) -> float:
    """Median ms of one forward of fla's layer over ``tokens`` tokens (after a warm-up: autotuning)."""
    x = torch.randn(1, tokens, hidden, device="cuda", dtype=dtype)
    times = []
    with torch.no_grad():
        layer(x)
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            layer(x)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
    return statistics.median(times)


def time_arm(model, backend, ids, cuda: bool, reps: int, linear_layers: int) -> dict:
    """The same model and tokens under another recurrence backend (a warm-up, then reps), the main arm's
    backend restored after: tokens/s and the linear-attention time per layer of that arm."""
    main_backend, model.backend = model.backend, backend
    try:
        run_once(model, ids, cuda, timed=False)
        runs = [run_once(model, ids, cuda, timed=True) for _ in range(reps)]
    finally:
        model.backend = main_backend
    totals = [t for t, _ in runs]
    split = min(runs, key=lambda r: r[0])[1]
    total = statistics.median(totals)
    return {"backend": getattr(backend, "__name__", str(backend)), "total_ms": round(total, 3),
            "tokens_per_s": round(ids.numel() / total * 1e3, 1), "reps_ms": [round(x, 3) for x in totals],
            "linear_attn_ms": round(split.get("linear_attn", 0.0), 3),
            "mixer_ms_per_layer": round(split.get("linear_attn", 0.0) / linear_layers, 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="kda", choices=["kda", "gdn"],
                   help="kda: Kimi-Linear-48B-shaped stack; gdn: Qwen3-Next-80B-shaped stack")
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                   help="default bfloat16 on a GPU, float32 on the CPU (where bf16 matmuls are slow)")
    p.add_argument("--backend", default="fla", choices=["fla", "fla-unfused", "torch", "auto"])
    p.add_argument("--peak-tflops", type=float, default=790.0, help="bf16 matmul peak to divide by (H200: 790)")
    p.add_argument("--compare-fla", action="store_true",
                   help="also time fla's own KimiDeltaAttention / GatedDeltaNet layer (flash-linear-attention)")
    p.add_argument("--compare-unfused", action="store_true",
                   help="also time the same model with --backend fla-unfused (fla's recurrence kernels under the "
                        "torch conv, gate and norm: the mixers before fusion), in the same run")
    p.add_argument("--profile", action="store_true",
                   help="also one forward per length under torch.profiler (kernel_profile.py): kernels, device-busy "
                        "time and the costliest kernels, in the row's \"profile\"")
    p.add_argument("--sync-probe", action="store_true",
                   help="list the host synchronisations inside one forward per length (where the GPU waits "
                        "for the host), by the code that asked")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on whatever device exists (CI check)")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/model_prefill_<arch>.json)")
    p.add_argument("--commit", default=None, help="commit to record (a device copy's .git may be stale)")
    args = p.parse_args(argv)
    if args.reps < 1 or any(t < 64 for t in args.tokens) or args.peak_tflops <= 0:
        print("model_prefill: need --reps >= 1, --tokens >= 64 and --peak-tflops > 0", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("model_prefill: no CUDA device (use --smoke for a CPU check)", file=sys.stderr)
        return 1
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"model_prefill_{args.arch}.json")
    device = "cuda" if cuda else "cpu"
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    backend = args.backend if cuda else "torch"
    raw = stack_config(args.arch, args.smoke)
    cfg = HybridConfig.from_dict(raw, conv_dtype=args.dtype)
    t = time.perf_counter()
    source = Recorder(device, keep_tensors=False)        # the shapes, for the FLOP count
    model = HybridModel.from_source(cfg, source, dtype=args.dtype, device=device, backend=backend)
    build_s = time.perf_counter() - t
    mixer = "KDA" if args.arch == "kda" else "GDN"
    print(f"built {cfg.num_linear_layers} {mixer} + {len(cfg.full_attention_layers)} attention layers in "
          f"{build_s:.1f}s; backend={model.backend.__name__.rsplit('.', 1)[-1]} device={device} dtype={args.dtype}",
          flush=True)
    reference = fla_layer(raw, device, getattr(torch, args.dtype)) if args.compare_fla and cuda else None
    if args.compare_fla and reference is None:
        print("model_prefill: --compare-fla needs CUDA and the flash-linear-attention package; skipped",
              file=sys.stderr)

    def save(rows: list, complete: bool) -> None:
        """Write the JSON; called after every length too, so a run cut by a time limit keeps its rows."""
        result = {"benchmark": "model_prefill", **provenance("benchmarks/model_prefill.py", argv, args.commit),
                  "torch": torch.__version__, "arch": args.arch,
                  "backend": model.backend.__name__, "dtype": args.dtype, "smoke": args.smoke,
                  "peak_tflops": args.peak_tflops,
                  "shape": {"hidden": raw["hidden_size"], "layers": raw["num_hidden_layers"],
                            "linear_layers": cfg.num_linear_layers, "attention_layers": len(cfg.full_attention_layers),
                            "linear_key_heads": cfg.num_key_heads, "linear_value_heads": cfg.num_value_heads,
                            "linear_head_dim": cfg.key_head_dim,
                            "mlp": f"dense {raw['intermediate_size']}", "vocab": raw["vocab_size"]},
                  "timing": "median total over reps (wall, synchronized); split = CUDA events of the fastest rep; "
                            "fla_layer_ms = median CUDA-event time of fla's layer on [1, T, hidden]",
                  "results": rows, "complete": complete}
        try:
            import fla
            result["fla"] = getattr(fla, "__version__", "unknown")
        except ImportError:
            result["fla"] = None
        paths = [out] + ([os.path.join(os.environ["OUT"], os.path.basename(out))] if os.environ.get("OUT") else [])
        for path in paths:
            write_result(path, result)

    unfused = None
    if args.compare_unfused and cuda and args.backend != "fla-unfused":
        unfused = get_backend("fla-unfused", device)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for T in args.tokens:
        ids = torch.randint(0, raw["vocab_size"], (T,), generator=gen)
        t_warm = time.perf_counter()
        run_once(model, ids, cuda, timed=False)               # warm-up: autotune, allocator
        warmup_s = time.perf_counter() - t_warm
        totals, splits = [], []
        for _ in range(args.reps):
            total, split = run_once(model, ids, cuda, timed=True)
            totals.append(total)
            splits.append(split)
        best = min(range(args.reps), key=lambda i: totals[i])
        total, split = statistics.median(totals), splits[best]
        flops = flops_per_token(raw, cfg, source.shapes, T)
        row = {"tokens": T, "total_ms": round(total, 3), "tokens_per_s": round(T / total * 1e3, 1),
               "reps_ms": [round(x, 3) for x in totals], "warmup_s": round(warmup_s, 1),
               "gflop_per_token": round(flops["total"] / 1e9, 4),
               "flops_split": flops,
               "fraction_of_peak": round(flops["total"] * T / (total * 1e-3) / (args.peak_tflops * 1e12), 4)}
        for kind in ("prologue", "linear_attn", "attention", "mlp", "head"):
            row[f"{kind}_ms"] = round(split.get(kind, 0.0), 3)
        row["other_ms"] = round(max(0.0, totals[best] - sum(split.values())), 3)
        row["mixer_ms_per_layer"] = round(row["linear_attn_ms"] / cfg.num_linear_layers, 3)
        if reference is not None:
            row["fla_layer_ms"] = round(time_fla_layer(reference, raw["hidden_size"], T, args.reps,
                                                       getattr(torch, args.dtype)), 3)
            row["mixer_over_fla"] = round(row["mixer_ms_per_layer"] / row["fla_layer_ms"], 3)
        if unfused is not None:
            row["unfused"] = time_arm(model, unfused, ids, cuda, args.reps, cfg.num_linear_layers)
            row["speedup_over_unfused"] = round(row["unfused"]["total_ms"] / row["total_ms"], 3)
        if args.profile:
            # after the timed reps (the profiler slows the forward it watches): what one forward spends
            with kernel_trace(device, attribute=True) as prof:
                run_once(model, ids, cuda, timed=False)
            row["profile"] = summarize(prof, 1, device)
            print_summary(f"T={T}", row["profile"], lines=25)
        if args.sync_probe and cuda:
            row["host_syncs"] = host_syncs(lambda: run_once(model, ids, cuda, timed=False))
            print(f"  host synchronisations in one forward at T={T}: {sum(h['count'] for h in row['host_syncs'])}")
            for h in row["host_syncs"][:20]:
                print(f"    {h['count']:>4}  {h['where']}")
        rows.append(row)
        save(rows, complete=False)
        print(f"T={T}: {row['tokens_per_s']:.0f} tok/s (warm-up {warmup_s:.0f} s)"
              + (f" (unfused {row['unfused']['tokens_per_s']:.0f})" if "unfused" in row else ""), flush=True)
    hdr = (f"{'tokens':>7} {'total ms':>10} {'tok/s':>10} {'% peak':>7} {'lin-attn ms':>12} {'attn ms':>9} "
           f"{'mlp ms':>9} {'head ms':>8} {'prologue':>9} {'mixer/layer':>12} {'fla layer':>10}")
    print(hdr)
    for r in rows:
        fla_ms = f"{r['fla_layer_ms']:>10.3f}" if "fla_layer_ms" in r else f"{'-':>10}"
        print(f"{r['tokens']:>7} {r['total_ms']:>10.2f} {r['tokens_per_s']:>10.0f} {100 * r['fraction_of_peak']:>6.1f}% "
              f"{r['linear_attn_ms']:>12.2f} {r['attention_ms']:>9.2f} {r['mlp_ms']:>9.2f} {r['head_ms']:>8.2f} "
              f"{r['prologue_ms']:>9.2f} {r['mixer_ms_per_layer']:>12.3f} {fla_ms}")
        if "unfused" in r:
            u = r["unfused"]
            print(f"{'':>7} unfused: {u['total_ms']:.2f} ms, {u['tokens_per_s']:.0f} tok/s, mixer/layer "
                  f"{u['mixer_ms_per_layer']:.3f} ms; fused is {r['speedup_over_unfused']:.2f}x")
    save(rows, complete=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
