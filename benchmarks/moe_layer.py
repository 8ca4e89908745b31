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
timed (--sweep, on by default) so the heuristic in kernel.config can be checked against them: the grouped
GEMMs' tiles at --sweep-tokens (512 8192 16384), the best printed per T; the small path's GEMV tiles
(model/moe/small.py) at --small-sweep-tokens (1 8) in CUDA graphs, against the grouped path. Rows up to
512 (token, slot) pairs also time the small path as an arm (triton_small; triton_grouped where "triton"
took the small path), and the layer's CUDA graph is replayed with each path forced (cuda_graph_by_path):
the figures small.SMALL_PAIRS follows.

    python -m benchmarks moe_layer --commit SHA [--tokens 1 8 64 512 8192] [--models kimi qwen]
        [--sweep-tokens 512 8192 16384] [--small-sweep-tokens 1 8] [--no-sweep]
    python -m benchmarks moe_layer --smoke     # CPU, tiny shapes, Triton's interpreter (tests run it)

Refuses to record a GPU run without a clean commit (pass --commit on a device copy whose .git is stale).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))

TARGET = "target: fused at 64 tokens >= 10x the per-expert loop"
TARGET_TOKENS, TARGET_SPEEDUP = 64, 10.0
MODELS = {
    "kimi": dict(name="Kimi-Linear-48B-A3B", arch="kda", E=256, D=2304, I=1024, top_k=8, shared=1024,
                 n_group=1, topk_group=1, scale=2.446),
    "qwen": dict(name="Qwen3-Next-80B-A3B", arch="gdn", E=512, D=2048, I=512, top_k=10, shared=512),
}
SMOKE = {"kimi": dict(E=8, D=48, I=24, top_k=3, shared=24, n_group=4, topk_group=2),
         "qwen": dict(E=8, D=32, I=16, top_k=3, shared=16)}
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) of the grouped path's sweep: the first four as measured at
# 710e101, then Hopper-sized candidates (wider N, deeper K, 4-stage pipelines; 228 KB of shared memory a
# block: a candidate that does not fit is recorded as such). gate_up holds two accumulators (gate and up),
# so its widest tiles are the down GEMM's; the "+dN" entries give the down GEMM a 128x256x64 tile of its own.
SWEEP = [(16, 64, 128, 4, 3), (32, 64, 64, 4, 3), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3),
         (128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 128, 8, 3), (64, 256, 64, 8, 3),
         (128, 128, 64, 8, 4), (64, 128, 128, 8, 3), (128, 64, 64, 4, 3), (256, 128, 64, 8, 3)]
SWEEP_DOWN = {(128, 128, 64, 8, 3): (256, 64, 8, 3), (64, 128, 64, 8, 3): (256, 64, 8, 3)}
# the small path's (GEMV) sweep at decode sizes, one kernel varied at a time around small.config's default:
# (BLOCK_N, BLOCK_K, warps)
SMALL_SWEEP = {"gate_up": [(2, 1024, 4), (4, 512, 4), (8, 256, 4), (4, 256, 2), (8, 512, 8), (16, 128, 4)],
               "down": [(1, 1024, 4), (2, 1024, 4), (4, 512, 4), (4, 1024, 8), (8, 256, 4)]}
# the small path is timed beside the grouped one up to this many (token, slot) pairs
SMALL_ARM_PAIRS = 512


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
        from benchmarks.copy_bandwidth import device_ms
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


def graph_ms(torch, fn, ms) -> float:
    """Device time of fn() replayed from a CUDA graph (decode sizes: no launch gaps of the host's)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return ms(graph.replay)


def _try(fn):
    """fn()'s figure, or the first line of why it failed (a tile that needs more shared memory than a block
    has, registers): a sweep candidate, not the run, fails."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001  (triton's OutOfResources and CompilationError alike)
        return f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def tile_sweep(torch, layer, shape, T, ms, smoke: bool, device, dtype, g) -> dict:
    """The grouped path's experts alone at T tokens, per candidate tile (SWEEP), the default's figure and
    the best."""
    from trtllm_dasc.model.moe import kernel
    x = torch.randn(T, shape["D"], generator=g, device=device, dtype=torch.float32).to(dtype)
    wts, idx = layer.route(x)
    out, default = {}, kernel.config(T, shape["top_k"], shape["E"])
    for bm, bn, bk, nw, ns in SWEEP[:1] if smoke else SWEEP:
        cands = [(f"{bm}x{bn}x{bk}w{nw}s{ns}", dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns))]
        if (bm, bn, bk, nw, ns) in SWEEP_DOWN and not smoke:
            dn, dk, dw, ds = SWEEP_DOWN[(bm, bn, bk, nw, ns)]
            cands.append((f"{cands[0][0]}+d{dn}x{dk}w{dw}s{ds}", {**cands[0][1], "down": dict(
                BLOCK_N=dn, BLOCK_K=dk, num_warps=dw, num_stages=ds)}))
        for name, cfg in cands:
            out[name] = _try(lambda: ms(lambda: kernel.experts_triton(x, idx, wts, layer.w["gate_up"],
                                                                       layer.w["down"], dict(cfg))))
    timed = {k: v for k, v in out.items() if isinstance(v, float)}
    best = min(timed, key=timed.get) if timed else None
    key = "{BLOCK_M}x{BLOCK_N}x{BLOCK_K}w{num_warps}s{num_stages}".format(**default)
    return {"tokens": T, "default": key, "default_ms": out.get(key), "ms_by_tiles": out, "best": best,
            "best_ms": timed.get(best)}


def small_sweep(torch, layer, shape, T, ms, device, dtype, g) -> dict:
    """The small path's experts alone at T tokens in a CUDA graph, per tile of one kernel (SMALL_SWEEP, the
    other at its default), against the grouped path's at its default tiles."""
    from trtllm_dasc.model.moe import kernel, small
    x = torch.randn(T, shape["D"], generator=g, device=device, dtype=torch.float32).to(dtype)
    wts, idx = layer.route(x)
    gu, dn = layer.w["gate_up"], layer.w["down"]
    default = small.config(T, shape["top_k"], shape["I"], shape["D"])
    res = {"tokens": T, "default": {k: list(v) for k, v in default.items()},
           "grouped_ms": _try(lambda: graph_ms(torch, lambda: kernel.experts_triton(x, idx, wts, gu, dn), ms)),
           "small_ms": _try(lambda: graph_ms(torch, lambda: small.experts_small(x, idx, wts, gu, dn), ms))}
    for part, cands in SMALL_SWEEP.items():
        by = {}
        for bn, bk, nw in cands:
            cfg = {**default, part: (bn, bk, nw)}
            by[f"{bn}x{bk}w{nw}"] = _try(lambda: graph_ms(
                torch, lambda: small.experts_small(x, idx, wts, gu, dn, cfg), ms))
        timed = {k: v for k, v in by.items() if isinstance(v, float)}
        res[f"{part}_ms_by_tiles"] = by
        res[f"{part}_best"] = min(timed, key=timed.get) if timed else None
    return res


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
    from trtllm_dasc.model.moe import small
    arms = ["loop", "triton"] + (["grouped_mm"] if grouped_mm.available(device, dtype) else [])
    rows, out = [], {"shape": {k: v for k, v in shape.items() if k != "name"}, "model": shape["name"], "arms": arms,
                     "small_pairs": small.SMALL_PAIRS,
                     "extra_arms": {"triton_small": f"small.py's GEMVs at any T, timed while T * top_k <= "
                                                    f"{SMALL_ARM_PAIRS}",
                                    "triton_grouped": "kernel.py's grouped GEMMs at any T, timed where "
                                                      "'triton' took the small path"}}
    g = torch.Generator(device=device).manual_seed(1)
    sweeps = {}
    for T in args.tokens:
        x = torch.randn(T, shape["D"], generator=g, device=device, dtype=torch.float32).to(dtype)
        ms = timer(torch, cuda, args.reps if T < 4096 else max(2, args.reps // 4))
        res, ref = {"tokens": T}, None
        pairs = T * shape["top_k"]
        res["triton_path"] = "small" if pairs <= small.SMALL_PAIRS else "grouped"
        extra = ((["triton_small"] if pairs <= SMALL_ARM_PAIRS else [])
                 + (["triton_grouped"] if res["triton_path"] == "small" else []))
        if args.smoke:
            # the interpreter's seconds: not the arm "triton" already ran
            extra = [a for a in extra if a != f"triton_{res['triton_path']}"]
        for arm in arms + extra:
            layer.backend = arm
            y = layer.forward(x, fused)
            if ref is None:
                ref = y
            else:
                res[f"{arm}_rel_err"] = rel_err(torch, ref, y)
            res[f"{arm}_ms"] = ms(lambda: layer.forward(x, fused))
            if cuda and arm != "loop":
                res[f"{arm}_syncs"] = syncs(torch, lambda: layer.forward(x, fused))
        for arm in arms[1:] + extra:
            res[f"{arm}_speedup"] = res["loop_ms"] / res[f"{arm}_ms"]
        if args.sweep:
            layer.backend = "loop"
            res["triton_default_tiles"] = kernel.config(T, shape["top_k"], shape["E"])
            if T in args.sweep_tokens:
                sweeps[T] = tile_sweep(torch, layer, shape, T, ms, args.smoke, device, dtype, g)
                res["triton_experts_only_ms_by_tiles"] = sweeps[T]["ms_by_tiles"]
        rows.append(res)
        print(f"{key:5s} T={T:5d} " + "  ".join(f"{a} {res[a + '_ms']:8.3f} ms" for a in arms + extra)
              + "  " + "  ".join(f"{a} x{res[a + '_speedup']:.1f}" for a in arms[1:] + extra), flush=True)
    out["rows"] = rows
    if args.sweep:
        layer.backend = "loop"
        ms = timer(torch, cuda, max(2, args.reps // 4))
        for T in args.sweep_tokens:
            if T not in sweeps:
                sweeps[T] = tile_sweep(torch, layer, shape, T, ms, args.smoke, device, dtype, g)
        out["tile_sweep"] = [sweeps[T] for T in args.sweep_tokens]
        for r in out["tile_sweep"]:
            print(f"{key:5s} tiles T={r['tokens']:5d}: best {r['best']} {r['best_ms']} ms, default {r['default']} "
                  f"{r['default_ms']} ms", flush=True)
        if cuda:
            ms = timer(torch, True, args.reps)
            out["small_sweep"] = [small_sweep(torch, layer, shape, T, ms, device, dtype, g)
                                  for T in args.small_sweep_tokens]
            for r in out["small_sweep"]:
                print(f"{key:5s} small T={r['tokens']}: experts in a graph, small {r['small_ms']} ms, grouped "
                      f"{r['grouped_ms']} ms; best gate_up {r['gate_up_best']} down {r['down_best']} (default "
                      f"{r['default']})", flush=True)
    if cuda:
        layer.backend = "triton"
        ms = timer(torch, True, args.reps)
        out["cuda_graph"], out["cuda_graph_by_path"] = [], {"small": [], "grouped": []}
        for T in (1, 8, 64):
            x = torch.randn(T, shape["D"], generator=g, device=device, dtype=torch.float32).to(dtype)
            layer.backend = "triton"
            out["cuda_graph"].append(graph_check(torch, layer, x, fused, ms))
            print(f"{key:5s} graph T={T}: {out['cuda_graph'][-1]}", flush=True)
            # the whole layer replayed with each path forced: the decode figure the threshold follows
            for path in ("small", "grouped"):
                layer.backend = f"triton_{path}"
                out["cuda_graph_by_path"][path].append(graph_check(torch, layer, x, fused, ms))
            print(f"{key:5s} graph T={T} replay ms: " + "  ".join(
                f"{p} {v[-1]['replay_ms']:.4f}" for p, v in out["cuda_graph_by_path"].items()), flush=True)
        layer.backend = "triton"
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
    ap.add_argument("--no-sweep", dest="sweep", action="store_false", help="skip the Triton tile sweeps")
    ap.add_argument("--sweep-tokens", type=int, nargs="+",
                    help="token counts of the grouped path's tile sweep (default 512 8192 16384; smoke 9)")
    ap.add_argument("--small-sweep-tokens", type=int, nargs="+",
                    help="token counts of the small path's tile sweep, in CUDA graphs (default 1 8)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, fp32, Triton's interpreter")
    ap.add_argument("--commit", default=None, help="commit to record (a device copy's .git may be stale)")
    ap.add_argument("--out", help="result JSON (default benchmarks/results/moe_layer_h200.json; smoke "
                                  "benchmarks/results/moe_layer_smoke.json)")
    args = ap.parse_args(argv)
    args.tokens = args.tokens or ([1, 9] if args.smoke else [1, 8, 64, 512, 8192])
    args.reps = args.reps if args.reps is not None else (1 if args.smoke else 20)
    args.sweep_tokens = args.sweep_tokens or ([9] if args.smoke else [512, 8192, 16384])
    args.small_sweep_tokens = args.small_sweep_tokens or [1, 8]
    args.out = args.out or os.path.join(HERE, "results", "moe_layer_smoke.json" if args.smoke else "moe_layer_h200.json")
    if args.reps < 1 or any(t < 1 for t in args.tokens + args.sweep_tokens + args.small_sweep_tokens):
        ap.error("--reps and the token counts must be at least 1")
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
    from benchmarks.results_io import provenance, write_result
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
    from trtllm_dasc.model.moe import small
    small_config = small.config
    if args.smoke:
        # the interpreter runs one program after another: the GPU's many 2- and 4-channel GEMV programs
        # would take minutes there (tests/model/test_moe.py runs the default tiles)
        small.config = lambda T, k, inter, D: {"gate_up": (32, 64, 4), "down": (64, 32, 4)}
    try:
        with torch.no_grad():
            for key in args.models:
                shape = {**MODELS[key], **(SMOKE[key] if args.smoke else {})}
                if key == "kimi" and args.kimi_groups:
                    shape.update(n_group=args.kimi_groups[0], topk_group=args.kimi_groups[1])
                result["models"][key] = run_model(torch, key, shape, args, dtype, device)
    finally:
        small.config = small_config
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
