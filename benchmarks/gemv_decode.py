"""The decode step's GEMMs at batch 1 (and 2, 4): cuBLAS (F.linear) against our few-row kernel
(model/kernels/gemv.py) on every weight shape of the Kimi-Linear-shaped stack, in the same run, as TB/s of
weight bytes against the measured copy bandwidth, and the step's GEMM total (each shape's count per step x
its time), and as ops.linear picks (gemv_kernel.preferred). --sweep also times (BN, BK, warps) choices at
batch 1, to pick gemv_kernel.config's defaults.

Timing: one CUDA graph of many calls (a decode step is a graph), cycling through enough copies of the
weight that they do not fit in L2 (a step reads each weight once, from HBM), device time by CUDA events.

    python -m benchmarks gemv_decode [--out benchmarks/results/gemv_decode.json] [--sweep] [--rows 1,2,4]
"""
from __future__ import annotations

import argparse
import sys

from benchmarks.copy_bandwidth import device_ms
from benchmarks.results_io import provenance, write_result

# (name, N, K, count per step) of the Kimi-Linear-shaped stack (benchmarks/shaped_model.py: 20 KDA layers of
# 32 heads x 128, 7 MLA layers, hidden 2304, dense MLP 9216, vocabulary 32000)
KIMI_SHAPES = [
    ("mlp.gate_up", 18432, 2304, 27), ("mlp.down", 2304, 9216, 27),
    ("kda.in_proj", 3 * 4096 + 128 + 128 + 32, 2304, 20), ("kda.f_b", 4096, 128, 20), ("kda.g_b", 4096, 128, 20),
    ("kda.o", 2304, 4096, 20), ("mla.q_proj", 32 * 192, 2304, 7), ("mla.kv_a", 576, 2304, 7),
    ("mla.o_proj", 2304, 4096, 7), ("lm_head", 32000, 2304, 1),
]
SWEEP = [(bn, bk, w) for bn in (2, 4, 8, 16) for bk in (128, 256, 512, 1024) for w in (2, 4, 8)
         if bn * bk // (32 * w) <= 64]
L2_FLUSH_BYTES = 256 << 20    # copies of a weight to cycle through: four times the H200's L2


def time_calls(torch, fn, copies: int, calls: int = 60, replays: int = 5) -> float:
    """Seconds per call of fn(i) (i cycles through the copies), inside one captured graph of `calls` calls."""
    for i in range(copies):                      # compile / autotune / allocate outside the capture
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in range(calls):
            fn(c % copies)
    return device_ms(torch, graph.replay, replays) / 1e3 / calls


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/gemv_decode.json")
    p.add_argument("--rows", default="1,2,4", help="batch sizes (rows of x), each at most gemv_kernel.MAX_ROWS")
    p.add_argument("--sweep", action="store_true", help="also time every (BN, BK, warps) at batch 1")
    p.add_argument("--commit", default=None)
    args = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("gemv_decode: needs a GPU (none visible)")
        return 2
    from benchmarks.copy_bandwidth import copy_bandwidth

    from trtllm_dasc.model.kernels import gemv as gemv_kernel
    rows = [int(r) for r in args.rows.split(",")]
    if any(not 0 < r <= gemv_kernel.MAX_ROWS for r in rows):
        p.error(f"--rows: each in 1..{gemv_kernel.MAX_ROWS}")
    bandwidth = copy_bandwidth("cuda", 1 << 30)
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    result = {**provenance("benchmarks/gemv_decode.py", argv, args.commit), "torch": torch.__version__,
              "copy_bandwidth_Bps": bandwidth, "shapes": [], "step": {}}
    F = torch.nn.functional
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, N, K, count in KIMI_SHAPES:
        nbytes = N * K * 2
        copies = max(2, -(-L2_FLUSH_BYTES // nbytes))
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02 for _ in range(copies)]
        entry = {"name": name, "N": N, "K": K, "count_per_step": count, "weight_bytes": nbytes, "rows": {}}
        for M in rows:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
            err = (gemv_kernel.gemv(x, ws[0]).float() - gemv_kernel.gemv_reference(x, ws[0]).float()).abs().max()
            t_blas = time_calls(torch, lambda i: F.linear(x, ws[i]), copies)
            t_ours = time_calls(torch, lambda i: gemv_kernel.gemv(x, ws[i]), copies)
            cfg = gemv_kernel.config(M, N, K)
            entry["rows"][M] = {"cublas_us": t_blas * 1e6, "gemv_us": t_ours * 1e6, "gemv_config": cfg,
                                "linear_takes_gemv": gemv_kernel.preferred(M, N, K),
                                "cublas_fraction": nbytes / t_blas / bandwidth,
                                "gemv_fraction": nbytes / t_ours / bandwidth, "max_abs_err": err.item()}
            print(f"{name:<12} M={M} N={N:>6} K={K:>5}: cuBLAS {t_blas * 1e6:7.2f} us "
                  f"({nbytes / t_blas / bandwidth:5.1%}), ours {t_ours * 1e6:7.2f} us "
                  f"({nbytes / t_ours / bandwidth:5.1%}) {cfg}, max err {err.item():.2e}", flush=True)
        if args.sweep:
            x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16, generator=gen)
            sweep = []
            for cfg in SWEEP:
                t = time_calls(torch, lambda i: gemv_kernel.gemv(x, ws[i], cfg), copies, calls=30, replays=3)
                sweep.append({"config": cfg, "us": t * 1e6, "fraction": nbytes / t / bandwidth})
            sweep.sort(key=lambda s: s["us"])
            entry["sweep_batch1"] = sweep
            print("   best at batch 1: " + ", ".join(f"{s['config']} {s['us']:.2f} us ({s['fraction']:.1%})"
                                                    for s in sweep[:4]), flush=True)
        result["shapes"].append(entry)
        ws = None         # free the copies before the next shape
        torch.cuda.empty_cache()
        write_result(args.out, result)
    for M in rows:
        blas = sum(s["count_per_step"] * s["rows"][M]["cublas_us"] for s in result["shapes"])
        ours = sum(s["count_per_step"] * s["rows"][M]["gemv_us"] for s in result["shapes"])
        total = sum(s["count_per_step"] * s["weight_bytes"] for s in result["shapes"])
        chosen = sum(s["count_per_step"] * s["rows"][M]["gemv_us" if s["rows"][M]["linear_takes_gemv"] else
                                                       "cublas_us"] for s in result["shapes"])
        result["step"][M] = {"cublas_ms": blas / 1e3, "gemv_ms": ours / 1e3, "ops_linear_ms": chosen / 1e3,
                             "weight_bytes": total, "bound_ms": total / bandwidth * 1e3}
        print(f"step GEMMs at batch {M}: cuBLAS {blas / 1e3:.3f} ms, ours {ours / 1e3:.3f} ms, "
              f"as ops.linear picks {chosen / 1e3:.3f} ms, "
              f"bound {total / bandwidth * 1e3:.3f} ms ({total / 1e9:.2f} GB)")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
