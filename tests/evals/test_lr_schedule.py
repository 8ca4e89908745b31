"""The quality training's lr anneal (--anneal-minutes): the multiplier by hand at the window's edges and
inside it, and a run whose whole budget lies in a window twice its length starting near the middle."""
from __future__ import annotations

import re

import pytest

TINY = dict(vocab_size=256, hidden_size=32, groups=1, heads=2, head_dim=16, intermediate_size=64, min_length=256,
            max_length=384, tokens_per_step=768)


def test_the_factor_is_one_before_the_window_then_falls_linearly_to_the_floor():
    from trtllm_dasc.evals.train import anneal_factor
    assert anneal_factor(600, 120) == 1.0 and anneal_factor(120, 120) == 1.0
    assert anneal_factor(60, 120) == pytest.approx(0.1 + 0.9 * 0.5)
    assert anneal_factor(0, 120) == pytest.approx(0.1) and anneal_factor(-5, 120) == pytest.approx(0.1)
    assert anneal_factor(10, 0) == 1.0                       # no window: constant lr
    assert anneal_factor(30, 120, floor=0.0) == pytest.approx(0.25)


def _first_lr(logs):
    return float(re.search(r" lr ([0-9.e-]+) ", next(m for m in logs if "answer tokens right" in m)).group(1))


def test_a_run_inside_its_anneal_window_starts_at_the_lr_its_remaining_time_gives(tmp_path):
    from trtllm_dasc.evals.train import TrainConfig, train
    cfg = TrainConfig(arch="kda", **TINY, lr=1e-3, warmup_steps=1)
    plain, annealed = [], []
    train(cfg, str(tmp_path / "a"), minutes=2, device="cpu", max_steps=1, log=plain.append)
    # a 4-minute window over a 2-minute budget: the first step, seconds in, is at about 0.1 + 0.9 / 2 = 0.55
    # of the peak, and never above it (the lower bound leaves a loaded machine a minute to get there)
    train(cfg, str(tmp_path / "b"), minutes=2, device="cpu", max_steps=1, log=annealed.append, anneal_minutes=4)
    assert _first_lr(plain) == pytest.approx(1e-3)
    assert 0.32e-3 < _first_lr(annealed) <= 0.55e-3


def test_a_negative_window_is_refused(tmp_path):
    from trtllm_dasc.evals.train import TrainConfig, train
    with pytest.raises(ValueError, match="anneal"):
        train(TrainConfig(arch="kda", **TINY), str(tmp_path / "a"), minutes=1, device="cpu", max_steps=1,
              anneal_minutes=-1)
