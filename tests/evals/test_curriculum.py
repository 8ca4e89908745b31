"""The training length curriculum: stages, the loss gate, the step cap, bucketed final lengths, resume."""
from __future__ import annotations

import numpy as np
import pytest

from trtllm_dasc.evals.curriculum import LengthCurriculum


def test_stages_double_from_start_and_the_loss_gate_moves_on():
    c = LengthCurriculum(start=256, min_length=1024, max_length=4096, advance_loss=1.0, stage_steps=100,
                         ema_decay=0.5, min_stage_steps=3)
    assert c.caps == [256, 512, 1024, 2048]
    rng = np.random.default_rng(0)
    assert c.length(rng) == 256
    assert c.update(0.1) is None                                     # one lucky batch: too few to judge
    c.ema = None
    c.steps_in_stage = 0
    assert c.update(3.0) is None and c.update(2.0) is None          # EMA 3.0, 2.5
    # EMA 0.5 * 2.5 + 0.5 * 0.1 = 1.3: not yet; then 0.7 < 1.0: the stage is left
    assert c.update(0.1) is None
    msg = c.update(0.1)
    assert msg is not None and "256 -> 512" in msg and c.length(rng) == 512 and c.ema is None


def test_a_stage_is_left_after_stage_steps_even_without_learning():
    c = LengthCurriculum(start=1024, min_length=1024, max_length=4096, stage_steps=3)
    rng = np.random.default_rng(1)
    for _ in range(2):
        assert c.update(5.0) is None
    assert "after 3 steps" in c.update(5.0)
    assert c.length(rng) == 2048
    for _ in range(3):
        c.update(5.0)
    assert c.final
    draws = [c.length(rng) for _ in range(700)]
    assert set(draws) == {1024, 1536, 2048, 2560, 3072, 3584, 4096}
    assert min(draws.count(n) for n in set(draws)) > 60              # uniform over the 7 buckets
    assert c.update(0.0) is None                                     # the final stage stays


def test_resume_keeps_progress_and_takes_the_new_settings():
    c = LengthCurriculum(stage_steps=2)
    c.update(4.0)
    c.update(4.0)
    c.update(3.0)
    d = LengthCurriculum(stage_steps=50)
    d.resume(c.state())
    assert (d.stage, d.steps_in_stage, d.ema) == (1, 1, 3.0) and d.stage_steps == 50
    short = LengthCurriculum(min_length=256, max_length=512)          # fewer stages now: clamped to the last
    short.resume({**c.state(), "stage": 3})
    assert short.final and short.length(np.random.default_rng(0)) in short.final_lengths


@pytest.mark.parametrize("kw", [dict(start=32), dict(start=8192), dict(min_length=5000), dict(stage_steps=0),
                                dict(ema_decay=1.0)])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError):
        LengthCurriculum(**kw)
