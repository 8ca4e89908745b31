"""What the fixed-slot study (benchmarks/serve_wr_fixed_slots.py, Table 8) needs beside the multi-turn workload:
its KV cache sized beside the weights, the pairing of its cells, and the deadline of one device call.

KV cache. Without a memory limit: enough that KV never evicts (every conversation's longest prompt plus the
running requests; the earlier default). With one (--memory-limit-bytes N|device, as clients.matched_hbm):
the smaller of that and the most blocks that fit beside the weights, state rows and the largest arm's pool
(clients/kv_sizing.py counts them by the engine's own footprint). Every arm gets the same block count (one
runtime for all; only the arm differs). Refused when fewer blocks fit than the live conversations need: a
closed loop of C clients has at most C conversations in flight, each holding at most its longest prompt, so
C x blocks-per-prompt (+ a partial block per running request) keeps every hit a hit (the radix LRU evicts
finished conversations first: a live one's prefix is either locked by its running turn or was touched by
the turn that just ended).

Deadline (--call-deadline-s). A call runs, per W, nr's seeds then wr's same seeds (the per-hit cost pairs the
two arms of one call), so a unit (a seed) owes: its nr cell, wr's server start and wr's cells of every seed
nr ran in this call. A W owes first its two builds and nr's start. Each is estimated before it starts:
cells from the seconds per request of the cells done so far (this arm's, else the most of any cell, else a
conservative default), starts and builds from the last one measured in this call (the kernel cache only
grows) or a default. Nothing starts that the estimate says cannot end before the deadline.
"""
from __future__ import annotations

import math
import os
import time


def cell_rate(record: dict) -> float | None:
    """Seconds per request of a written cell (its wall time with the stats calls, else the workload's)."""
    cell = record.get("cell") or {}
    seconds = record.get("wall_s", cell.get("seconds"))
    return seconds / cell["requests"] if seconds and cell.get("requests") else None


def paired_call(cells: list[dict], w: int, seed: int) -> str | None:
    """The first call that measured both nr<w> and wr<w> on this seed (None: no such call)."""
    calls = {a: {c["call"] for c in cells if c["arm"] == f"{a}{w}" and c["unit"] == f"s{seed}"} for a in ("nr", "wr")}
    common = sorted(calls["nr"] & calls["wr"])
    return common[0] if common else None


class UnitDeadline:
    """The call's gate (module docstring). ``rates``: arm -> seconds per request of its cells done so far."""

    def __init__(self, deadline: float, requests: int, rates: dict[str, list[float]], default_rate: float,
                 default_start_s: float, default_build_s: float, clock=time.monotonic):
        self.deadline, self.requests, self.clock = deadline, requests, clock
        self.rates = {k: list(v) for k, v in rates.items()}
        self.default_rate, self.start_s, self.build_s = default_rate, default_start_s, default_build_s
        self.stopped = None          # (arm, unit) of the first thing not started

    def rate(self, arm: str) -> float:
        own = self.rates.get(arm)
        if own:
            return max(own)
        seen = [r for rs in self.rates.values() for r in rs]
        return max(seen) if seen else self.default_rate

    def cell_s(self, arm: str) -> float:
        return self.rate(arm) * self.requests

    def record_cell(self, arm: str, seconds: float) -> None:
        self.rates.setdefault(arm, []).append(seconds / self.requests)

    def record_start(self, seconds: float) -> None:
        self.start_s = seconds

    def record_build(self, seconds: float) -> None:
        self.build_s = seconds

    def _fits(self, owed: float, what: tuple[str, str]) -> bool:
        ok = self.clock() + owed <= self.deadline
        if not ok and self.stopped is None:
            self.stopped = what
        return ok

    def fits_w(self, w: int, seed: int) -> bool:
        """Whether to start W (build both, start nr): it must reach its first pair of cells."""
        owed = 2 * self.build_s + 2 * self.start_s + self.cell_s(f"nr{w}") + self.cell_s(f"wr{w}")
        return self._fits(owed, (f"nr{w}", f"s{seed}"))

    def fits_seed(self, w: int, seed: int, ran: int) -> bool:
        """Whether nr<w> starts this seed, ``ran`` seeds already run by nr<w> in this call."""
        owed = self.cell_s(f"nr{w}") + self.start_s + (ran + 1) * self.cell_s(f"wr{w}")
        return self._fits(owed, (f"nr{w}", f"s{seed}"))

    def left(self) -> float:
        return self.deadline - self.clock()


def size_kv(wargs, model_cfg, specs: list[str], budget: int, *, limit, device: str, headroom_gib: float,
            dtype: str, max_batch: int, block_size: int, blocks_per_prompt: int, conversations: int,
            concurrency: int, step=None, workspace: dict | None = None) -> dict:
    """The KV cache of every arm ({'blocks', 'need', 'live', 'fit', ...}); ``wargs``: the weight settings of
    clients.matched_hbm.check_weights (model, dummy, weights_seed); ``budget``: the largest arm's pool; ``step``,
    ``workspace``: the engine's largest step and its tensors (model/workspace.py), in the engine's count (its fixed bytes) as the engine's own check has it."""
    from clients import arms as armlib
    from clients import kv_sizing
    from trtllm_dasc.errors import UserError
    from trtllm_dasc.model.weights import CheckpointReader, DummyWeights
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    need = (conversations + max_batch) * blocks_per_prompt
    live = concurrency * blocks_per_prompt + max_batch
    if limit is None:
        return {"blocks": need, "need": need, "live": live, "fit": None}
    by_device = limit == "device"
    if by_device:
        limit = kv_sizing.device_limit(device, headroom_gib)
    source = DummyWeights(model_cfg, wargs.weights_seed) if wargs.dummy else CheckpointReader(wargs.model)
    fixed = per_block = 0
    seen = set()
    for spec in specs:
        plan, _ = plan_from_path(wargs.model, PlanOptions(**armlib.parse_arms(spec)[0].plan_fields()),
                                 conv_dtype=dtype, dummy_seed=wargs.weights_seed)
        if repr(plan.bundle_order) in seen:
            continue
        seen.add(repr(plan.bundle_order))
        fx, pb = kv_sizing.engine_fixed_and_block_bytes(model_cfg, source, dtype=dtype, tp=1,
                                                        bundle_order=plan.bundle_order, max_batch=max_batch,
                                                        block_size=block_size, budget=budget, step=step)
        fixed, per_block = max(fixed, fx), max(per_block, pb)
    fit = kv_sizing.blocks_that_fit(limit, fixed, per_block)
    if fit < live:
        raise UserError(f"--memory-limit-bytes {limit:,}: weights, state rows, the largest pool and the step's tensors "
                        f"take {fixed:,} B, "
                        f"leaving {fit:,} KV blocks of {per_block:,} B, fewer than the {live:,} the {concurrency} "
                        "live conversations need (KV would decide hits): lower --max-batch-size or the headroom")
    blocks = min(need, fit)
    out = {"blocks": blocks, "need": need, "live": live, "fit": fit, "limit_bytes": limit, "fixed_bytes": fixed,
           "block_bytes": per_block, "total_bytes": fixed + (blocks + 1) * per_block}
    if workspace is not None:
        out.update(step_workspace_bytes=workspace)
    if by_device:
        out.update(headroom_bytes=int(math.ceil(headroom_gib * (1 << 30))))
    return out


def model_path_record(path: str, root: str) -> str:
    """The model as the manifest records it: relative to the repository when inside it (the device's checkout
    lives elsewhere than this one, and a resumed call must find the same manifest), else absolute."""
    path, root = os.path.abspath(path), os.path.abspath(root)
    return os.path.relpath(path, root) if path.startswith(root + os.sep) else path
