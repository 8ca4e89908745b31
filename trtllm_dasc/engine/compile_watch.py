"""Late-compile watch: every Triton compile that happens after warm-up (an in-memory kernel cache miss, the
compile of a specialisation warm-up did not meet, or its load from Triton's disk cache) is counted and
reported as one line on stderr (the Triton server's log) with the kernel, its specialisation and the
seconds it took. Warm-up (engine/warmup.py) exists so that no user request pays for a compile; on a cold
kernel cache on the H200 a lone 2,466-token request still took 27 s instead of 2 s, and this names what
compiled inside it. Autotuning after warm-up is printed by Triton itself (its autotuning.print knob, turned
on here): an autotune whose configs are all compiled already runs no compile, so the hooks cannot see it.

Triton's JIT hooks are process-wide (triton.knobs.runtime in Triton 3.6; class attributes of JITFunction in
older 3.x), so the watch is one object per process (WATCH) that every engine of the process shares; each
engine remembers the count at the end of its warm-up. Nothing is installed on a CPU engine or without
triton (our kernels then run in Triton's interpreter or not at all: nothing compiles).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

PREFIX = "dasc: "
# a specialisation (each argument's type and divisibility, the constexprs) is enough to tell variants apart, and
# it must be whole: fla's fused_recurrent_kda_fwd_kernel writes 917 characters, its constexprs last, so at 400 the
# one late compile of 12-06's 48B dense server (0.43 s) was logged without the values that say which variant it was
REPR_CHARS = 2000


def _emit(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class CompileWatch:
    """``before`` / ``after``: the pre- and post-compile hooks, with Triton's keyword arguments (key, repr,
    fn, compile, is_manual_warmup, already_compiled). They chain the hooks installed before them."""

    def __init__(self, emit=_emit):
        self.emit = emit
        self.count = 0              # compiles outside warm-up since installed (never reset: Engine.reset_stats: why)
        self.seconds = 0.0          # their compile time
        self.during_warmup = 0      # compiles while an engine of this process warmed up (not reported)
        self.installed: str | None = None     # the pre-compile hook's name where installed
        self._warming = 0
        self._timed = True          # False where the Triton has no post-compile hook (counted before, untimed)
        self._prev_before = self._prev_after = None
        self.autotuning = None      # triton.knobs.autotuning where its print knob was turned on (see warming)
        self._starts: dict = {}     # (repr, key) -> perf_counter at the pre-compile hook
        self._lock = threading.Lock()

    @contextmanager
    def warming(self):
        """Compiles inside are warm-up's own: counted apart, not logged (a second engine of the process
        warming up after the first one serves must not report its warm-up as late)."""
        with self._lock:
            self._warming += 1
        printing = self.autotuning is not None and self.autotuning.print
        if printing:
            self.autotuning.print = False
        try:
            yield
        finally:
            if printing:
                self.autotuning.print = True
            with self._lock:
                self._warming -= 1

    def install(self, target, before_name: str, after_name: str | None) -> bool:
        """Hook into ``target`` (triton.knobs.runtime, or JITFunction), once; the hooks already there are
        chained. False (nothing changed) if already installed."""
        if self.installed is not None:
            return False
        self._prev_before = getattr(target, before_name, None)
        self._prev_after = getattr(target, after_name, None) if after_name else None
        self._timed = after_name is not None
        setattr(target, before_name, self.before)
        if after_name:
            setattr(target, after_name, self.after)
        self.installed = before_name
        return True

    def before(self, **kw):
        # a truthy return makes Triton skip the compile (and call no post hook): only a prior hook may ask
        # for that, and then there is no compile to count
        skip = self._prev_before(**kw) if self._prev_before is not None else None
        if skip:
            return skip
        try:
            if self._timed:
                with self._lock:
                    self._starts[_ident(kw)] = time.perf_counter()
            else:
                self._note(kw, None)
        except Exception:  # noqa: BLE001 - a diagnostic must never break a compile
            pass
        return None

    def after(self, **kw):
        if self._prev_after is not None:
            self._prev_after(**kw)
        try:
            with self._lock:
                start = self._starts.pop(_ident(kw), None)
            self._note(kw, None if start is None else time.perf_counter() - start)
        except Exception:  # noqa: BLE001 - a diagnostic must never break a compile
            pass
        return None

    def _note(self, kw: dict, seconds: float | None) -> None:
        with self._lock:
            if self._warming:
                self.during_warmup += 1
                return
            self.count += 1
            self.seconds += seconds or 0.0
            n = self.count
        took = "" if seconds is None else f" in {seconds:.2f} s"
        # kernel.warmup(...) calls compile ahead of a launch (still late: after the engine's warm-up)
        how = " by a manual kernel warmup" if kw.get("is_manual_warmup") else ""
        self.emit(f"{PREFIX}kernel compiled after warm-up (inside requests){how}{took} [#{n}]: {describe(kw)}")


def _ident(kw: dict):
    return str(kw.get("repr")), str(kw.get("key"))


def describe(kw: dict) -> str:
    """The kernel's module, name and options, and its specialisation: each argument's type, divisibility by
    16 where Triton specialised on it, the constexprs' values; cut to about REPR_CHARS."""
    fn, rep = kw.get("fn"), str(kw.get("repr") or "?")
    module = getattr(fn, "module", None)
    module = getattr(module, "__name__", module)
    try:
        # Triton 3.6 builds repr's argument list by pairing the parameters with the characters of the cache
        # key's second character (its key is a string): the list is rebuilt from the compile arguments
        rep = rep.split("(", 1)[0] + "(" + _arguments(kw["compile"]) + ")"
    except Exception:  # noqa: BLE001 - another Triton's compile arguments: its repr as it is
        pass
    if len(rep) > REPR_CHARS:
        rep = rep[:REPR_CHARS] + f"...(+{len(rep) - REPR_CHARS} chars)"
    return f"{module}.{rep}" if module else rep


def _arguments(compile: dict) -> str:
    constants, attrs = compile["constants"], compile["configs"][0]
    out = []
    for i, (name, ty) in enumerate(compile["signature"].items()):
        if ty == "constexpr":
            out.append(f"{name}={constants.get((i,), constants.get(i, '?'))}")
            continue
        # backend.parse_attr("D") == [["tt.divisibility", 16]]: the pointer or integer is a multiple of 16
        marks = [f"%{v}" if a == "tt.divisibility" else str(a) for a, v in attrs.get((i,), [])]
        out.append(f"{name}: {ty}" + "".join(" " + m for m in marks))
    return ", ".join(out)


WATCH = CompileWatch()


def watch_after_warmup(device: str) -> int | None:
    """Install WATCH into this process's Triton (once) when ``device`` is a GPU; the count to report later
    counts from (the watch's count now), or None where nothing is watched (a CPU device, no triton, a
    Triton without hooks, the interpreter)."""
    if not str(device).startswith("cuda"):
        return None
    try:
        if os.environ.get("TRITON_INTERPRET") == "1":
            return None
        import triton
        knobs = getattr(triton, "knobs", None)
        if WATCH.installed is None:
            if knobs is not None and hasattr(knobs, "runtime"):
                WATCH.install(knobs.runtime, "jit_cache_hook", "jit_post_compile_hook")
            else:
                from triton.runtime.jit import JITFunction
                if not hasattr(JITFunction, "cache_hook"):
                    return None
                WATCH.install(JITFunction, "cache_hook", "compiled_hook" if hasattr(JITFunction, "compiled_hook")
                              else None)
            # an autotune after warm-up prints its kernel, key and seconds (stdout, the server log too)
            if getattr(knobs, "autotuning", None) is not None:
                knobs.autotuning.print = True
                WATCH.autotuning = knobs.autotuning
    except Exception as e:  # noqa: BLE001 - a missing or different triton costs the diagnostic, not the server
        _emit(f"{PREFIX}late-compile watch off ({type(e).__name__}: {e})")
        return None
    return WATCH.count if WATCH.installed else None
