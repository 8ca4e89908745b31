"""From per-arm replay scores (evals/protocol.py) to the paper's tables: accuracy per arm, and paired
comparisons with bootstrap CIs, centered two-sided p-values and Holm adjustment (App. C, Table 5).

The unit is the unique instance (task, context length, seed); an instance scored in only one arm of a
comparison (a miss in the other) is dropped from that comparison and counted. Comparisons, each a Holm
family over the W values present:
  nr_vs_dense      dasc-nr W        minus dense            (does compression cost accuracy?)
  nr_vs_random     dasc-nr W        minus the mean of the count-matched random masks at W (Table 5)
  wr_vs_nr         dasc-wr W        minus dasc-nr W        (what the replay recovers)
  int8_vs_native   dasc-nr W + INT8 minus dasc-nr W
  wrwarm_vs_wr     dasc-wr-warm W   minus dasc-wr W        (is the warm-started replay better?)
  horizon_vs_*     dasc-nr W + horizon bands minus dense, minus + INT8, minus its shuffled controls (issue 35)
  conv8_vs_dense   the W arm with the 8-bit conv state (+conv-int8) minus dense
  conv8_vs_native_conv  that arm minus the same spec without +conv-int8 (the conv codec's own cost)
"""
from __future__ import annotations

import numpy as np

from trtllm_dasc.evals.protocol import parse_arm
from trtllm_dasc.evals.stats import paired_bootstrap, holm
from trtllm_dasc.spec import DEFAULT_CONV_CODEC


def instance_scores(result: dict) -> dict:
    """{(task, length, seed): score} of one arm's replays."""
    return {(task, int(n), int(seed)): v["score"] for task, by_len in result["scores"].items()
            for n, cell in by_len.items() for seed, v in cell.items()}


def accuracy_table(results: list[dict]) -> dict:
    """Per arm: mean replay score overall and per task, replays scored and misses."""
    out = {}
    for r in results:
        s = instance_scores(r)
        per_task = {}
        for (task, _, _), v in s.items():
            per_task.setdefault(task, []).append(v)
        out[r["arm"]] = {"accuracy": float(np.mean(list(s.values()))) if s else float("nan"), "scored": len(s),
                         "misses": len(r["misses"]), "per_task": {t: float(np.mean(v)) for t, v in per_task.items()}}
    return out


def _paired(a: dict, b: dict, resamples: int, seed: int) -> dict:
    ids = sorted(set(a) & set(b))
    if not ids:
        return {"n": 0, "dropped": len(set(a) ^ set(b))}
    d = np.array([a[i] - b[i] for i in ids])
    r = paired_bootstrap(d, resamples=resamples, seed=seed)
    return {"n": r.n, "dropped": len(set(a) ^ set(b)), "diff": r.mean_diff, "ci": [r.ci_low, r.ci_high],
            "p": r.p_value}


def mean_scores(arms: list[dict]) -> dict:
    """Seeded arms of one kind (random masks, shuffled bands) as one: the mean score per instance all of them
    scored."""
    common = set.intersection(*(set(m) for m in arms))
    return {i: float(np.mean([m[i] for m in arms])) for i in common}


def comparisons(results: list[dict], resamples: int = 10_000, seed: int = 0) -> dict:
    arms = {r["arm"]: (parse_arm(r["arm"]), instance_scores(r)) for r in results}
    dense = next((s for a, s in arms.values() if a.wmax == 0 and a.codec == "native"
                  and a.conv_codec == DEFAULT_CONV_CODEC), None)
    by, horizon, conv = {}, {}, {}
    for a, s in arms.values():
        if a.conv_codec != DEFAULT_CONV_CODEC:
            # the 8-bit conv state (+conv-int8): against dense and against the same arm with a native conv
            # state, when the run has it (run.py allows one such arm per W_max)
            conv[a.wmax] = (s, arms.get(a.native_conv_twin, (None, None))[1])
        elif a.wmax and a.precision_kind is not None:
            # horizon precision (issue 35) and its count-matched control (bands shuffled with a seed)
            if a.policy == "nr" and a.mask_seed is None:
                horizon.setdefault((a.precision_kind, a.wmax), []).append(s)
        elif a.wmax:
            kind = "rand" if a.mask_seed is not None else a.policy
            by.setdefault((kind, a.codec, a.wmax), []).append(s)
    out = {"nr_vs_dense": {}, "nr_vs_random": {}, "wr_vs_nr": {}, "int8_vs_native": {}, "wrwarm_vs_wr": {}}
    if horizon:
        out.update({"horizon_vs_dense": {}, "horizon_vs_int8": {}, "horizon_vs_shuffled": {}})
        for (kind, w), lst in sorted(horizon.items()):
            if kind != "horizon":
                continue
            hz = lst[0]
            if dense is not None:
                out["horizon_vs_dense"][w] = _paired(hz, dense, resamples, seed)
            if ("nr", "int8", w) in by:
                out["horizon_vs_int8"][w] = _paired(hz, by[("nr", "int8", w)][0], resamples, seed)
            shuffled = horizon.get(("shuffled", w))
            if shuffled:
                out["horizon_vs_shuffled"][w] = {**_paired(hz, mean_scores(shuffled), resamples, seed),
                                                 "masks": len(shuffled)}
    for (kind, codec, w), lst in sorted(by.items()):
        if kind != "nr" or codec != "native":
            continue
        nr = lst[0]
        if dense is not None:
            out["nr_vs_dense"][w] = _paired(nr, dense, resamples, seed)
        masks = by.get(("rand", "native", w))
        if masks:
            out["nr_vs_random"][w] = {**_paired(nr, mean_scores(masks), resamples, seed), "masks": len(masks)}
        if ("wr", "native", w) in by:
            out["wr_vs_nr"][w] = _paired(by[("wr", "native", w)][0], nr, resamples, seed)
        if ("wr-warm", "native", w) in by and ("wr", "native", w) in by:
            out["wrwarm_vs_wr"][w] = _paired(by[("wr-warm", "native", w)][0], by[("wr", "native", w)][0], resamples, seed)
        if ("nr", "int8", w) in by:
            out["int8_vs_native"][w] = _paired(by[("nr", "int8", w)][0], nr, resamples, seed)
    if conv:
        out.update({"conv8_vs_dense": {}, "conv8_vs_native_conv": {}})
        for w, (s, native) in sorted(conv.items()):
            if dense is not None:
                out["conv8_vs_dense"][w] = _paired(s, dense, resamples, seed)
            if native is not None:
                out["conv8_vs_native_conv"][w] = _paired(s, native, resamples, seed)
    for family in out.values():
        keys = [w for w, c in family.items() if c.get("n")]
        for w, ph in zip(keys, holm([family[w]["p"] for w in keys])):
            family[w]["p_holm"] = ph
    return out


def format_comparisons(comp: dict) -> str:
    rows = [f"{'comparison':20} {'W':>5} {'N':>6} {'diff pp':>8} {'95% CI':>18} {'p':>8} {'p Holm':>8}"]
    for name, family in comp.items():
        for w, c in sorted(family.items()):
            if not c.get("n"):
                continue
            mark = " *" if c["p_holm"] < 0.05 else ""
            rows.append(f"{name:20} {w:>5} {c['n']:>6} {100 * c['diff']:>+8.2f} "
                        f"[{100 * c['ci'][0]:+6.2f}, {100 * c['ci'][1]:+6.2f}] {c['p']:>8.4f} {c['p_holm']:>8.4f}{mark}")
    return "\n".join(rows) + "\n(* Holm-adjusted p < 0.05; differences in percentage points)"


def plot_accuracy(results: list[dict], path: str, title: str) -> None:
    """Accuracy vs W per arm kind (dense as a line, random masks as mean and spread)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    acc = accuracy_table(results)
    series = {}
    for r in results:
        a = parse_arm(r["arm"])
        if a.wmax == 0:
            continue
        kind = "random (mean of masks)" if a.mask_seed is not None else f"dasc-{a.policy}"
        kind += " + INT8" if a.codec == "int8" else ""
        if a.precision_kind is not None:
            kind += " + horizon bands shuffled (mean)" if a.precision_kind == "shuffled" else " + horizon"
        kind += f" + conv {a.conv_codec.upper()}" if a.conv_codec != DEFAULT_CONV_CODEC else ""
        series.setdefault(kind, {}).setdefault(a.wmax, []).append(acc[r["arm"]]["accuracy"])
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for kind, pts in sorted(series.items()):
        ws = sorted(pts)
        mean = [np.mean(pts[w]) for w in ws]
        sd = [np.std(pts[w], ddof=1) if len(pts[w]) > 1 else 0.0 for w in ws]
        ax.errorbar(ws, mean, yerr=sd, marker="o", capsize=3, label=kind)
    dense = [acc[r["arm"]]["accuracy"] for r in results if parse_arm(r["arm"]).wmax == 0
             and parse_arm(r["arm"]).codec == "native"]
    if dense:
        ax.axhline(dense[0], color="k", ls="--", lw=1, label="dense")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("W_max (tokens)")
    ax.set_ylabel("replay accuracy")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
