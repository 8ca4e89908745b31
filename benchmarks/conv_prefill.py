"""The prefill's short convolution (model/kernels/conv.py) on the stacks' shapes at 16k tokens: its two kernels'
choices (the tile kernel: tokens per tile, warps, tiles per program; the rows kernel: tokens per program,
widest channel block, warps) side by side with a device copy of the same bytes (what the kernel's traffic,
inputs read once and outputs written once, would take at copy speed), in the same run. Picks conv_kernel's
defaults (its ROWS, BLOCK_T, WARPS, TILES); model_prefill.py's --profile shows the kernel inside the forward.

    python -m benchmarks conv_prefill [--tokens 16384] [--out benchmarks/results/conv_prefill.json]
"""
from __future__ import annotations

import argparse
import sys

from benchmarks.copy_bandwidth import device_ms
from benchmarks.results_io import provenance, write_result

# (arch, parts (q, k, v channels), normalised parts, head dim, in_proj width the conv input is a slice of)
SHAPES = [("kda", [4096, 4096, 4096], 2, 128, 3 * 4096 + 128 + 128 + 32),
          ("gdn", [2048, 2048, 4096], 2, 128, 2 * 2048 + 2 * 4096 + 2 * 32)]
# the tile kernel: (tokens per tile, warps, tiles per program)
TILES = [(64, 8, 1), (32, 4, 1), (16, 4, 4), (64, 8, 2)]
# the rows kernel (each input row read once, the window in registers): (tokens per program, widest channel
# block, warps)
ROWS = [(64, 1024, 4), (128, 1024, 4), (256, 1024, 4), (512, 1024, 8), (128, 512, 4), (256, 512, 2),
        (128, 256, 2), (64, 256, 1), (256, 2048, 8)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--out", default="benchmarks/results/conv_prefill.json")
    p.add_argument("--commit", default=None)
    args = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("conv_prefill: needs a GPU (none visible)")
        return 2
    from trtllm_dasc.model.kernels import conv as conv_kernel
    T = args.tokens
    result = {**provenance("benchmarks/conv_prefill.py", argv, args.commit), "tokens": T,
              "default_tiles": [conv_kernel.BLOCK_T, conv_kernel.WARPS, conv_kernel.TILES],
              "default_rows": conv_kernel.ROWS, "shapes": []}
    for arch, parts, normalized, hd, width in SHAPES:
        C = sum(parts)
        proj = torch.randn(T, width, device="cuda", dtype=torch.bfloat16)
        x = proj[:, :C]
        weight = torch.randn(C, 4, device="cuda", dtype=torch.bfloat16)
        state = torch.randn(1, C, 3, device="cuda", dtype=torch.bfloat16)
        cu = [0, T]
        nbytes = 2 * T * C * 2                        # read once, written once
        src = torch.empty(T * C, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        copy_ms = device_ms(torch, lambda: dst.copy_(src))
        ref = conv_kernel.conv_parts_reference(x, weight, state, cu, parts, normalized, hd)[0]
        entry = {"arch": arch, "parts": parts, "bytes": nbytes, "copy_ms": copy_ms, "tiles": []}
        print(f"{arch}: {T} tokens x {C} channels, copy of the same bytes {copy_ms:.3f} ms", flush=True)
        arms = [("tiles", t) for t in TILES] + [("rows", r) for r in ROWS]
        entry["rows"] = []
        for kind, choice in arms:
            kw = {kind: choice}
            out = conv_kernel.conv_parts(x, weight, state, cu, parts, normalized, hd, **kw)[0]
            err = max((a.float() - b.float()).abs().max().item() for a, b in zip(out, ref))
            ms = device_ms(torch, lambda: conv_kernel.conv_parts(x, weight, state, cu, parts, normalized, hd, **kw))
            entry[kind].append({kind: choice, "ms": ms, "of_copy": copy_ms / ms, "max_abs_err": err})
            print(f"  {kind} {choice}: {ms:.3f} ms ({copy_ms / ms:.0%} of copy speed), max err {err:.1e}", flush=True)
        result["shapes"].append(entry)
        write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
