"""The selection rule at its boundary: a unit is global iff H_s > W_max (paper Sec. 4.1), so a unit whose
static horizon equals W_max exactly is omitted at W_max and kept at W_max - 1.

No real checkpoint has a float32 A_log/dt_bias pair whose float64 horizon is exactly an integer small
enough to be a usual W_max (the horizon moves by millions of ulps per float32 step), so the test searches
where integers are dense among doubles: H in [2^40, 2^41) has a spacing of 2^-12, so about one float32
dt_bias in 4096 gives an integral horizon.

numpy's transcendental functions differ by an ulp or so between CPUs (AVX-512 has its own paths), so the
test never asks two formulas for the same double. The boundary unit is found with the planner's own
horizon (which is machine-independent next to integers: horizons.exact_horizon); the planner's horizons
are checked against an independent float64 formula within a few ulps, and its exact ones against mpmath
at 60 digits rounded once (correct rounding is deterministic, so that comparison is exact by construction).
"""
import json

import mpmath
import numpy as np
import pytest

from plan_helpers import run_dasc, tiny_config, write_decay_checkpoint
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.plan import PlanOptions, plan_from_path
from trtllm_dasc.plan import horizons as hz
from trtllm_dasc.plan.selection import select_units, replay_unit_window

A, EPS = -0.3, 1e-3


def horizon64(a_log: np.ndarray, dt_bias: np.ndarray) -> np.ndarray:
    """H_s = ln(eps) / g, g = -exp(A_log) * softplus(a + dt_bias), in float64 from float32 inputs."""
    x = A + dt_bias.astype(np.float64)
    softplus = np.where(x > 0, x + np.log1p(np.exp(-np.abs(x))), np.log1p(np.exp(x)))
    return np.log(EPS) / (-np.exp(a_log.astype(np.float64)) * softplus)


def horizon_mp(a_log: float, dt_bias: float) -> float:
    """The same horizon at 60 digits (mpmath), rounded once to a double."""
    with mpmath.workdps(60):
        x = mpmath.mpf(A) + mpmath.mpf(dt_bias)
        g = -mpmath.exp(mpmath.mpf(a_log)) * mpmath.log1p(mpmath.exp(x))
        return float(mpmath.log(mpmath.mpf(EPS)) / g)


def planner_horizons(a_log: float, dt_bias: np.ndarray) -> np.ndarray:
    """The planner's horizons of one gdn layer whose value heads carry these dt_bias values."""
    cfg = HybridConfig.from_dict(tiny_config("gdn", heads=len(dt_bias), key_heads=1, dk=2, dv=2))
    params = hz.DecayParams(layer=0, A_log=np.full(len(dt_bias), a_log), dt_bias=dt_bias.astype(np.float64))
    return hz.horizons_from_params([params], cfg, A, EPS)[0]


def integral_horizon(target: float = 1.5 * 2.0 ** 40) -> tuple[np.float32, int]:
    """A float32 dt_bias (with A_log = 0, so exp(A_log) is exactly 1) whose planner horizon is an integer W."""
    # softplus(x) ~ exp(x) this far below 0: the dt_bias that gives the target horizon
    dt0 = np.float32(np.log(-np.log(EPS) / target) - A)
    bits = dt0.view(np.int32) + np.arange(-(1 << 15), 1 << 15, dtype=np.int32)
    dts = bits.view(np.float32)
    # candidates: within 8 ulps of an integer by the independent formula (any CPU's last ulps included);
    # among them, one whose horizon in the planner's own arithmetic is an integer
    h = horizon64(np.zeros(1, np.float32), dts)
    near = np.flatnonzero((np.abs(h - np.round(h)) <= 8 * np.spacing(h)) & (h > 2.0 ** 40) & (h < 2.0 ** 41))
    exact = planner_horizons(0.0, dts[near])
    hit = np.flatnonzero(exact == np.floor(exact))
    assert hit.size, "no float32 dt_bias with an integral horizon near the target"
    return dts[near[hit[0]]], int(exact[hit[0]])


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_unit_with_horizon_exactly_wmax_is_omitted(tmp_path, arch):
    dt, W = integral_horizon()
    # the independent formula agrees with the planner within a few ulps (not to the bit: CPUs differ)
    np.testing.assert_allclose(horizon64(np.zeros(1, np.float32), np.array([dt]))[0], W, rtol=8 * 2.0 ** -52)
    raw = tiny_config(arch, heads=2, key_heads=2, dk=2, dv=2)
    units = 2 if arch == "gdn" else 4
    # unit 0 sits exactly at W, unit 1 far below (always omitted), the rest far above (always kept)
    dts = [float(dt), 5.0] + [-40.0] * (units - 2)
    ck = write_decay_checkpoint(tmp_path / "m", raw, {0: ([0.0, 0.0], dts), 2: ([0.0, 0.0], dts)})
    plan, horizons = plan_from_path(str(ck), PlanOptions(wmax=W, placement="off"))
    # the boundary case really is on the boundary in the planner's arithmetic
    assert horizons[0][0] == W
    kept_above = list(range(2, units))
    assert plan.retained == [kept_above, kept_above]
    plan, _ = plan_from_path(str(ck), PlanOptions(wmax=W - 1, placement="off"))
    assert plan.retained == [[0, *kept_above], [0, *kept_above]]


def test_boundary_through_the_cli(tmp_path):
    dt, W = integral_horizon()
    raw = tiny_config("gdn", heads=2, key_heads=2, dk=2, dv=2)
    ck = write_decay_checkpoint(tmp_path / "m", raw, {0: ([0.0, 0.0], [float(dt), 5.0]),
                                                      2: ([0.0, 0.0], [float(dt), -40.0])})
    for wmax, kept in ((W, [0, 1]), (W - 1, [1, 2])):
        code, out, err = run_dasc("plan", "--model", ck, "--wmax", wmax, "--placement", "off", "--json")
        assert code == 0, err
        assert json.loads(out)["retained_per_layer"] == kept


def test_exact_horizons_equal_an_independent_correctly_rounded_value():
    rng = np.random.default_rng(0)
    a_logs = rng.uniform(-4, 2, 40).astype(np.float32)
    dts = np.concatenate([rng.uniform(-12, 6, 36), [-60.0, -745.0, 30.0, 0.3]]).astype(np.float32)
    for a_log, dt in zip(a_logs, dts):
        assert hz.exact_horizon(float(a_log), float(dt), A, EPS) == horizon_mp(float(a_log), float(dt))


def test_fast_horizons_within_a_few_ulps_of_the_reference():
    rng = np.random.default_rng(1)
    dts = rng.uniform(-12, 6, 64).astype(np.float32)
    fast = planner_horizons(0.5, dts)
    ref = np.array([horizon_mp(0.5, float(d)) for d in dts])
    np.testing.assert_allclose(fast, ref, rtol=16 * 2.0 ** -52)


def test_selection_does_not_depend_on_the_cpus_last_ulps(monkeypatch):
    """Emulate another CPU: the fast path's decay off by up to 4 ulps either way. Horizons next to an integer
    are recomputed exactly, so the kept units and the wr windows stay the same; the boundary unit included."""
    dt, W = integral_horizon()
    dts = np.array([dt, dt, 5.0, -40.0], dtype=np.float32)
    base = planner_horizons(0.0, dts)
    real_log_decay = hz.log_decay
    for ulps in (-4, -1, 1, 4):
        monkeypatch.setattr(hz, "log_decay", lambda p, cfg, a, k=ulps: real_log_decay(p, cfg, a) * (1 + k * 2.0 ** -52))
        moved = planner_horizons(0.0, dts)
        assert select_units([moved], W) == select_units([base], W) == [[3]]
        assert select_units([moved], W - 1) == [[0, 1, 3]]
        assert [replay_unit_window(h, 1 << 50) for h in moved] == [replay_unit_window(h, 1 << 50) for h in base]


@pytest.mark.parametrize("h, window", [(1.0, 4), (4.0, 4), (4.000000000000001, 8), (5.0, 8), (8.0, 8),
                                       (2.0 ** 40, 2 ** 40), (2.0 ** 40 * (1 + 2.0 ** -52), 2 ** 41),
                                       (float("inf"), 64)])
def test_replay_window_is_the_power_of_two_at_or_above(h, window):
    assert replay_unit_window(h, 64 if h == float("inf") else 1 << 50) == window
