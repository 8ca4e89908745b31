"""The late-compile watch (engine/compile_watch.py), driven through its hooks as Triton calls them: real
Triton's JITFunction._call_hook where triton is installed (no GPU needed to call a hook), else keyword
arguments as Triton passes them. A compile after warm-up is counted, timed and logged in one line with its
specialisation; a hook installed before is chained and its skip respected; the watch itself never asks
Triton to skip a compile (a truthy pre-compile hook return would skip every real compile)."""
from __future__ import annotations

import types

import pytest

from trtllm_dasc.engine import compile_watch as cw


def _kernel(x_ptr, n, m, BLOCK):
    pass


def _kwargs(repr_="k[num_warps=4](x)", key="key-1"):
    """What Triton 3.6's _call_hook passes (compile: a subset of its dict)."""
    compile_ = {"key": key, "signature": {"x_ptr": "*bf16", "n": "i32", "BLOCK": "constexpr"},
                "constants": {(2,): 64}, "configs": [{(0,): [["tt.divisibility", 16]]}]}
    return dict(key=key, repr=repr_, fn=types.SimpleNamespace(module="fla.ops.kda", name="k"), compile=compile_,
                is_manual_warmup=False, already_compiled=False)


def _watch(**hooks):
    lines = []
    watch = cw.CompileWatch(emit=lines.append)
    target = types.SimpleNamespace(**hooks)
    watch.install(target, "jit_cache_hook", "jit_post_compile_hook")
    return watch, target, lines


def test_a_late_compile_is_counted_timed_logged_and_not_skipped():
    calls = []
    watch, target, lines = _watch(jit_cache_hook=lambda **kw: calls.append(("pre", kw["key"])),
                                  jit_post_compile_hook=lambda **kw: calls.append(("post", kw["key"])))
    assert target.jit_cache_hook(**_kwargs()) is None       # falsy: Triton goes on to compile
    assert target.jit_post_compile_hook(**_kwargs()) is None
    assert calls == [("pre", "key-1"), ("post", "key-1")]  # the prior hooks, chained
    assert watch.count == 1 and watch.seconds >= 0 and len(lines) == 1
    line = lines[0]
    assert line.startswith("dasc: kernel compiled after warm-up (inside requests) in ") and " s [#1]: " in line
    # the specialisation rebuilt from the compile arguments: types, divisibility by 16, constexpr values
    assert line.endswith("fla.ops.kda.k[num_warps=4](x_ptr: *bf16 %16, n: i32, BLOCK=64)")


def test_a_prior_hook_that_skips_the_compile_is_respected():
    watch, target, lines = _watch(jit_cache_hook=lambda **kw: True, jit_post_compile_hook=None)
    # Triton skips the compile (and calls no post hook): nothing compiled, nothing counted
    assert target.jit_cache_hook(**_kwargs()) is True
    assert watch.count == 0 and lines == []


def test_compiles_while_warming_up_are_not_reported():
    watch, target, lines = _watch(jit_cache_hook=None, jit_post_compile_hook=None)
    with watch.warming():
        target.jit_cache_hook(**_kwargs())
        target.jit_post_compile_hook(**_kwargs())
    assert (watch.count, watch.during_warmup, lines) == (0, 1, [])
    target.jit_cache_hook(**_kwargs("k2[num_warps=8](x)", "key-2"))
    target.jit_post_compile_hook(**_kwargs("k2[num_warps=8](x)", "key-2"))
    assert watch.count == 1 and "k2[num_warps=8]" in lines[0]


def test_an_older_triton_without_a_post_hook_counts_untimed():
    lines = []
    watch = cw.CompileWatch(emit=lines.append)
    target = types.SimpleNamespace(cache_hook=None)
    watch.install(target, "cache_hook", None)
    assert not target.cache_hook(**_kwargs())
    assert watch.count == 1 and "(inside requests) [#1]: fla.ops.kda.k[" in lines[0]
    assert not watch.install(target, "cache_hook", None)     # once per process


def test_specialisation_is_cut_and_other_tritons_keep_their_repr():
    kw = _kwargs(repr_="k[num_warps=4](" + "a: i32, " * 400 + ")")
    kw["compile"] = {"key": "k"}                            # not 3.6's compile arguments: repr as given
    out = cw.describe(kw)
    assert out.startswith("fla.ops.kda.k[num_warps=4](a: i32") and len(out) < cw.REPR_CHARS + 60
    assert out.endswith(f"(+{len(kw['repr']) - cw.REPR_CHARS} chars)")


def test_a_failing_log_never_breaks_a_compile():
    watch = cw.CompileWatch(emit=lambda line: 1 / 0)
    target = types.SimpleNamespace(jit_cache_hook=None, jit_post_compile_hook=None)
    watch.install(target, "jit_cache_hook", "jit_post_compile_hook")
    assert target.jit_cache_hook(**_kwargs()) is None and target.jit_post_compile_hook(**_kwargs()) is None


def test_installed_into_real_triton_on_a_gpu_engine_only(monkeypatch):
    triton = pytest.importorskip("triton")
    options = pytest.importorskip("triton.backends.nvidia.compiler").CUDAOptions
    from triton.runtime.jit import JITFunction
    knobs = triton.knobs.runtime
    prior = []
    monkeypatch.setattr(knobs, "jit_cache_hook", lambda **kw: prior.append(sorted(kw)))
    monkeypatch.setattr(knobs, "jit_post_compile_hook", None)
    monkeypatch.setattr(triton.knobs.autotuning, "print", False)
    lines = []
    monkeypatch.setattr(cw, "WATCH", cw.CompileWatch(emit=lines.append))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # a CPU engine, or kernels in the interpreter: nothing compiles, nothing is installed
    assert cw.watch_after_warmup("cpu") is None and cw.watch_after_warmup("cuda") is None
    assert cw.WATCH.installed is None
    monkeypatch.delenv("TRITON_INTERPRET")
    assert cw.watch_after_warmup("cuda:0") == 0
    assert knobs.jit_cache_hook == cw.WATCH.before and triton.knobs.autotuning.print
    # another engine's warm-up autotunes on purpose: Triton prints none of it
    with cw.WATCH.warming():
        assert not triton.knobs.autotuning.print
    assert triton.knobs.autotuning.print
    # Triton's own call of the hooks (what _do_compile does around a compile); JITFunction directly: the
    # suite's interpreter flag makes triton.jit return an interpreted function
    kernel = JITFunction(_kernel)
    sig = {"x_ptr": "*fp32", "n": "i32", "m": "i32", "BLOCK": "constexpr"}
    args = ("key", sig, 0, {(3,): 64}, options(), [{(0,): [["tt.divisibility", 16]]}], False)
    assert not kernel._call_hook(knobs.jit_cache_hook, *args)
    kernel._call_hook(knobs.jit_post_compile_hook, *args)
    assert prior == [["already_compiled", "compile", "fn", "is_manual_warmup", "key", "repr"]]
    assert cw.WATCH.count == 1 and lines[0].endswith(
        f"{__name__}._kernel[num_warps=4, num_ctas=1, num_stages=3, enable_fp_fusion=True, "
        "launch_cooperative_grid=False](x_ptr: *fp32 %16, n: i32, m: i32, BLOCK=64)")
