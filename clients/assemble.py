"""A matched-HBM measurement's result from its cells: the JSON one unsplit run writes (arms with their block
records and summaries, within-seed ratios against the baseline), whatever calls measured the cells.

Pairing: an arm's ratio to the baseline uses, for every (phase, block, seed) cell, the baseline cell that
the same call measured (the two ran on the same device, one after the other). The baseline's own figures
use its earliest measurement of each cell. An arm with cells still to run, or without a baseline cell of
its own call, gets no ratio; `pending` says how many cells it lacks. Such an arm gets a partial ratio instead
(`vs_<baseline>_partial`) over the phases that both it and the baseline completed (every block and seed, each
pairing as above), the phases named: the same within-seed ratios, then mean and sample std over seeds, but
of those phases only, so not the protocol's figure (its weights lie in the phases still to run).

A run that measures a seeded subset of each phase's blocks also gets each ratio phase-weighted
(`phase_weighted` inside `vs_<baseline>` / `vs_<baseline>_partial`; clients/report.phase_weights says why): the
same cells, each phase's blocks counted as often as the phase has blocks in the dataset over those measured,
as App. C.2's every-block run weighs them. The target is judged on that figure where it exists
(clients/targets.py); the pooled-as-measured one stays beside it.
"""
from __future__ import annotations

from clients.protocol import unit_phase
from clients.report import phase_weights, ratios, sampled_strata, summarize, weighted_summary

EXCHANGE_KEYS = ("ops", "calls", "seconds", "bytes_sent")


def _sum_exchange(cells: list[dict]) -> dict | None:
    out = {}
    for c in cells:
        for op, v in (c.get("exchange") or {}).items():
            acc = out.setdefault(op, dict.fromkeys(EXCHANGE_KEYS, 0))
            for k in EXCHANGE_KEYS:
                acc[k] += v.get(k) or 0
    for v in out.values():
        v["ms_per_op"] = 1e3 * v["seconds"] / v["ops"] if v["ops"] else None
    return out or None


def _head(manifest: dict, key: str) -> int | None:
    """An arm's slots + the run's concurrency: the replay positions a sampled phase's hits can reach."""
    arm = next((a for a in manifest["arms"] if a["key"] == key), None)
    conc = manifest.get("config", {}).get("concurrency")
    return None if arm is None or arm.get("slots") is None or conc is None else int(arm["slots"]) + int(conc)


def _with_weighted(r: dict, manifest: dict, arm_blocks: list[dict], base_blocks: list[dict], key: str,
                   base_key: str) -> dict:
    """``r`` (ratios of the pooled figures) with the phase-weighted ratios added where the run sampled blocks
    (a sampled full-dataset phase's requests stratified by each arm's own reach, report.sampled_strata)."""
    weights = phase_weights(manifest["phases"])
    if weights is None:
        return r
    mine = weighted_summary(arm_blocks, weights, sampled_strata(manifest["phases"], _head(manifest, key)))
    theirs = weighted_summary(base_blocks, weights, sampled_strata(manifest["phases"], _head(manifest, base_key)))
    present = dict.fromkeys(b["phase"] for b in arm_blocks)
    r["phase_weighted"] = {"weights": {p: weights[p] for p in present if p in weights},
                           **ratios({"summary": mine}, {"summary": theirs}),
                           "arm": mine["seeds"], "baseline": theirs["seeds"]}
    return r


def _pair(by: dict, key: str, base_key: str, unit: str) -> tuple[dict, dict] | None:
    """The arm's cell of ``unit`` (its earliest) and the baseline's cell of the same call, or None."""
    mine = by.get((key, unit))
    if not mine:
        return None
    match = [c for c in by.get((base_key, unit), []) if c["call"] == mine[0]["call"]]
    return (mine[0], match[0]) if match else None


def _partial_ratios(manifest: dict, by: dict, key: str, base_key: str) -> dict | None:
    """Within-seed ratios of ``key`` to the baseline over the phases both completed (every unit paired), or
    None when no phase is."""
    by_phase: dict[int, list[str]] = {}
    for u in manifest["units"]:
        by_phase.setdefault(unit_phase(u), []).append(u)
    arm_blocks, base_blocks, names, n = [], [], [], 0
    for i, us in sorted(by_phase.items()):
        pairs = [_pair(by, key, base_key, u) for u in us]
        if all(pairs):
            names.append(manifest["phases"][i]["name"])
            n += len(us)
            for mine, theirs in pairs:
                arm_blocks += mine["blocks"]
                base_blocks += theirs["blocks"]
    if not names:
        return None
    return {"partial": f"phases {', '.join(names)} only ({n} of {len(manifest['units'])} units): the phases both "
                       "arms completed, not the protocol's figure",
            "phases": names, "units": n, "units_total": len(manifest["units"]),
            **_with_weighted(ratios({"summary": summarize(arm_blocks)}, {"summary": summarize(base_blocks)}),
                             manifest, arm_blocks, base_blocks, key, base_key)}


def assemble(manifest: dict, calls: list[dict], cells: list[dict]) -> dict:
    """``manifest``, ``calls`` and ``cells`` of one measurement (clients.cells.load_dirs); the result."""
    by: dict[tuple[str, str], list[dict]] = {}
    for c in cells:
        by.setdefault((c["arm"], c["unit"]), []).append(c)
    for v in by.values():
        v.sort(key=lambda c: c["call"])
    units = manifest["units"]
    base_key = manifest.get("baseline")
    entries = []
    for arm in manifest["arms"]:
        key = arm["key"]
        have = [u for u in units if (key, u) in by]
        chosen = [by[(key, u)][0] for u in have]
        blocks = [b for c in chosen for b in c["blocks"]]
        entry = {k: v for k, v in arm.items() if k != "key"}
        entry.update({"key": key, "cells": len(have), "pending": len(units) - len(have),
                      "calls": sorted({c["call"] for c in chosen}),
                      "exchange": _sum_exchange(chosen),
                      "arm_calls": [a for call in calls for a in call.get("arms", []) if a.get("key") == key],
                      "summary": summarize(blocks) if blocks else None, "blocks": blocks})
        entries.append(entry)
    base = next((e for e in entries if e["key"] == base_key), None)
    for e in entries:
        if base is None or e is base or e["pending"] or e["target"] != "triton":
            continue
        paired, unpaired = [], 0
        for u in units:
            call = by[(e["key"], u)][0]["call"]
            match = [c for c in by.get((base_key, u), []) if c["call"] == call]
            if match:
                paired += match[0]["blocks"]
            else:
                unpaired += 1
        if unpaired:
            e["unpaired_cells"] = unpaired
        else:
            e[f"vs_{base['spec']}"] = _with_weighted(ratios(e, {"summary": summarize(paired)}), manifest,
                                                     e["blocks"], paired, e["key"], base_key)
    for e in entries:
        if (base is None or e is base or e["target"] != "triton" or e["summary"] is None
                or f"vs_{base['spec']}" in e):
            continue
        partial = _partial_ratios(manifest, by, e["key"], base_key)
        if partial is not None:
            e[f"vs_{base['spec']}_partial"] = partial
    for e in entries:
        if e["target"] == "in-process" and not e["pending"]:
            served = next((x for x in entries if x["spec"] == e["spec"] and x["target"] == "triton"), None)
            if served is not None and not served["pending"]:
                e["triton_over_inprocess"] = ratios(served, e)
    done = [e for e in entries if e["summary"] is not None]
    return {"complete": all(not e["pending"] for e in entries),
            "cells_done": sum(e["cells"] for e in entries), "cells_total": len(units) * len(entries),
            "arms": done, "arms_pending": [e["key"] for e in entries if e["summary"] is None]}
