"""How much device time the cells not yet done will take, from the cells already measured (--plan-only).

A paper-scale matrix runs over many sessions of limited device time; whoever plans them needs the remaining
cost, not only the count of cells. Each arm's rate is its measured seconds per request (a cell's `seconds`,
fill and replay of every block and repeat, over its requests: 2 x Q x repeats); an arm with no cell yet takes
the mean of the measured arms' rates (or the GPU prior when nothing is measured). Server starts are not
counted (about a minute each on a warm kernel cache).

Two schedules, because the baseline is measured again beside every arm in every call (its cells pair with the
arm's cells of the same call, clients/runner.py):
- shared: every pending unit runs once with all its pending arms in one call, the baseline once a unit;
- arm_by_arm: one arm a call (CALL_ARMS=nr64, then ...), the baseline again beside each arm.
"""
from __future__ import annotations

from clients.protocol import unit_phase, unit_requests


def rates(manifest: dict, cells: list[dict], prior: float) -> tuple[dict[str, float], list[str]]:
    """Seconds per request for each arm key: measured where it has cells, else the measured arms' mean,
    else ``prior``; and the keys that were measured."""
    measured = {}
    for key in {a["key"] for a in manifest["arms"]}:
        mine = [c for c in cells if c.get("arm") == key and c.get("seconds") is not None]
        requests = sum(unit_requests(manifest, c["unit"], key) for c in mine)
        if requests:
            measured[key] = sum(c["seconds"] for c in mine) / requests
    fallback = sum(measured.values()) / len(measured) if measured else prior
    return {a["key"]: measured.get(a["key"], fallback) for a in manifest["arms"]}, sorted(measured)


def phase_rates(manifest: dict, cells: list[dict]) -> dict[int, float]:
    """The most seconds a request any arm's cell of each phase index took (fill and replay). A call's deadline
    plans a unit no cheaper than its phase has been (clients/runner.CallBudget): the phases past every arm's
    capacity miss and prefill, so their requests cost more than the call's earlier units (12-05: a Q=1617 dense
    cell took 0.0686 s a request against the 0.05 prior, and its nr16 partner no longer fit)."""
    out: dict[int, float] = {}
    for c in cells:
        if c.get("seconds") is None or c.get("unit") not in manifest["units"]:
            continue
        i = unit_phase(c["unit"])
        out[i] = max(out.get(i, 0.0), c["seconds"] / max(1, unit_requests(manifest, c["unit"], c.get("arm"))))
    return out


def ready_prior(calls: list[dict]) -> float | None:
    """The median seconds a server of this directory took to be ready in its earlier calls (every arm that
    recorded ``ready_s``), or None before any. A call's deadline plans a fresh call's server starts with it
    (clients/runner.CallBudget): the fixed 60 s prior is a 48B model on a warm kernel cache, and a model whose
    servers take longer even warm would have a unit skipped in every call without the hint to give it a
    longer deadline. The median, not the slowest: a call's first server may compile what the cache lacked."""
    seconds = sorted(float(a["ready_s"]) for c in calls for a in c.get("arms") or []
                     if isinstance(a, dict) and isinstance(a.get("ready_s"), (int, float)) and a["ready_s"] > 0)
    if not seconds:
        return None
    mid = len(seconds) // 2
    return seconds[mid] if len(seconds) % 2 else (seconds[mid - 1] + seconds[mid]) / 2


def estimate(manifest: dict, cells: list[dict], done, prior: float) -> dict:
    """``done(key, unit)``: whether the arm's cell of the unit exists. Seconds of device time left."""
    rate, measured = rates(manifest, cells, prior)
    base = manifest.get("baseline")
    others = [a["key"] for a in manifest["arms"] if a["key"] != base] or [base]
    shared = arm_by_arm = 0.0
    per_arm = {}
    for unit in manifest["units"]:
        n = {a["key"]: unit_requests(manifest, unit, a["key"]) for a in manifest["arms"]}   # per-arm fill tails
        pending = [k for k in others if not done(k, unit)]
        for k in pending:
            per_arm[k] = per_arm.get(k, 0.0) + rate[k] * n[k]
        if not pending:
            continue
        # the baseline beside the unit's arms (never itself pending alone: it runs beside every arm)
        baseline = rate[base] * n[base] if base in rate and base not in others else 0.0
        shared += baseline + sum(rate[k] * n[k] for k in pending)
        arm_by_arm += sum(baseline + rate[k] * n[k] for k in pending)
    return {"shared_s": round(shared), "arm_by_arm_s": round(arm_by_arm),
            "per_arm_s": {k: round(v) for k, v in per_arm.items()},
            "rate_s_per_request": {k: round(v, 4) for k, v in rate.items()}, "rates_measured": measured,
            "excludes": "server starts (about a minute each, warm kernel cache)"}
