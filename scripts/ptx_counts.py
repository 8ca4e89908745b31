"""PTX instruction counts of the checkpoint store kernels as compiled for sm90 (no GPU needed): the figures in
docs/performance.md ("Checkpoint store and load per codec": 976 -> 752, 1082 -> 954, 924 -> 892).
    python scripts/ptx_counts.py [REPO]        # REPO: a checkout (default: this one), e.g. a worktree at b437fc4
Compiles the launch shapes tests/model/test_kernels_compile.py lists for gather_units_kernel (INT8) and
store_units_kernel (FP8, INT4), and prints each one's instruction total and a few opcodes."""
import collections
import re
import sys
from pathlib import Path

repo = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
sys.path[:0] = [str(repo), str(repo / "tests" / "model")]
import test_kernels_compile as t  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

for fn, signature, constexprs, warps in t.kernels():
    if fn.__name__ not in ("gather_units_kernel", "store_units_kernel"):
        continue
    sig = {**signature, **{n: "constexpr" for n in constexprs}}
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, ty) in enumerate(sig.items())
             if ty.startswith("*") or n in t.ALIGNED}
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    ops = collections.Counter()
    for line in k.asm["ptx"].splitlines():
        m = re.match(r"\s+(?:@%p\d+\s+)?([a-z][\w.]*)", line)
        if m and not line.strip().startswith("//") and not m.group(1).startswith(("ret", "}")):
            ops[m.group(1).split(".")[0]] += 1
    shown = {k: v for k, v in constexprs.items() if k in ("CODEC", "CONV8", "QUANT")}
    print(fn.__name__, shown, "instructions", sum(ops.values()),
          " ".join(f"{op} {ops[op]}" for op in ("setp", "selp", "fma", "div", "mul")), flush=True)
