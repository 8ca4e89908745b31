"""The selection rule at its boundary: a unit is global iff H_s > W_max (paper Sec. 4.1), so a unit whose
static horizon equals W_max exactly is omitted at W_max and kept at W_max - 1.

No real checkpoint has a float32 A_log/dt_bias pair whose float64 horizon is exactly an integer small
enough to be a usual W_max (the horizon moves by millions of ulps per float32 step), so the test searches
where integers are dense among doubles: H in [2^40, 2^41) has a spacing of 2^-12, so about one float32
dt_bias in 4096 gives an integral horizon. The search uses its own float64 formula, not the planner's.
"""
import json

import numpy as np
import pytest

from plan_helpers import run_dasc, tiny_config, write_decay_checkpoint
from trtllm_dasc.plan import PlanOptions, plan_from_path

A, EPS = -0.3, 1e-3


def horizon64(a_log: np.ndarray, dt_bias: np.ndarray) -> np.ndarray:
    """H_s = ln(eps) / g, g = -exp(A_log) * softplus(a + dt_bias), in float64 from float32 inputs."""
    x = A + dt_bias.astype(np.float64)
    softplus = np.where(x > 0, x + np.log1p(np.exp(-np.abs(x))), np.log1p(np.exp(x)))
    return np.log(EPS) / (-np.exp(a_log.astype(np.float64)) * softplus)


def integral_horizon(target: float = 1.5 * 2.0 ** 40) -> tuple[np.float32, int]:
    """A float32 dt_bias (with A_log = 0, so exp(A_log) is exactly 1) whose horizon is an integer W."""
    # softplus(x) ~ exp(x) this far below 0: the dt_bias that gives the target horizon
    dt0 = np.float32(np.log(-np.log(EPS) / target) - A)
    bits = dt0.view(np.int32) + np.arange(-(1 << 15), 1 << 15, dtype=np.int32)
    dts = bits.view(np.float32)
    h = horizon64(np.zeros(1, np.float32), dts)
    exact = np.flatnonzero((h == np.floor(h)) & (h > 2.0 ** 40) & (h < 2.0 ** 41))
    assert exact.size, "no float32 dt_bias with an integral horizon near the target"
    return dts[exact[0]], int(h[exact[0]])


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_unit_with_horizon_exactly_wmax_is_omitted(tmp_path, arch):
    dt, W = integral_horizon()
    assert horizon64(np.zeros(1, np.float32), np.array([dt]))[0] == W
    raw = tiny_config(arch, heads=2, key_heads=2, dk=2, dv=2)
    units = 2 if arch == "gdn" else 4
    # unit 0 sits exactly at W, unit 1 far below (always omitted), the rest far above (always kept)
    dts = [float(dt), 5.0] + [-40.0] * (units - 2)
    ck = write_decay_checkpoint(tmp_path / "m", raw, {0: ([0.0, 0.0], dts), 2: ([0.0, 0.0], dts)})
    plan, horizons = plan_from_path(str(ck), PlanOptions(wmax=W, placement="off"))
    # the planner computes the same horizon to the bit: the boundary case really is on the boundary
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
