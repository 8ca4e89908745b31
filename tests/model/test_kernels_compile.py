"""Our Triton kernels compiled for the H200 (sm_90) on any machine: Triton's interpreter, which runs them
on the CPU in the other tests, does not type-check them, so a kernel it runs may not compile (a variable
that changes shape inside a branch passed the interpreter and failed on the GPU). The compiler runs in a
child process: TRITON_INTERPRET (tests/conftest.py) patches triton.language in this one."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


def _ints(*names):
    return {n: "i32" for n in names}


def kernels() -> list[tuple]:
    """(kernel, signature, constexprs) of every launch shape the model uses."""
    from trtllm_dasc.model import conv_kernel, swiglu_kernel
    out = []
    for dt in ("*bf16", "*fp32"):
        out.append((conv_kernel._conv_parts_kernel,
                    {"x": dt, "weight": dt, "state": dt, "out": dt, "new_state": dt, "chunks": "*i32", "cu": "*i64",
                     **_ints("stride_x", "stride_sn", "stride_sc", "T_total", "C", "S1", "S2", "NORM_C"),
                     "eps": "fp32"},
                    {"W": 4, "BT": conv_kernel.BLOCK_T, "BD": 128}))
        out.append((conv_kernel._conv_decode_kernel,
                    {"x": dt, "weight": dt, "states": "*fp32", "rows": "*i64", "out": dt,
                     **_ints("stride_x", "stride_sr", "stride_sc", "C", "S1", "S2")}, {"W": 4, "BD": 128}))
    for block_t, block_i in ((8, 1024), (1, 256)):          # prefill and decode tiles
        out.append((swiglu_kernel._swiglu_kernel,
                    {"gate": "*bf16", "up": "*bf16", "out": "*bf16",
                     **_ints("T", "I", "stride_g", "stride_u", "stride_o")},
                    {"BLOCK_T": block_t, "BLOCK_I": block_i}))
    return out


def compile_all() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    for fn, signature, constexprs in kernels():
        sig = {**signature, **{name: "constexpr" for name in constexprs}}
        triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32))
        print("compiled", fn.__name__, constexprs)


def test_our_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", "import test_kernels_compile as t; t.compile_all()"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("compiled") == len(kernels())
