"""Slow-step log: a step whose ``runner.execute`` ran longer than a threshold says on stderr (the Triton
server's log) what it ran: its batch (prefill chunks with their offsets, decodes, replays), its checkpoint
loads and stores, and how many Triton kernels compiled inside it (engine/compile_watch.py). A GPU step
normally takes milliseconds; a step of seconds is a compile, an autotune, a host stall or a swap, and the
line says which step and what it carried without a debugger.

Threshold: EngineConfig.slow_step_s, else the environment's DASC_SLOW_STEP_S (a served engine's config comes
from its engine directory, so the variable is how a serving engineer sets it), else 5 s; 0 turns it off.
At most one line per MIN_INTERVAL_S, on every device: a CPU engine of a large model, or a loaded CI machine,
may take seconds per step, and a line per step would bury the log (the next line says how many were not
shown).
"""
from __future__ import annotations

import math
import os
import sys
import time
from contextlib import contextmanager

from trtllm_dasc.errors import UserError

ENV = "DASC_SLOW_STEP_S"
DEFAULT_S = 5.0
MIN_INTERVAL_S = 10.0
MAX_LISTED = 8          # prefill chunks listed one by one (a batch of 64 would make a paragraph)


def check_seconds(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise UserError(f"{name} must be a number of seconds >= 0 (0: off), got {value!r}")
    return float(value)


def threshold(configured: float | None) -> float:
    """The threshold in seconds (0: off): the config's (EngineConfig checked it), else $DASC_SLOW_STEP_S, else
    DEFAULT_S."""
    if configured is not None:
        return configured
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_S
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"{ENV} must be a number of seconds >= 0 (0: off), got {raw!r}") from None
    return check_seconds(ENV, value)


def _emit(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def describe(plan, owners, seconds: float, threshold_s: float, compiled: tuple[int, float] | None) -> str:
    """One line: the step, its time, its batch and checkpoint traffic, the kernels compiled in it
    (``compiled``: (count, seconds), None where nothing is watched)."""
    prefill, decodes, replays, replay_tokens = [], 0, 0, 0
    for span, s in zip(plan.spans, owners):
        if span.replay_into is not None:
            replays, replay_tokens = replays + 1, replay_tokens + len(span.token_ids)
        elif span.in_prompt(len(s.prompt)):
            prefill.append((len(span.token_ids), span.start, len(s.prompt)))
        else:
            decodes += 1
    chunks = ", ".join(f"{n}@{start}/{total}" for n, start, total in prefill[:MAX_LISTED])
    if len(prefill) > MAX_LISTED:
        chunks += f", +{len(prefill) - MAX_LISTED} more"
    stores = sum(len(span.captures) for span in plan.spans)
    line = (f"dasc: slow step {plan.step}: runner {seconds:.2f} s (threshold {threshold_s:g} s): "
            f"{len({id(s) for s in owners})} sequences; prefill {len(prefill)} "
            f"({sum(n for n, _, _ in prefill)} tokens; tokens@start/prompt: {chunks or '-'}); decode {decodes}; "
            f"replays {replays} ({replay_tokens} tokens); checkpoint loads {len(plan.loads)}, warm loads "
            f"{len(plan.warm_loads)}, stores {stores}, host promotions {len(plan.promotions)}, demotions "
            f"{len(plan.demotions)}; kv copies {len(plan.kv_copies)}, kv tier copies {len(plan.kv_tier_copies)}")
    if compiled is None:
        return line + "; kernel compiles not watched"
    return line + f"; kernels compiled in the step: {compiled[0]} ({compiled[1]:.2f} s)"


class SlowStepLog:
    def __init__(self, threshold_s: float, emit=_emit, clock=time.monotonic):
        self.threshold_s, self.emit, self.clock = threshold_s, emit, clock
        self.min_interval_s = MIN_INTERVAL_S
        self.count = 0                  # slow steps, shown or not
        self._last: float | None = None   # clock at the last line
        self._unshown = 0
        self._paused = False

    @contextmanager
    def paused(self):
        """Warm-up's steps compile and autotune on purpose: their time is its report's, not a finding."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def note(self, plan, owners, seconds: float, compiled: tuple[int, float] | None) -> None:
        if self._paused or not self.threshold_s or seconds < self.threshold_s:
            return
        self.count += 1
        now = self.clock()
        if self._last is not None and now - self._last < self.min_interval_s:
            self._unshown += 1
            return
        line = describe(plan, owners, seconds, self.threshold_s, compiled)
        if self._unshown:
            line += f" ({self._unshown} slow steps since the last such line not shown)"
        self._last, self._unshown = now, 0
        self.emit(line)
