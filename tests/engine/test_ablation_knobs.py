"""The ablation knobs (EngineConfig.step_delay_s / step_slowdown; dasc-build --ablation-step-*; clients.matched_hbm
--step-delay-ms / --step-slowdown): a served engine made slower on purpose, so a serving figure can be shown to
depend (or not) on the engine's speed (issue 33). Off by default and then absent from every manifest; once the
engine is ready each step's results wait delay + (slowdown - 1) x the step's own time; warm-up is not slowed;
out-of-range values are refused in one line."""
from __future__ import annotations

import argparse
import math

import pytest

from build_scripts.dasc_build import add_arguments, engine_options
from engine_helpers import greedy, make_engine
from trtllm_dasc.engine import engine as engine_mod
from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.errors import UserError


@pytest.mark.parametrize("field, value", [("step_delay_s", -0.001), ("step_delay_s", math.nan),
                                          ("step_delay_s", 61.0), ("step_delay_s", True), ("step_delay_s", "1"),
                                          ("step_slowdown", 0.5), ("step_slowdown", math.inf),
                                          ("step_slowdown", 101.0)])
def test_out_of_range_knobs_are_refused_in_one_line(field, value):
    with pytest.raises(UserError, match=f"{field} must be a number from") as e:
        EngineConfig(model="m", **{field: value})
    assert "\n" not in str(e.value)


def test_defaults_are_off_and_dasc_build_records_what_it_is_given():
    cfg = EngineConfig(model="m")
    assert (cfg.step_delay_s, cfg.step_slowdown) == (0.0, 1.0)
    p = argparse.ArgumentParser()
    add_arguments(p)
    opts = engine_options(p.parse_args(["--model", "m", "--output", "o"]))
    assert (opts["step_delay_s"], opts["step_slowdown"]) == (0.0, 1.0)
    opts = engine_options(p.parse_args(["--model", "m", "--output", "o", "--ablation-step-delay-ms", "250",
                                        "--ablation-step-slowdown", "2"]))
    assert (opts["step_delay_s"], opts["step_slowdown"]) == (0.25, 2.0)
    with pytest.raises(UserError, match="step_slowdown"):
        engine_options(p.parse_args(["--model", "m", "--output", "o", "--ablation-step-slowdown", "0"]))


def _holds(monkeypatch) -> list[float]:
    """Every hold the engine asks of time.sleep (recorded, not slept)."""
    held = []
    monkeypatch.setattr(engine_mod.time, "sleep", held.append)
    return held


def test_a_ready_engine_holds_every_step_and_warm_up_runs_at_its_own_speed(tiny_models, monkeypatch):
    engine = make_engine(tiny_models["gdn"][0], step_delay_s=0.125)
    held = _holds(monkeypatch)
    steps = []
    execute = engine.runner.execute
    engine.runner.execute = lambda plan: (steps.append(plan.step), execute(plan))[1]
    engine.warmup()
    assert steps and held == []                     # warm-up: nothing held
    steps.clear()
    engine.generate([greedy("a", range(1, 20), n=3), greedy("b", range(30, 41), n=2)])
    # the fixed delay alone: (1 - 1) x the step's time adds exactly 0
    assert len(steps) >= 3 and held == [0.125] * len(steps)


def test_a_slowdown_holds_in_proportion_to_each_step(tiny_models, monkeypatch):
    engine = make_engine(tiny_models["gdn"][0], step_slowdown=3.0)
    engine.warmup()
    held = _holds(monkeypatch)
    took = []
    clock = engine_mod.time.perf_counter
    execute = engine.runner.execute

    def timed(plan):
        t0 = clock()
        out = execute(plan)
        while clock() - t0 < 0.2:      # a step of known length (time.sleep is the recorder here): 0.2 s at least
            pass
        took.append(clock() - t0)
        return out
    engine.runner.execute = timed
    engine.generate([greedy("a", range(1, 20), n=3)])
    # each hold is twice the step's runner time: the engine times the same call from just outside, so at least
    # 2 x this, and within the engine's own overhead of it (a factor of 3 would hold 0.2 s more)
    assert len(held) == len(took) >= 2
    assert all(2 * t <= h <= 2 * t + 0.1 for h, t in zip(held, took))


def test_an_engine_without_the_knobs_never_holds(tiny_models, monkeypatch):
    engine = make_engine(tiny_models["gdn"][0])
    engine.warmup()
    held = _holds(monkeypatch)
    engine.generate([greedy("a", range(1, 20), n=3)])
    assert held == []
