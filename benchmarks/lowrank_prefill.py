"""KDA's two low-rank gate up-projections over a prefill (model/lowrank_kernel.py): cuBLAS (two F.linear
calls, the path before) against the kernel's tile choices (rows, columns per program, warps) and a device
copy of the output bytes (what writing the products at copy speed would take), in the same run, on the
Kimi-Linear shape (K = 128, N = 32 heads x 128) at 4k and 16k tokens. Picks lowrank_kernel's defaults.

    python benchmarks/lowrank_prefill.py [--tokens 4096 16384] [--out benchmarks/results/lowrank_prefill.json]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conv_prefill import device_ms  # noqa: E402
from results_io import provenance, write_result  # noqa: E402

K, N, WIDTH = 128, 4096, 3 * 4096 + 128 + 128 + 32     # the input projection's output the inputs are a slice of
TILES = [(128, 128, 4), (64, 128, 4), (128, 256, 8), (256, 128, 8), (128, 64, 4)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--out", default="benchmarks/results/lowrank_prefill.json")
    p.add_argument("--commit", default=None)
    args = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("lowrank_prefill: needs a GPU (none visible)")
        return 2
    from trtllm_dasc.model import lowrank_kernel
    F = torch.nn.functional
    result = {**provenance("benchmarks/lowrank_prefill.py", argv, args.commit), "K": K, "N": N,
              "default_tiles": [lowrank_kernel.BLOCK_M, lowrank_kernel.BLOCK_N, lowrank_kernel.WARPS], "rows": []}
    for T in args.tokens:
        proj = torch.randn(T, WIDTH, device="cuda", dtype=torch.bfloat16)
        x = proj[:, 3 * N:3 * N + 2 * K]
        w = torch.randn(2 * N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        f_b, g_b = w.chunk(2)
        out_bytes = 2 * T * N * 2
        src = torch.empty(out_bytes // 2, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        row = {"tokens": T, "output_bytes": out_bytes, "copy_ms": device_ms(torch, lambda: dst.copy_(src)),
               "cublas_ms": device_ms(torch, lambda: (F.linear(x[:, :K], f_b), F.linear(x[:, K:], g_b))),
               "tiles": []}
        ref = (F.linear(x[:, :K], f_b), F.linear(x[:, K:], g_b))
        print(f"T={T}: copy of the output bytes {row['copy_ms']:.3f} ms (read + write), cuBLAS two products "
              f"{row['cublas_ms']:.3f} ms", flush=True)
        for tiles in TILES:
            got = lowrank_kernel.up_pair(x, w, tiles)
            err = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, ref))
            ms = device_ms(torch, lambda: lowrank_kernel.up_pair(x, w, tiles))
            row["tiles"].append({"tiles": tiles, "ms": ms, "over_cublas": row["cublas_ms"] / ms, "max_abs_err": err})
            print(f"  tiles {tiles}: {ms:.3f} ms ({row['cublas_ms'] / ms:.2f}x cuBLAS), max err vs cuBLAS {err:.1e}",
                  flush=True)
        result["rows"].append(row)
        write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
