"""Regression guard: dasc-nr at W=16 must not fall more than MARGIN below dense on a committed trained model.

The model is the committed Kimi-Linear quality model (benchmarks/quality_models/kda, 7 MB): it retrieves single
needles (100% dense on niah_single_1/_2 in the H200 protocol run). A handful of fresh evaluation instances go
through the real engine's strict warm/replay protocol (evals/protocol.py) under dense and nr16; the guard fails
when compression costs more than MARGIN of accuracy. The second test runs the same guard with a deliberately
broken selection (each layer keeps as many units as dasc, but the shortest-horizon ones) and asserts that the
guard trips, so a selection or load-path bug that discards the long-memory units cannot pass it.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "quality_models", "kda")
# one instance of the eight: nr16 may lose at most one needle the dense run finds
MARGIN = 0.125
TASKS = ("niah_single_1", "niah_single_2")
LENGTH = 256
INSTANCES = 4


def _accuracy(spec: str) -> float:
    from trtllm_dasc.evals.protocol import ProtocolConfig, parse_arm, run_arm
    from trtllm_dasc.evals.report import accuracy_table
    cfg = ProtocolConfig(tasks=TASKS, lengths=(LENGTH,), instances=INSTANCES, max_batch=INSTANCES)
    out = run_arm(MODEL, parse_arm(spec), cfg)
    assert out["misses"] == [], out["misses"]
    return accuracy_table([out])[spec]["accuracy"]


def _guard() -> tuple[bool, float, float]:
    dense, nr = _accuracy("dense"), _accuracy("nr16")
    return nr >= dense - MARGIN, dense, nr


def _shortest_first(horizons, wmax):
    """The broken selection: per layer, dasc's unit count, taken from the shortest horizons."""
    from trtllm_dasc.plan.selection import check_wmax
    check_wmax(wmax)
    if wmax == 0:
        return [list(range(len(h))) for h in horizons]
    return [sorted(np.argsort(h, kind="stable")[: int(np.count_nonzero(h > wmax))].tolist()) for h in horizons]


@pytest.fixture(scope="module")
def dense_accuracy():
    return _accuracy("dense")


def test_dasc_nr_at_w16_stays_within_the_margin_of_dense(dense_accuracy):
    nr = _accuracy("nr16")
    # the model must retrieve here, or the guard would compare two zeros
    assert dense_accuracy >= 0.75, dense_accuracy
    assert nr >= dense_accuracy - MARGIN, f"dasc-nr W=16 {nr:.3f} vs dense {dense_accuracy:.3f} (margin {MARGIN})"


def test_the_guard_trips_on_a_selection_that_keeps_the_shortest_horizons(dense_accuracy, monkeypatch):
    import trtllm_dasc.plan.plan as plan
    monkeypatch.setattr(plan, "select_units", _shortest_first)
    nr = _accuracy("nr16")
    assert nr < dense_accuracy - MARGIN, f"broken selection scored {nr:.3f} vs dense {dense_accuracy:.3f}"
