"""The slow-step log (engine/slow_step.py): with a tiny threshold a CPU engine's every step says what its plan
ran (prefill chunks with their offsets, decodes, checkpoint loads and stores) and how many kernels compiled
in it; lines are rate-limited; the threshold comes from the config, else DASC_SLOW_STEP_S, else 5 s. And the
engine's count of kernels compiled after warm-up (engine/compile_watch.py) survives reset_stats."""
from __future__ import annotations

import types

import pytest

from engine_helpers import greedy, make_engine
from trtllm_dasc.engine import compile_watch as cw
from trtllm_dasc.engine import slow_step
from trtllm_dasc.engine.step import Span, StepPlan
from trtllm_dasc.errors import UserError


def _record(engine):
    """Every (plan, owners) the engine schedules, and every slow-step line, in order."""
    plans, lines = [], []
    schedule = engine.scheduler.schedule

    def recording():
        out = schedule()
        if out is not None:
            plans.append((out[0], list(out[1])))
        return out
    engine.scheduler.schedule = recording
    engine.slow_steps.emit = lines.append
    engine.slow_steps.min_interval_s = 0
    return plans, lines


def test_every_step_past_a_tiny_threshold_says_what_its_plan_ran(tiny_models):
    engine = make_engine(tiny_models["gdn"][0], slow_step_s=1e-9, interval=8, prefill_chunk=16)
    plans, lines = _record(engine)
    first = list(range(1, 22))
    engine.generate([greedy("a", first, n=3), greedy("b", range(30, 43), n=2)])
    # a hit: the first prompt extended loads a checkpoint stored above
    engine.generate([greedy("c", first + [5, 6, 7], n=2)])
    assert len(lines) == len(plans) > 3
    for (plan, owners), line in zip(plans, lines):
        assert line.startswith(f"dasc: slow step {plan.step}: runner ") and "(threshold 1e-09 s)" in line
        chunks = [f"{len(sp.token_ids)}@{sp.start}/{len(s.prompt)}" for sp, s in zip(plan.spans, owners)
                  if sp.start < len(s.prompt)]
        decodes = sum(sp.start >= len(s.prompt) for sp, s in zip(plan.spans, owners))
        stores = sum(len(sp.captures) for sp in plan.spans)
        assert f"prefill {len(chunks)} (" in line and f"tokens@start/prompt: {', '.join(chunks) or '-'});" in line
        assert f"; decode {decodes}; " in line and f"loads {len(plan.loads)}," in line and f"stores {stores}," in line
        # a CPU engine watches no compiles
        assert line.endswith("; kernel compiles not watched")
    # the workload met every kind: a chunked prefill's second chunk beside a decode, stores, a load
    assert any("tokens@start/prompt: 5@16/21); decode 1; " in x for x in lines)
    assert any(plan.loads for plan, _ in plans) and any(", stores 0," not in x for x in lines)
    assert engine.slow_steps.count == len(plans) and engine.stats()["kernels_compiled_after_warmup"] is None


def test_a_watched_engine_counts_a_steps_compiles_and_keeps_them_over_reset_stats(tiny_models, monkeypatch):
    # a GPU engine's watch, simulated on the CPU: the runner's forward "compiles" through the hooks
    lines = []
    watch = cw.CompileWatch(emit=lines.append)
    target = types.SimpleNamespace(jit_cache_hook=None, jit_post_compile_hook=None)
    watch.install(target, "jit_cache_hook", "jit_post_compile_hook")
    monkeypatch.setattr(cw, "WATCH", watch)
    engine = make_engine(tiny_models["kda"][0], slow_step_s=1e-9)
    plans, slow = _record(engine)
    engine._compiled_base = watch.count          # as Engine.warmup leaves it on a GPU
    execute = engine.runner.execute

    def compiling(plan, *a, **k):
        if plan.step == plans[0][0].step:
            for key in ("k1", "k2"):
                kw = dict(key=key, repr=f"{key}[num_warps=4]()", fn=None, compile={}, is_manual_warmup=False,
                          already_compiled=False)
                assert not target.jit_cache_hook(**kw)
                target.jit_post_compile_hook(**kw)
        return execute(plan, *a, **k)
    engine.runner.execute = compiling
    engine.generate([greedy("a", range(1, 12), n=3)])
    assert len(lines) == 2 and all(x.startswith("dasc: kernel compiled after warm-up (inside requests) in ")
                                   for x in lines)
    assert lines[0].endswith("[#1]: k1[num_warps=4]()") and lines[1].endswith("[#2]: k2[num_warps=4]()")
    assert "; kernels compiled in the step: 2 (" in slow[0] and "; kernels compiled in the step: 0 (" in slow[1]
    engine.reset_stats()
    assert engine.stats()["kernels_compiled_after_warmup"] == 2 and engine.stats()["requests"] == 0


def _plan_line(**over):
    owner = types.SimpleNamespace(prompt=list(range(100)))
    spans = [Span(list(range(40)), 0, 20, [], captures=[(48, 3), (56, 4)]), Span([7], 1, 100, []),
             Span(list(range(8)), 2, 12, [], replay_into=0)]
    plan = StepPlan(step=7, spans=spans, loads=[(3, 0)], **over)
    return slow_step.describe(plan, [owner, owner, owner], 6.5, 5.0, (1, 2.25))


def test_the_line_of_a_handmade_plan():
    assert _plan_line() == (
        "dasc: slow step 7: runner 6.50 s (threshold 5 s): 1 sequences; prefill 1 (40 tokens; "
        "tokens@start/prompt: 40@20/100); decode 1; replays 1 (8 tokens); checkpoint loads 1, warm loads 0, "
        "stores 2, host promotions 0, demotions 0; kv copies 0, kv tier copies 0; kernels compiled in the step: "
        "1 (2.25 s)")


def test_lines_are_rate_limited_and_say_how_many_were_not_shown():
    now = [100.0]
    lines = []
    log = slow_step.SlowStepLog(5.0, emit=lines.append, clock=lambda: now[0])
    plan, owners = StepPlan(step=1, spans=[]), []
    log.note(plan, owners, 4.9, None)                       # under the threshold
    for t in (100.0, 101.0, 109.0, 110.5):
        now[0] = t
        log.note(plan, owners, 6.0, None)
    assert log.count == 4 and len(lines) == 2
    assert "not shown" not in lines[0] and lines[1].endswith("(2 slow steps since the last such line not shown)")
    with log.paused():
        now[0] = 200.0
        log.note(plan, owners, 60.0, None)
    assert len(lines) == 2


def test_threshold_from_the_config_else_the_environment_else_five_seconds(monkeypatch):
    monkeypatch.delenv(slow_step.ENV, raising=False)
    assert slow_step.threshold(None) == 5.0
    monkeypatch.setenv(slow_step.ENV, "0.5")
    assert slow_step.threshold(None) == 0.5 and slow_step.threshold(2) == 2.0 and slow_step.threshold(0) == 0.0
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv(slow_step.ENV, bad)
        with pytest.raises(UserError, match=slow_step.ENV):
            slow_step.threshold(None)
    with pytest.raises(UserError, match="slow_step_s"):
        make_engine("unused", slow_step_s=-1.0)
    # 0: off, whatever the step took
    lines = []
    slow_step.SlowStepLog(0.0, emit=lines.append).note(StepPlan(step=1, spans=[]), [], 1e6, None)
    assert lines == []
