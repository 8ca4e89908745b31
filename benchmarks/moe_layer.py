"""The MoE layer alone (router, routed experts, shared expert) at the released models' shapes with random
bf16 weights on one GPU: the per-expert loop (model/moe/naive.py) against the fused Triton kernels
(model/moe/kernel.py) and torch's grouped GEMM (model/moe/grouped_mm.py, where torch._grouped_mm runs),
at 1 / 8 / 64 / 512 / 8192 tokens, in the same run.

- Kimi-Linear-48B-A3B: 256 experts of width 1024, hidden 2304, top-8, one shared expert, sigmoid router
  with the correction bias and routed_scaling_factor 2.446. The reference config.json
  (../shared/reference/kimi-linear-48b-a3b.config.json) names no expert groups: the family's defaults,
  n_group 1 / topk_group 1, apply (--kimi-groups changes them).
- Qwen3-Next-80B-A3B: 512 experts of width 512, hidden 2048, top-10, a gated shared expert of width 512.

Device time by CUDA events (copy_bandwidth.device_ms: JIT and the first call outside the timed region),
each arm's output checked against the loop's (RMS-relative error), whether the fused forward synchronises
(torch.cuda.set_sync_debug_mode("error")), and one CUDA graph of the fused layer per model at decode
sizes (captured once, replayed, compared to eager, and timed). Tile choices of the Triton kernels are also
timed (--sweep, on by default) so the heuristic in kernel.config can be checked against them.

    python benchmarks/moe_layer.py --commit SHA [--tokens 1 8 64 512 8192] [--models kimi qwen]
    python benchmarks/moe_layer.py --smoke     # CPU, tiny shapes, Triton's interpreter (tests run it)

Refuses to record a GPU run without a clean commit (pass --commit on a device copy whose .git is stale).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

TARGET = "target: fused at 64 tokens >= 10x the per-expert loop"
TARGET_TOKENS, TARGET_SPEEDUP = 64, 10.0
MODELS = {
    "kimi": dict(name="Kimi-Linear-48B-A3B", arch="kda", E=256, D=2304, I=1024, top_k=8, shared=1024,
                 n_group=1, topk_group=1, scale=2.446),
    "qwen": dict(name="Qwen3-Next-80B-A3B", arch="gdn", E=512, D=2048, I=512, top_k=10, shared=512),
}
SMOKE = {"kimi": dict(E=8, D=48, I=24, top_k=3, shared=24, n_group=4, topk_group=2),
         "qwen": dict(E=8, D=32, I=16, top_k=3, shared=16)}
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) of the sweep
SWEEP = [(16, 64, 128, 4, 3), (32, 64, 64, 4, 3), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3)]


def build_layer(torch, shape: dict, dtype, device, seed: int = 0):
    """QwenMoE / KimiMoE with random weights (routers spread over the experts, outputs O(1))."""
    from trtllm_dasc.model.mlp import DenseMLP, KimiMoE, QwenMoE
    g = torch.Generator(device=device).manual_seed(seed)
    E, D, inter, sh = shape["E"], shape["D"], shape["I"], shape["shared"]

    def rnd(*size, fan_in, dt=dtype):
        return (torch.randn(*size, generator=g, device=device, dtype=torch.float32) / fan_in ** 0.5).to(dt)
    w = {"gate_up": rnd(E, 2 * inter, D, fan_in=D), "down": rnd(E, D, inter, fan_in=inter),
         "shared": DenseMLP(rnd(sh, D, fan_in=D), rnd(sh, D, fan_in=D), rnd(D, sh, fan_in=sh))}
    if shape["arch"] == "gdn":
        w.update(router=rnd(E, D, fan_in=D), shared_gate=rnd(1, D, fan_in=D))
        spec = SimpleNamespace(num_experts=E, top_k=shape["top_k"], norm_topk_prob=True)
        return QwenMoE(w, spec)
    w.update(router=rnd(E, D, fan_in=D, dt=torch.float32),
             bias=(torch.randn(E, generator=g, device=device) * 0.01))
    spec = SimpleNamespace(num_experts=E, top_k=shape["top_k"], norm_topk_prob=True, n_group=shape["n_group"],
                           topk_group=shape["topk_group"], routed_scaling_factor=shape["scale"])
    return KimiMoE(w, spec)


def rel_err(torch, ref, got) -> float:
    d = (ref.double() - got.double())
    return float(d.pow(2).mean().sqrt() / ref.double().pow(2).mean().sqrt().clamp_min(1e-30))


def timer(torch, cuda: bool, reps: int):
    if cuda:
        from copy_bandwidth import device_ms
        return lambda fn: device_ms(torch, fn, reps)

    def host_ms(fn):
        # no warm-up call: the smoke run's interpreter compiles nothing, and every call costs seconds
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) * 1e3 / reps
    return host_ms


def syncs(torch, fn) -> bool:
    """Whether fn() synchronises with the host (torch's sync debug mode raises on one)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        return False
    except RuntimeError:
        return True
    finally:
        torch.cuda.set_sync_debug_mode(0)


def graph_check(torch, layer, x, fused: bool, ms) -> dict:
    """Capture the fused layer's forward once, replay it on new inputs, compare to eager; replay time."""
    static = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer.forward(static, fused)                   # JIT and allocator warm-up off the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer.forward(static, fused)
    static.copy_(x.flip(0))
    graph.replay()
    eager = layer.forward(x.flip(0), fused)
    torch.cuda.synchronize()
    return {"tokens": x.shape[0], "equal_to_eager": bool(torch.equal(out, eager)),
            "max_abs_diff": float((out.float() - eager.float()).abs().max()), "replay_ms": ms(graph.replay)}


def run_model(torch, key: str, shape: dict, args, dtype, device) -> dict:
    from trtllm_dasc.model.moe import grouped_mm, kernel
    cuda = device == "cuda"
    layer = build_layer(torch, shape, dtype, device)
    fused = cuda
    arms = ["loop", "triton"] + (["grouped_mm"] if grouped_mm.available(device, dtype) else [])
    rows, out = [], {"shape": {k: v for k, v in shape.items() if k != "name"}, "model": shape["name"], "arms": arms}
    g = torch.Generator(device=device).manual_seed(1)
    for T in args.tokens:
        x = torch.randn(T, shape["D"], generator=g, device=device, dtype=torch.float32).to(dtype)
        ms = timer(torch, cuda, args.reps if T < 4096 else max(2, args.reps // 4))
        res, ref = {"tokens": T}, None
        for arm in arms:
            layer.backend = arm
            y = layer.forward(x, fused)
            if ref is None:
                ref = y
            else:
                res[f"{arm}_rel_err"] = rel_err(torch, ref, y)
            res[f"{arm}_ms"] = ms(lambda: layer.forward(x, fused))
            if cuda and arm != "loop":
                res[f"{arm}_syncs"] = syncs(torch, lambda: layer.forward(x, fused))
        for arm in arms[1:]:
            res[f"{arm}_speedup"] = res["loop_ms"] / res[f"{arm}_ms"]
        if args.sweep:
            layer.backend = "loop"
            res["triton_default_tiles"] = kernel.config(T, shape["top_k"], shape["E"])
            sweep = {}
            for bm, bn, bk, nw, ns in SWEEP[:1] if args.smoke else SWEEP:
                cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)
                wts, idx = layer.route(x)
                fn = lambda: kernel.experts_triton(x, idx, wts, layer.w["gate_up"], layer.w["down"], cfg)  # noqa: E731
                sweep[f"{bm}x{bn}x{bk}w{nw}s{ns}"] = ms(fn)
            res["triton_experts_only_ms_by_tiles"] = sweep
        rows.append(res)
        print(f"{key:5s} T={T:5d} " + "  ".join(f"{a} {res[a + '_ms']:8.3f} ms" for a in arms)
              + "  " + "  ".join(f"{a} x{res[a + '_speedup']:.1f}" for a in arms[1:]), flush=True)
    out["rows"] = rows
    if cuda:
        layer.backend = "triton"
        ms = timer(torch, True, args.reps)
        out["cuda_graph"] = []
        for T in (1, 8, 64):
            x = torch.randn(T, shape["D"], generator=g, device=device, dtype=torch.float32).to(dtype)
            out["cuda_graph"].append(graph_check(torch, layer, x, fused, ms))
            print(f"{key:5s} graph T={T}: {out['cuda_graph'][-1]}", flush=True)
    at = next((r for r in rows if r["tokens"] == TARGET_TOKENS), None)
    if at is not None:
        best = max(at[f"{a}_speedup"] for a in arms[1:])
        out["target"] = {"tokens": TARGET_TOKENS, "triton_speedup": at["triton_speedup"], "best_speedup": best,
                         "met": at["triton_speedup"] >= TARGET_SPEEDUP}
    return out


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", help="token counts (default 1 8 64 512 8192; smoke 1 9)")
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    ap.add_argument("--reps", type=int, help="timed calls per figure (default 20; smoke 1)")
    ap.add_argument("--kimi-groups", type=int, nargs=2, metavar=("N_GROUP", "TOPK_GROUP"),
                    help="Kimi's expert groups (default 1 1: the family's defaults)")
    ap.add_argument("--no-sweep", dest="sweep", action="store_false", help="skip the Triton tile sweep")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, fp32, Triton's interpreter")
    ap.add_argument("--commit", default=None, help="commit to record (a device copy's .git may be stale)")
    ap.add_argument("--out", help="result JSON (default benchmarks/results/moe_layer_h200.json; smoke "
                                  "benchmarks/results/moe_layer_smoke.json)")
    args = ap.parse_args(argv)
    args.tokens = args.tokens or ([1, 9] if args.smoke else [1, 8, 64, 512, 8192])
    args.reps = args.reps if args.reps is not None else (1 if args.smoke else 20)
    args.out = args.out or os.path.join(HERE, "results", "moe_layer_smoke.json" if args.smoke else "moe_layer_h200.json")
    if args.reps < 1 or any(t < 1 for t in args.tokens):
        ap.error("--reps and --tokens must be at least 1")
    return args


def main(argv=None) -> int:
    try:
        args = parse(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if args.smoke:
        # the kernels run in Triton's interpreter on CPU tensors: the flag is read when triton is imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    from results_io import provenance, write_result
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        print("moe_layer: needs a GPU (none visible); --smoke runs the CPU check")
        return 2
    prov = provenance("benchmarks/moe_layer.py", argv, args.commit)
    if cuda and (not prov["commit"] or "uncommitted" in prov["commit"]):
        print(f"moe_layer: refusing to record a run without a clean commit ({prov['commit']}); commit, or pass "
              "--commit SHA of the tree this copy was made from")
        return 2
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    print(TARGET, flush=True)
    result = {**prov, "target": TARGET, "dtype": str(dtype).replace("torch.", ""), "tokens": args.tokens,
              "timing": "CUDA events, device_ms" if cuda else "host perf_counter (smoke)", "models": {}}
    torch.manual_seed(0)
    with torch.no_grad():
        for key in args.models:
            shape = {**MODELS[key], **(SMOKE[key] if args.smoke else {})}
            if key == "kimi" and args.kimi_groups:
                shape.update(n_group=args.kimi_groups[0], topk_group=args.kimi_groups[1])
            result["models"][key] = run_model(torch, key, shape, args, dtype, device)
    met = [m["target"]["met"] for m in result["models"].values() if "target" in m]
    result["target_met"] = all(met) if met else None
    print(f"{TARGET}: {'met' if result['target_met'] else 'NOT met' if met else 'not measured'} "
          + " ".join(f"{k} x{m['target']['triton_speedup']:.1f}" for k, m in result["models"].items() if "target" in m))
    write_result(args.out, result)
    if os.environ.get("OUT"):
        write_result(os.path.join(os.environ["OUT"], os.path.basename(args.out)), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
