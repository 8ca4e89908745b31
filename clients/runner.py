"""One call of a matched-HBM measurement: the cells of its arms not yet done, arm by arm (one server at a time),
each cell's JSON written as it ends.

Which cells a call runs: the units (phase, block, seed) where one of its non-baseline arms lacks a cell,
in manifest order, at most --max-units of them; every arm of the call runs those units it lacks and the
baseline runs all of them, so each arm's cell has a baseline cell of the same call (same device, same
call: the within-seed ratios compare like with like). A call cut short keeps every finished cell; the next
call runs what is missing, measuring the baseline again beside it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from clients import arms as armlib
from clients.protocol import run_cell, unit_key


def exchange_seconds(before: dict | None, after: dict | None) -> dict | None:
    """The storage balance's all-to-all between two stats answers (rank 0's clock), as
    clients.matched_hbm.exchange_delta plus the seconds (cells add up; the merge divides once)."""
    if not after:
        return None
    out = {}
    for op, a in after.items():
        b = (before or {}).get(op) or {"ops": 0, "calls": 0, "seconds": 0.0, "bytes_sent": 0}
        ops = a["ops"] - b["ops"]
        seconds = a["seconds"] - b["seconds"]
        out[op] = {"ops": ops, "calls": a["calls"] - b["calls"], "bytes_sent": a["bytes_sent"] - b["bytes_sent"],
                   "seconds": seconds, "ms_per_op": 1e3 * seconds / ops if ops else None}
    return out


class ArmFailed(RuntimeError):
    """An arm of a call failed (its server, its requests, its slots against the plan) without --keep-going:
    the call stops; the cells done so far stay in the cells directory. The drivers print it as one line."""


def plan_units(store, manifest: dict, call_keys: list[str], max_units: int | None) -> list[str]:
    """The units this call measures (see the module docstring)."""
    base = manifest.get("baseline")
    others = [k for k in call_keys if k != base] or call_keys
    todo = [u for u in manifest["units"] if any(not store.done(k, u) for k in others)]
    return todo if max_units is None else todo[:max_units]


def arm_units(store, manifest: dict, key: str, units: list[str]) -> list[str]:
    """What one arm of the call runs: all the call's units for the baseline, else those it lacks."""
    if key == manifest.get("baseline"):
        return units
    return [u for u in units if not store.done(key, u)]


def _check_plan(arm: dict, stats: dict) -> dict:
    """The engine against the planner (what `dasc plan` prints): slot count and most loaded rank's bytes."""
    per_rank = stats.get("checkpoint_slot_bytes_per_rank") or []
    worst = max(per_rank) if per_rank and None not in per_rank else None
    if stats["checkpoint_slots"] != arm["slots"]:
        raise RuntimeError(f"arm {arm['spec']}: the engine has {stats['checkpoint_slots']} slots, the plan said "
                           f"{arm['slots']}")
    if worst is not None and worst != arm["checkpoint_bytes"]:
        raise RuntimeError(f"arm {arm['spec']}: the engine's most loaded rank holds {worst:,} B a checkpoint, the "
                           f"plan said {arm['checkpoint_bytes']:,}")
    return {"plan_slots": arm["slots"], "engine_slots": stats["checkpoint_slots"],
            "plan_worst_rank_bytes": arm["checkpoint_bytes"], "engine_worst_rank_bytes": worst,
            "engine_slot_bytes_per_rank": per_rank}


# what a GPU call assumes before it has measured anything (Kimi-Linear-48B at full size on an H200: 0.04-0.07 s
# a request of the matched-HBM cells, servers ready in 33-38 s on a warm kernel cache)
GPU_REQUEST_ESTIMATE_S = 0.05
GPU_READY_ESTIMATE_S = 60.0


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def add_estimate_arguments(parser) -> None:
    """The priors of a call's deadline (CallBudget, fixed_slots.UnitDeadline): one definition for the drivers,
    checked as they are parsed."""
    parser.add_argument("--request-estimate-s", type=_positive_seconds, default=None, help="seconds per request assumed "
                        f"before any cell is measured (GPU {GPU_REQUEST_ESTIMATE_S})")
    parser.add_argument("--ready-estimate-s", type=_positive_seconds, default=None, help="server start assumed before one is "
                        "measured in this call (GPU: the median ready time of the directory's earlier calls, else "
                        f"{GPU_READY_ESTIMATE_S:.0f}: a warm kernel cache; cold ~270-340)")


class CallBudget:
    """A call's wall-clock deadline (--call-deadline-s): a unit is started only when it and everything the call
    still owes for it fit before the deadline: the later arms' server starts and their cells of the units the
    baseline has measured in this call (the ratios pair cells of one call). Costs are estimated from the call's
    own measurements: seconds per request (the most of any unit so far, and never less than the unit's phase
    took in the directory's earlier cells) times the unit's requests, and the slowest server start so far. An
    arm's first unit has less to go on: without priors it always runs; with them (``prior_rate`` seconds a
    request and ``prior_start`` seconds a warm server start, ``length`` the call's whole deadline) it is skipped
    only where it does not fit what is left and a fresh call (warm starts) could do it. A first call of a machine compiles every kernel (a 48B dense server was ready in 337 s) and
    then ran a unit whose second arm the call's timeout killed: 200 s of device time for no cell. A unit that
    no call of this length could fit (the full-dataset phase: 24,064 requests, ~20 minutes an arm) is not
    started either: it would only be killed; ``too_long`` then holds its estimate, and the call says to give
    such units a longer deadline."""

    def __init__(self, deadline: float, requests, clock=time.monotonic, length: float | None = None,
                 prior_rate: float | None = None, prior_start: float | None = None, known_rate=None):
        self.deadline, self.requests, self.clock = deadline, requests, clock
        # unit -> seconds a request its phase has taken in earlier calls (cells_estimate.phase_rates), or None:
        # a floor under every estimate, measured or prior
        self.known_rate = known_rate or (lambda unit: None)
        self.length, self.prior_rate, self.prior_start = length, prior_rate, prior_start
        self.rate = None            # seconds per request, the most of any unit measured in this call
        self.start_s = 0.0          # the slowest server start (ready) measured in this call
        self.setup_s = None         # seconds from the call's start to its first server start (planning, builds)
        self.stopped = None         # (arm, unit) of the first unit not started
        self.too_long = None        # seconds a fresh call would need for it, where that is over ``length``

    def _requests(self, unit: str, arm: str | None) -> int:
        # ``requests(unit, arm)`` where an arm's cell has its own size (per-arm fill tails), else ``requests(unit)``
        return self.requests(unit) if arm is None else self.requests(unit, arm)

    def record_unit(self, unit: str, seconds: float, arm: str | None = None) -> None:
        r = seconds / max(1, self._requests(unit, arm))
        self.rate = r if self.rate is None else max(self.rate, r)

    def record_start(self, seconds: float) -> None:
        if self.setup_s is None and self.length is not None:
            # what came before the call's first server start, a fresh call spends too
            self.setup_s = max(0.0, self.clock() - seconds - (self.deadline - self.length))
        self.start_s = max(self.start_s, seconds)

    def cost(self, units, rate: float | None = None, arm: str | None = None) -> float:
        rate = self.rate if rate is None else rate
        return sum(max(rate or 0.0, self.known_rate(u) or 0.0) * self._requests(u, arm) for u in units)

    def _owed(self, unit: str, later: list, rate: float | None, start: float, arm: str | None) -> float:
        # ``later``: each later arm's units, as a list, or (arm, list) where cells differ by arm
        later = [x if isinstance(x, tuple) else (None, x) for x in later]
        return self.cost([unit], rate, arm) + sum(start + self.cost(us, rate, a) for a, us in later if us)

    def fits(self, unit: str, later: list, first: bool, arm: str | None = None) -> bool:
        """Whether to start ``arm``'s ``unit``; ``later``: for each arm after this one, the units it will then
        owe (a list, or (arm, list))."""
        if not first:
            return self.clock() + self._owed(unit, later, None, self.start_s, arm) <= self.deadline
        if None in (self.length, self.prior_rate, self.prior_start):
            return True
        rate = self.rate if self.rate is not None else self.prior_rate
        if self.clock() + self._owed(unit, later, rate, max(self.start_s, self.prior_start), arm) <= self.deadline:
            return True
        # a fresh call: its setup (as this call's), its own server start, then this unit and what the later arms
        # owe, all warm. Without the setup a unit that fits only a call with none was skipped by every call as
        # one a fresh call could do, never flagged as needing a longer deadline
        fresh = (self.setup_s or 0.0) + self.prior_start + self._owed(unit, later, rate, self.prior_start, arm)
        if fresh > self.length:
            self.too_long = fresh
        return False

    def left(self) -> float:
        return self.deadline - self.clock()


def run_cells(target, store, arm: dict, units: list[str], ctx, call: str, commit: str | None, label: str,
              gate=None, record=None) -> dict:
    """The arm's ``units`` against ``target`` (closed afterwards); each cell written as it ends. ``gate(i, u)``:
    whether to start the i-th unit (a call's deadline; None: all of them); ``record(u, seconds)``: told of each."""
    from clients.progress import Progress
    from clients.protocol import unit_fill_last, unit_requests
    phases, work, proto = ctx.phases, ctx.work, ctx.proto
    by_key = {unit_key(*u): u for u in ctx.units}
    try:
        n = sum(unit_requests(store.manifest, u, arm["key"]) for u in units)
        bar = Progress(n, label)
        t0 = time.perf_counter()
        check = _check_plan(arm, target.control("stats"))
        ran = 0
        for i, u in enumerate(units):
            if gate is not None and not gate(i, u):
                break
            before = target.control("stats")
            c0 = time.perf_counter()
            blocks = run_cell(target, work, phases, by_key[u], proto, bar,
                              fill_last=unit_fill_last(store.manifest, u, arm["key"]))
            after = target.control("stats")
            seconds = time.perf_counter() - c0
            store.write(arm["key"], u, call, commit, {"seconds": seconds, "blocks": blocks,
                                                       "exchange": exchange_seconds(before.get("exchange"),
                                                                                     after.get("exchange"))})
            ran += 1
            if record is not None:
                record(u, seconds)
        bar.close()
    finally:
        target.close()
    return {"plan_check": check, "protocol_s": time.perf_counter() - t0, "units": ran}


def served(arm: dict, engine: str, units: list[str], store, ctx, call: str, commit: str | None, gate=None,
           record=None, started=None) -> dict:
    """One arm through its own tritonserver: serve, run its cells, stop. ``started(seconds)``: told the ready time."""
    args = ctx.args
    t0 = time.perf_counter()
    server = armlib.serve(engine, os.path.join(ctx.out_dir, "servers", arm["spec"]), args.ready_timeout,
                          args.torch_threads, args.tp)
    ready_s = time.perf_counter() - t0
    if started is not None:
        started(ready_s)
    try:
        if args.transport == "http":
            from clients.http_client import HttpTarget
            make = lambda: HttpTarget(server.http_url, args.concurrency, timeout=args.request_timeout)  # noqa: E731
        else:
            from clients.client import GrpcTarget
            make = lambda: GrpcTarget(server.grpc_url, args.concurrency, timeout=args.request_timeout)  # noqa: E731
        res = run_cells(make(), store, arm, units, ctx, call, commit, f"{arm['spec']:>10} (triton)", gate, record)
    except RuntimeError as e:
        # failed requests are usually the server itself gone: say so, with its log
        if server.proc.poll() is not None:
            raise RuntimeError(f"arm {arm['spec']}: tritonserver exited with code {server.proc.returncode} during "
                               f"the protocol (log: {server.log_path}); the client saw: {e}") from None
        raise RuntimeError(f"arm {arm['spec']}: {e} (server log: {server.log_path})") from None
    finally:
        server.stop()
    return {**res, "ready_s": ready_s, "server_log": server.log_path}


def run_call(store, ctx, call: str, commit: str | None, call_keys: list[str], max_units: int | None,
             keep_going: bool) -> list[dict]:
    """Build the engines this call needs and run its cells; per arm what happened (also in calls/<call>.json)."""
    manifest, args = store.manifest, ctx.args
    units = plan_units(store, manifest, call_keys, max_units)
    arms = {a["key"]: a for a in manifest["arms"]}
    todo = [(k, arm_units(store, manifest, k, units)) for k in call_keys]
    todo = [(k, us) for k, us in todo if us]
    base = manifest.get("baseline")
    # the baseline first, deadline or not: the arms after it measure only the units it measured in this call.
    # An arm measured before it and then killed (a call's time limit) kept cells with no baseline cell of their
    # call; the next call skips those units (the arm has them), so their baseline cells were never measured
    todo.sort(key=lambda t: t[0] != base)
    deadline = getattr(args, "call_deadline_s", None)
    budget = None
    if deadline is not None:
        from clients.protocol import unit_requests
        requests = lambda u, arm=None: unit_requests(manifest, u, arm)  # noqa: E731  (an arm's own fill tail)
        # the priors (GPU only: a CPU run keeps "an arm's first unit always runs")
        gpu = str(getattr(args, "device", "cpu")).startswith("cuda")
        from clients.cells_estimate import phase_rates, ready_prior
        rate = getattr(args, "request_estimate_s", None) or (GPU_REQUEST_ESTIMATE_S if gpu else None)
        # a warm server start: the flag, else the directory's earlier calls' median, else the fixed prior
        ready = getattr(args, "ready_estimate_s", None) or (
            (ready_prior([c for c in store.calls() if c.get("call") != call]) or GPU_READY_ESTIMATE_S)
            if gpu else None)
        from clients.protocol import unit_phase
        known = phase_rates(manifest, store.cells())
        budget = CallBudget(getattr(args, "call_t0", time.monotonic()) + deadline, requests, length=deadline,
                            prior_rate=rate, prior_start=ready, known_rate=lambda u: known.get(unit_phase(u)))
    print(f"[matched-hbm] call {call}: {len(units)} unit(s); " +
          ", ".join(f"{k} {len(us)}" for k, us in todo) + f" cell(s); {sum(1 for _ in manifest['units'])} units in "
          "the manifest", file=sys.stderr, flush=True)
    engines = {}
    kernels = args.kernel_cache or os.path.join(ctx.out_dir, "kernels")
    for key, _ in todo:
        spec = arms[key]["spec"]
        if spec not in engines:
            a = armlib.parse_arms(spec)[0]
            engines[spec] = armlib.build_engine(args.model, a, os.path.join(ctx.out_dir, "engines", spec),
                                                manifest["config"]["budget_bytes"], manifest["config"]["build_flags"])
            armlib.share_kernels(engines[spec], kernels)
    done = []
    base_ran = None
    for n, (key, us) in enumerate(todo):
        arm = arms[key]
        gate = record = started = None
        if base_ran is not None:
            # an arm is compared with the baseline of its own call: only the units it measured here (all of
            # them, or fewer when its server failed or the deadline came; cells of an arm without its
            # baseline in the same call could never be paired, and later calls would not run them again)
            us = [u for u in us if u in base_ran]
        if budget is not None:
            later = todo[n + 1:]

            def gate(i, u, key=key, later=later, us=us):
                # what the later arms then owe: their units among those this arm (the baseline) or the baseline
                # has measured in this call, up to this one
                upto = set(us[:i + 1]) if key == base else set(base_ran or us)
                ok = budget.fits(u, [(lk, [x for x in lus if x in upto]) for lk, lus in later], i == 0, key)
                if not ok and budget.stopped is None:
                    budget.stopped = (key, u)
                return ok
            record = lambda u, seconds, key=key: budget.record_unit(u, seconds, key)  # noqa: E731
            started = budget.record_start
        if not us:
            continue
        try:
            if arm["target"] == "in-process":
                from clients.inprocess import EngineTarget
                res = run_cells(EngineTarget(engines[arm["spec"]], args.concurrency, args.request_timeout,
                                             args.torch_threads), store, arm, us, ctx, call, commit,
                                f"{arm['spec']:>10} (in-process)", gate, record)
            else:
                res = served(arm, engines[arm["spec"]], us, store, ctx, call, commit, gate, record, started)
            done.append({"key": key, **res})
        except RuntimeError as e:
            if not keep_going:
                store.update_call(call, arms=done, failed_arms=[{"key": key, "spec": arm["spec"], "error": str(e)}])
                raise ArmFailed(str(e)) from e
            # one arm's failure (its server, its requests, its accounting) is recorded and the call goes on
            print(f"[matched-hbm] arm {key} failed: {e}", file=sys.stderr, flush=True)
            done.append({"key": key, "failed": str(e)})
        finally:
            if key == base and len(call_keys) > 1:
                # what the baseline measured in this call, whether its server lasted or not (its cells)
                base_ran = {u for u in us if store.done_in_call(key, u, call)}
        store.update_call(call, arms=done)
    if budget is not None:
        left = plan_units(store, manifest, call_keys, None)
        cells = sum(not store.done(k, u) for k in call_keys if k != base or len(call_keys) == 1 for u in left)
        stop = budget.stopped
        print(f"[matched-hbm] deadline {deadline:.0f} s: " + (f"stopped before {stop[0]} {stop[1]} "
              f"({budget.left():.0f} s left, not enough for it and the cells it owes" +
              (f"; about {budget.too_long:.0f} s even in a fresh call: run it with a longer --call-deadline-s"
               if budget.too_long else "") + "); " if stop else "")
              + f"{len(left)} unit(s), {cells} cell(s) of this call's arms left", file=sys.stderr, flush=True)
        store.update_call(call, deadline_s=deadline, stopped_before=list(stop) if stop else None,
                          needs_longer_call_s=round(budget.too_long) if budget.too_long else None,
                          units_left=len(left), cells_left=cells)
    return done
