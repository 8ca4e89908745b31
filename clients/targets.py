"""The matched-HBM benchmark's target line, fixed before anything is measured (issue 33 "Targets"; paper App.
C.2): at matched state memory, dasc-nr at W_max=16 against dense on Kimi-Linear-48B cuts the mean TTFT by at
least 42.6% and raises the input throughput by at least 68.4% (the paper's figures, at TP8; ours run at TP1).

A run prints the line before its first cell and records it in its JSON beside the verdict. The figures are
the within-seed ratios' mean over seeds (clients/report.ratios), as the paper computes them; where a run
measures a subset of each phase's blocks, of the phase-weighted figures (clients/report.phase_weights), the
pooled-as-measured ones recorded beside them. A verdict needs
the arm's complete ratios (`vs_dense`: every cell of the manifest, each paired with the baseline cell its own
call measured); until then it is "not measured", and a partial ratio (`vs_dense_partial`, clients/assemble.py:
the phases both arms completed) is shown beside the target, never judged against it: the phases the protocol
weights are not all in it.
The judged figure became the phase-weighted one at 34b4daf (12-05), after the 3b91433 directory's first cells
had been seen (a review of 12-07): that directory is a record, never judged; the judged run is a directory
started after the rule (from 12-07 the one with the fitted decay profile, benchmarks/results/README.md).
"""
from __future__ import annotations

TARGET = {"arm": "nr16", "baseline": "dense", "ttft_mean_change_max": -0.426, "input_throughput_change_min": 0.684,
          "source": "paper App. C.2, Kimi-Linear-48B-A3B at TP8 (issue 33 Targets)"}
TARGET_LINE = ("target: dasc-nr W=16 vs dense at matched memory: mean TTFT <= -42.6%, input throughput >= +68.4% "
               "(paper App. C.2; ratios within each seed, mean over seeds)")


# the released model the target was measured on: a run of another model (Qwen3-Next-80B, a tiny CPU model) is
# reported beside it but not judged by it
TARGET_MODEL = {"model_type": "kimi_linear", "hidden_size": 2304, "num_hidden_layers": 27}


def other_model(model_path: str | None) -> str | None:
    """Why the target does not apply to the run's model (its config.json, or the config file itself), or None
    when it does or the config cannot be read here (a result merged on another machine: judged as before)."""
    import json
    import os
    if not model_path:
        return None
    path = os.path.join(model_path, "config.json") if os.path.isdir(model_path) else model_path
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    shape = {k: raw.get(k) for k in TARGET_MODEL}
    if shape == TARGET_MODEL:
        return None
    return (f"the target is the paper's Kimi-Linear-48B-A3B figure; this run's model is {shape['model_type']} "
            f"(hidden {shape['hidden_size']}, {shape['num_hidden_layers']} layers)")


def _changes(r: dict) -> tuple[float, float]:
    return r["ttft_mean_ms"]["mean"] - 1.0, r["input_tokens_per_s"]["mean"] - 1.0


def _judged(r: dict) -> tuple[float, float, dict]:
    """The two changes the target is judged on: phase-weighted where the run sampled blocks (App. C.2 weighs
    every phase by all its blocks; clients/report.phase_weights), else pooled as measured; and what to record
    beside them (which figure, and the pooled one where the weighted one was used)."""
    ttft, thr = _changes(r)
    if "phase_weighted" not in r:
        return ttft, thr, {"figure": "pooled"}
    wt, wthr = _changes(r["phase_weighted"])
    return wt, wthr, {"figure": "phase-weighted (a block subset, each phase weighted by its blocks in the dataset)",
                      "pooled_as_measured": {"ttft_mean_change": ttft, "input_throughput_change": thr}}


def verdict(arms: list[dict], model_path: str | None = None) -> dict:
    """``arms``: a result's arms (clients/assemble.py, or a merge's); the verdict against TARGET: met True /
    False with the two changes, or None with why (and the partial changes where the arm has them).
    ``model_path``: the run's model; another model than the target's is not judged (other_model)."""
    ratio_key = f"vs_{TARGET['baseline']}"
    why_not = other_model(model_path)
    if why_not:
        return {"met": None, "why": why_not}
    arm = next((a for a in arms if a.get("spec") == TARGET["arm"] and a.get("target", "triton") == "triton"), None)
    if arm is None:
        return {"met": None, "why": f"no {TARGET['arm']} arm"}
    # an arm with cells still to run is never judged, whatever ratios it carries (a merge of run JSONs once
    # computed them from the blocks it had)
    full = arm.get(ratio_key) if not arm.get("pending") else None
    if full is None:
        out = {"met": None, "why": f"{TARGET['arm']} has no complete within-seed ratios to {TARGET['baseline']} "
               "(cells still to run, or without a baseline cell of their call)"}
        partial = arm.get(f"{ratio_key}_partial")
        if partial:
            ttft, thr, how = _judged(partial)
            out["partial"] = {"phases": partial["phases"], "ttft_mean_change": ttft, "input_throughput_change": thr,
                              **how}
        return out
    ttft, thr, how = _judged(full)
    ttft_met = ttft <= TARGET["ttft_mean_change_max"]
    thr_met = thr >= TARGET["input_throughput_change_min"]
    return {"met": ttft_met and thr_met, "ttft_mean_change": ttft, "ttft_met": ttft_met,
            "input_throughput_change": thr, "input_throughput_met": thr_met, **how}


def describe(v: dict) -> str:
    """The verdict in one line."""
    if v["met"] is None:
        line = f"target not measured: {v['why']}"
        if "partial" in v:
            p = v["partial"]
            line += (f"; partial, phases {', '.join(p['phases'])} only: mean TTFT {p['ttft_mean_change']:+.1%}, "
                     f"input throughput {p['input_throughput_change']:+.1%}{_pooled_note(p)}")
        return line
    miss = []
    if not v["ttft_met"]:
        miss.append(f"TTFT short by {v['ttft_mean_change'] - TARGET['ttft_mean_change_max']:.1%} points")
    if not v["input_throughput_met"]:
        miss.append(f"throughput short by {TARGET['input_throughput_change_min'] - v['input_throughput_change']:.1%}"
                    " points")
    return (f"target {'met' if v['met'] else 'MISSED'}: mean TTFT {v['ttft_mean_change']:+.1%} (<= -42.6%), input "
            f"throughput {v['input_throughput_change']:+.1%} (>= +68.4%)" + (f" ({'; '.join(miss)})" if miss else "")
            + _pooled_note(v))


def _pooled_note(v: dict) -> str:
    """Where the figures are phase-weighted: say so, with the pooled-as-measured ones beside them."""
    p = v.get("pooled_as_measured")
    if not p:
        return ""
    return (f" [phase-weighted: each phase's sampled blocks count as all its blocks; pooled as measured: mean TTFT "
            f"{p['ttft_mean_change']:+.1%}, input throughput {p['input_throughput_change']:+.1%}]")
