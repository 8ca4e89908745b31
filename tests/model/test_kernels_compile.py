"""Our Triton kernels compiled for the H200 (sm_90) on any machine: Triton's interpreter, which runs them on
the CPU in the other tests, does not type-check them, so a kernel it runs may not compile (a variable that
changes shape inside a branch passed the interpreter and failed on the GPU). And ptxas must place them in
registers without spilling: the one-kernel prefill conv of 9198d82 took 255 registers and spilled 1.4 KB per
thread (0.66 ms per KDA layer at 16k tokens on the H200, model_prefill_kda_h200x2_9198d82.json). Pointers
and the int arguments the launches pass as multiples of 16 are compiled as such (Triton specialises a launch
that way), or the vector loads and the register counts would not be the real ones; token counts and the
state's batch stride come both ways (Triton compiles a variant per call). The compiler runs in a child
process: TRITON_INTERPRET (tests/conftest.py) patches triton.language in this one."""
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
    """(kernel, signature, constexprs, num_warps) of every launch shape the model uses."""
    import triton

    from trtllm_dasc.model.kernels import conv as conv_kernel, decode_attention
    from trtllm_dasc.model.kernels import gemv as gemv_kernel, swiglu as swiglu_kernel
    out = []
    for dt in ("*bf16", "*fp32"):
        out.append((conv_kernel._conv_parts_kernel,
                    {"x": dt, "weight": dt, "out": dt, "chunks": "*i32", "cu": "*i64",
                     **_ints("stride_x", "T_total", "C", "S1", "S2", "NORM_C"), "eps": "fp32", "NT": "i32"},
                    {"W": 4, "BT": conv_kernel.BLOCK_T, "BD": 128, "G": conv_kernel.TILES}, conv_kernel.WARPS))
        per_program, widest, warps = conv_kernel.ROWS            # the rows kernel's default block
        out.append((conv_kernel._conv_rows_kernel,
                    {"x": dt, "weight": dt, "out": dt, "ranges": "*i32",
                     **_ints("stride_x", "T_total", "C", "S1", "S2", "NORM_C"), "eps": "fp32"},
                    {"BC": conv_kernel.rows_block([4096] * 3, 128, widest), "HD": 128}, warps))
        out.append((conv_kernel._conv_head_kernel,
                    {"x": dt, "weight": dt, "state": dt, "out": dt, "new_state": dt, "cu": "*i64",
                     **_ints("stride_x", "stride_sn", "stride_sc", "T_total", "C", "S1", "S2", "NORM_C"),
                     "eps": "fp32"},
                    {"W": 4, "BW": 4, "BD": 128}, 4))
        out.append((conv_kernel._conv_decode_kernel,
                    {"x": dt, "weight": dt, "states": "*fp32", "rows": "*i64", "out": dt,
                     **_ints("stride_x", "stride_sr", "stride_sc", "C", "S1", "S2")}, {"W": 4, "BD": 128}, 1))
    from trtllm_dasc.state import kernels as state_kernels
    # the conv part every checkpoint store / load runs in its own launch (kernels._conv_part): copied in bf16,
    # or the 8-bit encode (store) / decode (load)
    conv_copy = {"conv_src": "*bf16", "conv_dst": "*bf16",
                 **_ints("conv_cw", "stride_csrc_b", "stride_csrc_l", "stride_cdst_b", "stride_cdst_l"),
                 "conv_scale": "*fp32", "conv_row4": "i32"}
    conv8_store = {**conv_copy, "conv_dst": "*i8"}
    conv8_load = {**conv_copy, "conv_src": "*i8"}
    copy_c = {"CONV_BLOCK": 4096, "TO_BF16": False, "CONV8": 0}
    # the encode as a GPU runs it on bf16 conv state: the fma quotient (CONV8 3, conv8_ops.fast_div)
    enc_c, dec_c = {"CONV_BLOCK": 2048, "TO_BF16": False, "CONV8": 3}, {"CONV_BLOCK": 2048, "TO_BF16": True, "CONV8": 2}
    # the checkpoint store's INT8 path with the fma quotient (QUANT 2: the interpreter never runs it)
    gather = {"src": "*fp32", "dst": "*i8", "dst_scale": "*fp32", "src_idx": "*i64", "dst_idx": "*i64",
              "unit_layer": "*i64", "unit_src": "*i64", "unit_dst": "*i64",
              **_ints("n_rows", "stride_src_l", "stride_src_n", "stride_dst_b", "stride_dst_l", "stride_scale_b")}
    for conv, cc in ((conv_copy, copy_c), (conv8_store, enc_c)):
        out.append((state_kernels.gather_units_kernel, {**gather, **conv},
                    {"R": 1, "V": 128, "BLOCK_R": 32, "BLOCK_V": 128, "QUANT": 2, **cc}, 4))
    out.append((state_kernels.quantize_kernel, {"x": "*fp32", "q": "*i8", "s": "*fp32", "n_rows": "i32"},
                {"V": 128, "BLOCK_R": 32, "BLOCK_V": 128, "FAST_DIV": True}, 4))
    # the checkpoint load (INT8, listed units, conv fused) and the FP8 / INT4 / conv8 codecs: every caller
    # of state.ragged_index's row arithmetic
    idx = {"src_idx": "*i64", "dst_idx": "*i64"}
    units = {"unit_layer": "*i64", "unit_pos": "*i64", "unit_local": "*i64"}
    scatter = {"src": "*i8", "src_scale": "*fp32", "dst": "*fp32", **idx, **units,
               **_ints("n_rows", "stride_src_b", "stride_scale_b", "stride_dst_l", "stride_dst_n")}
    for conv, cc in ((conv_copy, copy_c), (conv8_load, dec_c)):
        out.append((state_kernels.scatter_units_kernel, {**scatter, **conv},
                    {"R": 1, "V": 128, "BLOCK_R": 16, "BLOCK_V": 128, "DEQUANT": True, **cc}, 4))
    from trtllm_dasc.state import codec_kernels, conv8_kernels
    for codec, vb in ((1, 128), (2, 64)):                                  # fp8, int4 at V = 128
        # codec_ops._blocks: 2048 values a tile (int4's 64 bytes a row are 128 values)
        shape = {"R": 1, "V": 128, "VB": vb, "BLOCK_R": 2048 // 128, "BLOCK_B": vb, "CODEC": codec}
        for (cs, cl), cc in (((conv_copy, conv_copy), (copy_c, copy_c)), ((conv8_store, conv8_load), (enc_c, dec_c))):
            out.append((codec_kernels.store_units_kernel,
                        {"src": "*fp32", "dst": "*u8", "dst_scale": "*fp32", **idx, "unit_layer": "*i64",
                         "unit_src": "*i64", "unit_dst": "*i64",
                         **_ints("n_rows", "stride_src_l", "stride_src_n", "stride_dst_b", "stride_scale_b"), **cs},
                        {**shape, **cc[0], "FAST_DIV": True}, 4))     # codec_ops._fast_div on a GPU
            out.append((codec_kernels.load_units_kernel,
                        {"src": "*u8", "src_scale": "*fp32", "dst": "*fp32", **idx, **units,
                         **_ints("n_rows", "stride_src_b", "stride_scale_b", "stride_dst_l", "stride_dst_n"), **cl},
                        {**shape, **cc[1]}, 4))
    out.append((conv8_kernels.conv8_encode_kernel,
                {"src": "*bf16", "dst": "*i8", "dst_scale": "*fp32", "rows": "*i64", "slots": "*i64",
                 **_ints("n", "stride_src_l", "stride_src_n", "stride_dst_b", "stride_dst_l")},
                {"ROW4": 4097, "BLOCK": 2048, "FAST_DIV": True}, 4))
    out.append((conv8_kernels.conv8_decode_kernel,
                {"src": "*i8", "src_scale": "*fp32", "dst": "*bf16", "slots": "*i64", "rows": "*i64",
                 **_ints("n", "stride_src_b", "stride_src_l", "stride_dst_l", "stride_dst_n")},
                {"ROW4": 4097, "BLOCK": 2048, "TO_BF16": True}, 4))
    for block_t, block_i, warps in ((8, 1024, 8), (1, 256, 2)):          # prefill and decode tiles
        out.append((swiglu_kernel._swiglu_kernel,
                    {"gate": "*bf16", "up": "*bf16", "out": "*bf16",
                     **_ints("T", "I", "stride_g", "stride_u", "stride_o")},
                    {"BLOCK_T": block_t, "BLOCK_I": block_i}, warps))
    for block_s, block_d in ((64, 128), (512, 16)):                     # MLA at batch 1; GQA's most splits
        out.append((decode_attention._combine_kernel,
                    {"o_part": "*fp32", "ml_part": "*fp32", "out": "*bf16", **_ints("SPLITS", "DV")},
                    {"BLOCK_S": block_s, "BLOCK_D": block_d}, 4))
    out.append((decode_attention._latent_write_kernel,
                {"ckv": "*bf16", "weight": "*bf16", "pool": "*bf16", "rows": "*i64",
                 **_ints("stride_c", "stride_p"), "eps": "fp32"}, {"LORA": 512, "ROPE": 64, "BL": 512, "BR": 64}, 4))
    for M in range(1, gemv_kernel.MAX_ROWS + 1):                        # the decode shapes' configs
        for N, K in ((18432, 2304), (2304, 9216), (4096, 128)):
            bn, bk, warps = gemv_kernel.config(M, N, K)
            out.append((gemv_kernel._gemv_kernel,
                        {"x": "*bf16", "w": "*bf16", "y": "*bf16", **_ints("stride_xm", "stride_ym", "N", "K")},
                        {"M": M, "MP": triton.next_power_of_2(M), "BN": bn, "BK": bk, "GROUP_N": 0}, warps))
    # Kimi's router (bf16 x, fp32 weight and logits) and its f_b / g_b pair (two groups) at batch 1
    for (N, K), types, group_n in (((256, 2304), ("*bf16", "*fp32", "*fp32"), 0),
                                   ((8192, 128), ("*bf16", "*bf16", "*bf16"), 4096)):
        bn, bk, warps = gemv_kernel.config(1, N // (2 if group_n else 1), K)
        out.append((gemv_kernel._gemv_kernel, {**dict(zip(("x", "w", "y"), types)),
                                               **_ints("stride_xm", "stride_ym", "N", "K")},
                    {"M": 1, "MP": 1, "BN": bn, "BK": bk, "GROUP_N": group_n}, warps))
    # the widest of the candidates the autotuner times at batch 1 (kernels/tuning.py): registers, not spills
    for bn, warps in ((8, 4), (4, 8)):
        out.append((gemv_kernel._gemv_kernel,
                    {"x": "*bf16", "w": "*bf16", "y": "*bf16", **_ints("stride_xm", "stride_ym", "N", "K")},
                    {"M": 1, "MP": 1, "BN": bn, "BK": 1024, "GROUP_N": 0}, warps))
    from trtllm_dasc.model.moe import kernel as moe_kernel
    from trtllm_dasc.model.moe import small as moe_small
    out.append((moe_small._pair_gate_up,
                {"x": "*bf16", "idx": "*i64", "w": "*bf16", "h": "*bf16",
                 **_ints("I", "D", "stride_x", "stride_we", "stride_wn", "stride_h", "R")},
                {"TOP_K": 9, "BLOCK_N": 4, "BLOCK_K": 1024}, 4))
    for T, k, E, inter, D in ((1, 8, 256, 1024, 2304), (6, 10, 512, 512, 2048)):   # Kimi's, Qwen's decode
        cfg = moe_small.config(T, k, inter, D)
        out.append((moe_small._pair_gate_up,
                    {"x": "*bf16", "idx": "*i64", "w": "*bf16", "h": "*bf16",
                     **_ints("I", "D", "stride_x", "stride_we", "stride_wn", "stride_h", "R")},
                    {"TOP_K": k, "BLOCK_N": cfg["gate_up"][0], "BLOCK_K": cfg["gate_up"][1]}, cfg["gate_up"][2]))
        out.append((moe_small._token_down,
                    {"h": "*bf16", "idx": "*i64", "topk_w": "*fp32", "w": "*bf16", "y": "*bf16",
                     **_ints("D", "I", "stride_h", "stride_we", "stride_wn", "stride_y")},
                    {"TOP_K": k, "BLOCK_N": cfg["down"][0], "BLOCK_K": cfg["down"][1]}, cfg["down"][2]))
    for T in (1, 2048, 3072, 16384):                                     # the grouped path's 4 tiers (Kimi)
        cfg = moe_kernel.config(T, 8, 256)
        ints = {"sorted_ids": "*i32", "block_expert": "*i32", "num_post": "*i32"}
        const = {"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_K": cfg["BLOCK_K"]}
        out.append((moe_kernel._gate_up_act,
                    {"x": "*bf16", "w": "*bf16", "h": "*bf16", **ints,
                     **_ints("N", "I", "D", "stride_x", "stride_we", "stride_wn", "stride_h")},
                    {**const, "TOP_K": 8}, cfg["num_warps"]))
        out.append((moe_kernel._down_weighted,
                    {"h": "*bf16", "w": "*bf16", "y": "*bf16", "topk_w": "*fp32", **ints,
                     **_ints("N", "D", "I", "stride_h", "stride_we", "stride_wn", "stride_y")},
                    const, cfg["num_warps"]))
    return out


# what the launches pass as multiples of 16 (pointers, row strides, channel counts), and what may be or not
# (token counts, the conv state's batch stride C x (W-1)); the state's channel stride W-1 never is
ALIGNED = {"stride_x", "stride_g", "stride_u", "stride_o", "stride_sr", "C", "S1", "S2", "NORM_C", "I", "K",
           "stride_xm", "stride_ym", "N", "DV", "stride_c", "stride_p", "D", "stride_we", "stride_wn", "stride_h",
           "stride_y",
           # the checkpoint kernels' row and slot strides (multiples of V = 128 values, or of the units' bytes)
           "stride_src_l", "stride_src_n", "stride_src_b", "stride_dst_b", "stride_dst_l", "stride_dst_n",
           "stride_csrc_b", "stride_csrc_l", "stride_cdst_b", "stride_cdst_l"}
SOMETIMES = {"T_total", "T", "stride_sn", "NT", "SPLITS", "conv_cw", "n"}
# the checkpoint store / load kernels: the rows move as vector accesses, and no 64-bit division per row
# (the load's walk of every row divided by L * n_units in int64: 4 div/rem.s64 in its PTX at 3ebf2ca)
STATE_KERNELS = {"gather_units_kernel", "scatter_units_kernel", "store_units_kernel", "load_units_kernel"}


def check_state_ptx(name: str, ptx: str) -> None:
    import re
    if name not in STATE_KERNELS:
        return
    assert not re.search(r"\b(div|rem)\.[su]64", ptx), f"{name}: a 64-bit division in the row arithmetic"
    # int4's rows are 8 bytes a thread (a tile of 16 x 64 bytes over 128 threads): v2 accesses
    assert re.search(r"ld\.global\.v[24]", ptx) and re.search(r"st\.global\.v[24]", ptx), \
        f"{name}: rows not moved as vector accesses"
    # int4's store packs its codes in registers (shift by the element's parity, sum over pairs): splitting the
    # fp32 tile into even / odd halves took 11 barriers (13 with the conv8 encode) through shared memory
    bars = len(re.findall(r"\bbar\.sync", ptx))
    assert name != "store_units_kernel" or bars <= 6, f"{name}: {bars} bar.sync, tiles moved through shared memory"


def check_zero_sign_select(name: str, constexprs: dict, ptx: str) -> None:
    """The integer encodes (INT8's gather with the fma quotient, INT4's store) compare no element against 0:
    -0 and +0 give the same integer code, so kernels._div_rows keeps the zero's sign for fp8 alone; the
    select it costs (a setp against 0f00000000 and a selp an element, 32 each a thread in the INT8 store)
    came with ffd6360 and the H200's INT4 Kimi store went from 85.2% to 77.4% of a same-size copy."""
    import re
    integer = (name == "gather_units_kernel" and constexprs.get("QUANT") == 2) or \
        (name == "store_units_kernel" and constexprs.get("CODEC") == 2)
    if integer:
        n = len(re.findall(r"setp\.[a-z]+\.f32[^\n]*, 0f00000000", ptx))
        assert n == 0, f"{name} {constexprs}: {n} per-element compares against zero (the fp8-only sign select)"
    # fp8's store converts with the hardware's e4m3 instruction on a GPU, not the interpreter's bit arithmetic
    # (about fifteen integer ops an element; 976 -> 752 PTX instructions in the store)
    if name == "store_units_kernel" and constexprs.get("CODEC") == 1:
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx, f"{name} {constexprs}: fp8 codes not from the hardware cvt"
    # and the integer encodes (INT8, INT4, the 8-bit conv) round to an integer in one instruction (cvt.rni), not
    # _round_half_even's two adds and a cvt.rzi (INT8's store 1082 -> 954 PTX instructions)
    if integer:
        assert re.search(r"cvt\.rni(\.ftz)?\.s32\.f32", ptx) and "cvt.rzi.s32.f32" not in ptx, \
            f"{name} {constexprs}: integer codes not rounded by cvt.rni"


def check_conv_divisions(divs: dict) -> None:
    """The 8-bit conv encode's quotients are the fma sequence (kernels._div_fma), not div.rn: a store launch
    with it (CONV8 3) has at most 2 more div.rn.f32 (the layer's scale, its reciprocal) than the same launch
    with the conv copied (CONV8 0); per-element div_rn (16 a thread at 2048 a block) made every quantizing
    +c8 store 10 us slower on the H200 (issue 35). divs: (name, other constexprs, extra) -> {CONV8: count}."""
    pairs = [(k, v) for k, v in divs.items() if isinstance(v, dict) and 0 in v and 3 in v]
    assert pairs, "no store launch compiled with and without the conv8 encode"
    for key, v in pairs:
        assert v[3] - v[0] <= 2, f"{key[0]} {dict(key[1])}: the conv8 encode adds {v[3] - v[0]} div.rn.f32"
    enc = divs.get(("conv8_encode_kernel", "standalone"))
    assert enc is not None and enc <= 2, f"conv8_encode_kernel: {enc} div.rn.f32, per-element divisions"


def variants() -> list[tuple[int, frozenset]]:
    """(index into kernels(), the names that may or may not be multiples of 16 compiled as such): a kernel
    with none of SOMETIMES among its arguments has one variant (the second would be the same compile)."""
    out = []
    for i, (_, signature, _, _) in enumerate(kernels()):
        out.append((i, frozenset()))
        if SOMETIMES & set(signature):
            out.append((i, frozenset(SOMETIMES)))
    return out


def compile_one(job: tuple[int, frozenset]) -> str:
    import re
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource
    i, extra = job
    fn, signature, constexprs, warps = kernels()[i]
    sig = {**signature, **{name: "constexpr" for name in constexprs}}
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, ty) in enumerate(sig.items())
             if ty.startswith("*") or name in ALIGNED | extra}
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    work = tempfile.mkdtemp(prefix="kernel_check_")
    ptx = os.path.join(work, "kernel.ptx")
    with open(ptx, "w") as f:
        f.write(k.asm["ptx"])
    r = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", ptx, "-o", os.path.join(work, "kernel.cubin")],
                       capture_output=True, text=True)
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", r.stdout + r.stderr)]
    regs = re.findall(r"Used (\d+) registers", r.stdout + r.stderr)
    check_state_ptx(fn.__name__, k.asm["ptx"])
    check_zero_sign_select(fn.__name__, dict(constexprs), k.asm["ptx"])
    assert r.returncode == 0 and spills and not any(spills), (fn.__name__, constexprs, r.stderr[-2000:])
    ndiv = len(re.findall(r"\bdiv\.rn\.f32", k.asm["ptx"]))
    line = f"compiled {fn.__name__} {constexprs} {sorted(extra)} registers {regs} spill stores {spills}"
    return line, fn.__name__, dict(constexprs), tuple(sorted(extra)), ndiv


def compile_all() -> None:
    # one compile per core (the compiles are independent; a 2-core CI machine halves the wall time)
    import multiprocessing
    divs: dict = {}
    with multiprocessing.get_context("fork").Pool(min(2, os.cpu_count() or 1)) as pool:
        for line, name, constexprs, extra, ndiv in pool.imap_unordered(compile_one, variants()):
            print(line, flush=True)
            if name == "conv8_encode_kernel":
                divs[(name, "standalone")] = max(ndiv, divs.get((name, "standalone"), 0))
            elif "CONV8" in constexprs and constexprs["CONV8"] in (0, 3):
                key = (name, tuple(sorted((n, v) for n, v in constexprs.items()
                                          if n not in ("CONV8", "CONV_BLOCK", "TO_BF16"))), extra)
                divs.setdefault(key, {})[constexprs["CONV8"]] = ndiv
    check_conv_divisions(divs)


def test_our_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", "import test_kernels_compile as t; t.compile_all()"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("compiled") == len(variants())
