"""The paper's quality tables from per-instance results (evals.run's JSON), each cell beside the paper's figure.

    python -m trtllm_dasc.evals.paper_tables quality_kda.json quality_gdn.json [--horizons kda=hv_kda.json,gdn=...]
                                             [--out tables.md] [--json tables.json] [--resamples 10000]

  Table 2    dense vs dasc-nr at W=16 per subtask and length (and the length's subtask average, as the paper's
             Avg: the mean of the subtask means), the paired difference
             nr - dense with its 95% bootstrap interval over the cell's unique instances; the paper's Table 2 /
             Tables 6-7 (RULER, App. D) beside it.
  Sweep      dasc-nr and dasc-wr average accuracy at every W and length, beside the paper's Tables 6-7 averages.
  Table 5    dasc-nr minus the mean of the count-matched random masks at every (W, length), Holm over all of a
             model's comparisons (the paper: 15 end-task comparisons, Kimi-KDA only; shown for reference).
  wr vs nr   dasc-wr minus dasc-nr at every (W, length), Holm over the family; the paper's difference of the
             two averages beside it.
  INT8       dasc-nr + INT8 minus dasc-nr per length; the paper's Table 4 (end tasks) for reference.
  Table 1b   the horizon validation (evals.horizon_validation's JSON): Spearman medians and IQRs.

The paper's numbers are in paper_numbers.json (transcribed from the paper's text, each with its table). The unit
is the unique instance (task, length, seed): an instance's replay rounds are averaged by the protocol already;
statistics come from evals/stats.py (paired bootstrap, centered two-sided p, Holm).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import Counter

import numpy as np

from trtllm_dasc.evals.protocol import parse_arm
from trtllm_dasc.evals.report import instance_scores, mean_scores
from trtllm_dasc.evals.stats import holm, paired_bootstrap
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.evals.result_file import load_for_tables, load_result
from trtllm_dasc.spec import DEFAULT_CONV_CODEC

PAPER_FILE = os.path.join(os.path.dirname(__file__), "paper_numbers.json")


def paper_numbers() -> dict:
    with open(PAPER_FILE) as f:
        return json.load(f)


def length_label(n: int) -> str:
    """4096 -> 4k (the paper's column names); other lengths as they are."""
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def arch_of(result: dict) -> str:
    """kda | gdn: the result's own "arch", else the model's config.json, else its directory name."""
    if result.get("arch") in ("kda", "gdn"):
        return result["arch"]
    model = str(result.get("model", ""))
    try:
        return HybridConfig.from_path(model).arch
    except Exception:               # a result read where its model is not: fall back on the name
        name = os.path.basename(model.rstrip("/")).lower()
        return "gdn" if "gdn" in name or "qwen" in name else "kda"


def _arms(result: dict) -> dict:
    return {a["arm"]: instance_scores(a) for a in result["arms"]}


def _mean(scores: dict, keep=lambda k: True) -> float:
    """The mean over the subtasks of each subtask's mean (instances ``keep`` selects): the paper's Avg column
    averages its subtask columns, so a subtask that lost instances to misses must not weigh less (a pooled mean
    over instances would). One subtask: its plain mean."""
    by_task: dict[str, list[float]] = {}
    for k, s in scores.items():
        if keep(k):
            by_task.setdefault(k[0], []).append(s)
    return float(np.mean([np.mean(v) for v in by_task.values()])) if by_task else math.nan


def _pair(a: dict, b: dict, keep, resamples: int, seed: int = 0, by_task: bool = False) -> dict:
    """Paired a - b over the instances both scored (and ``keep`` selects): n, diff, 95% CI, p. ``by_task``: the
    difference of two subtask averages (_mean), as beside the paper's Avg: each instance's difference is weighted
    n / (tasks * its subtask's n), so the weighted mean is the mean of the subtasks' mean differences (the
    weights are all 1 when every subtask has the same number of instances); instances are still resampled."""
    ids = sorted(k for k in a.keys() & b.keys() if keep(k))
    if not ids:
        return {"n": 0}
    d = np.array([a[i] - b[i] for i in ids], dtype=float)
    if by_task:
        count = Counter(i[0] for i in ids)
        d *= np.array([len(ids) / (len(count) * count[i[0]]) for i in ids])
    r = paired_bootstrap(d, resamples=resamples, seed=seed)
    return {"n": r.n, "diff": r.mean_diff, "ci": [r.ci_low, r.ci_high], "p": r.p_value}


def _holm_family(rows: list[dict]) -> None:
    live = [r for r in rows if r.get("n")]
    for r, p in zip(live, holm([r["p"] for r in live])):
        r["p_holm"] = p


def _random_mean(arms: dict, w: int) -> tuple[dict, int]:
    masks = [s for spec, s in arms.items() if (a := parse_arm(spec)).mask_seed is not None and a.wmax == w
             and a.codec == "native" and a.precision_kind is None and a.conv_codec == DEFAULT_CONV_CODEC]
    if not masks:
        return {}, 0
    return mean_scores(masks), len(masks)


def _windows(arms: dict, policy: str) -> list[int]:
    return sorted({a.wmax for spec in arms if (a := parse_arm(spec)).wmax and a.policy == policy
                   and a.mask_seed is None and a.codec == "native" and a.precision_kind is None
                   and a.conv_codec == DEFAULT_CONV_CODEC})


def tables(result: dict, resamples: int = 10_000, paper: dict | None = None) -> dict:
    """Every figure of the markdown for one model's result, with the paper's beside each (None where the paper
    has no such cell)."""
    paper = paper or paper_numbers()
    arch = arch_of(result)
    ruler = paper["ruler"].get(arch, {})
    column = {task: col for col, task in paper["subtasks"].items()}
    arms = _arms(result)
    lengths = [int(n) for n in result["lengths"]]
    tasks = list(result["tasks"])
    dense, nr16 = arms.get("dense", {}), arms.get("nr16", {})

    def paper_cell(arm, n, col):
        return ruler.get(arm, {}).get(length_label(n), {}).get(col)

    t2 = []
    for n in lengths:
        for task in tasks + ["Avg"]:
            keep = (lambda k, n=n: k[1] == n) if task == "Avg" else (lambda k, n=n, t=task: k[1] == n and k[0] == t)
            col = "Avg" if task == "Avg" else column.get(task)
            # the columns over the instances both arms scored, as the difference beside them (an instance one
            # arm lacks would make the columns disagree with the paired difference in the same row)
            both = (lambda k, keep=keep: keep(k) and k in dense and k in nr16)
            pair = _pair(nr16, dense, keep, resamples, by_task=True)
            t2.append({"length": n, "task": task, "dense": _mean(dense, both), "nr16": _mean(nr16, both),
                       "paper_dense": paper_cell("dense", n, col), "paper_nr16": paper_cell("nr16", n, col),
                       **{f"nr16_minus_dense_{k}": v for k, v in pair.items()}})
    sweep = []
    for policy in ("nr", "wr"):
        for w in _windows(arms, policy):
            s = arms[f"{policy}{w}"]
            for n in lengths:
                sweep.append({"arm": f"{policy}{w}", "length": n, "ours": _mean(s, lambda k, n=n: k[1] == n),
                              "paper": paper_cell(f"{policy}{w}", n, "Avg")})
    t5 = []
    for w in _windows(arms, "nr"):
        rand, masks = _random_mean(arms, w)
        if not masks:
            continue
        for n in lengths:
            ref = [r for r in paper["table5"]["rows"] if r["wmax"] == w] if arch == "kda" else []
            t5.append({"wmax": w, "length": n, "masks": masks,
                       **_pair(arms[f"nr{w}"], rand, lambda k, n=n: k[1] == n, resamples),
                       "paper_end_tasks": [{k: r[k] for k in ("benchmark", "diff_pp", "p_holm")} for r in ref]})
    _holm_family(t5)
    wr = []
    for w in _windows(arms, "wr"):
        if f"nr{w}" not in arms:
            continue
        for n in lengths:
            a, b = paper_cell(f"wr{w}", n, "Avg"), paper_cell(f"nr{w}", n, "Avg")
            # beside the paper's difference of two subtask averages: the same on ours
            wr.append({"wmax": w, "length": n, **_pair(arms[f"wr{w}"], arms[f"nr{w}"], lambda k, n=n: k[1] == n,
                                                          resamples, by_task=True),
                       "paper_avg_diff": None if a is None or b is None else round(a - b, 4)})
    _holm_family(wr)
    int8 = []
    gaps = [r["nr16+int8"] - r["nr16"] for r in paper["table4"]["rows"].values()]
    for spec in arms:
        a = parse_arm(spec)
        # INT8's own effect: the conv codec and horizon precision are other comparisons (report.comparisons)
        if (a.codec != "int8" or a.mask_seed is not None or a.conv_codec != DEFAULT_CONV_CODEC
                or a.precision_kind is not None or f"{a.policy}{a.wmax}" not in arms):
            continue
        for n in lengths:
            int8.append({"arm": spec, "length": n,
                         **_pair(arms[spec], arms[f"{a.policy}{a.wmax}"], lambda k, n=n: k[1] == n, resamples),
                         "paper_end_tasks_mean_diff": float(np.mean(gaps)) if a.wmax == 16 else None})
    _holm_family(int8)
    return {"arch": arch, "model": result.get("model"), "instances": result.get("instances"),
            "rounds": result.get("rounds", 1), "table2": t2, "sweep": sweep, "table5": t5, "wr_vs_nr": wr,
            "int8": int8}


def table1b(horizons: dict, arch: str, paper: dict | None = None) -> list[dict]:
    """Ours (median, IQR, pairs) beside the paper's Table 1(b) for each signal."""
    paper = paper or paper_numbers()
    ours = horizons["spearman"]
    return [{"signal": s, "median": ours[s]["median"], "iqr": ours[s]["iqr"], "pairs": ours[s]["pairs"],
             "paper_median": paper["table1b"][arch][s]["median"], "paper_iqr": paper["table1b"][arch][s]["iqr"]}
            for s in ("H_e", "M_S", "M_R")]


def _f(x, digits=2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _pp(row: dict, key: str = "diff") -> str:
    if not row.get("n"):
        return "- | - "
    return f"{100 * row[key]:+.2f} | [{100 * row['ci'][0]:+.2f}, {100 * row['ci'][1]:+.2f}]"


def markdown(t: dict, hv: list[dict] | None = None) -> str:
    out = [f"## {t['arch'].upper()}: {os.path.basename(str(t['model']).rstrip('/'))}", "",
           f"{t['instances']} unique instances per subtask, length and arm; {t['rounds']} replay round(s) averaged "
           f"per instance. Accuracy as fractions; differences in points; 95% percentile bootstrap over instances.",
           "", "### Table 2: dense vs dasc-nr at W=16 (paper: Table 2 / Tables 6-7)", "",
           "| length | subtask | dense | paper | nr16 | paper | nr16 - dense | 95% CI | N |",
           "|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in t["table2"]:
        pair = {"n": r.get("nr16_minus_dense_n"), "diff": r.get("nr16_minus_dense_diff"),
                "ci": r.get("nr16_minus_dense_ci")}
        out.append(f"| {length_label(r['length'])} | {r['task']} | {_f(r['dense'])} | {_f(r['paper_dense'])} | "
                   f"{_f(r['nr16'])} | {_f(r['paper_nr16'])} | {_pp(pair)} | {pair['n'] or 0} |")
    out += ["", "### Sweep: average accuracy per arm (paper: Tables 6-7 Avg)", "",
            "| arm | length | ours | paper |", "|---|---|---:|---:|"]
    out += [f"| {r['arm']} | {length_label(r['length'])} | {_f(r['ours'])} | {_f(r['paper'])} |" for r in t["sweep"]]
    out += ["", "### Table 5: dasc-nr minus count-matched random (mean of the masks), Holm over all rows", "",
            "| W | length | masks | N | diff (pp) | 95% CI | p | p Holm | paper, end tasks (Table 5: diff pp, p Holm) |",
            "|---:|---|---:|---:|---:|---|---:|---:|---|"]
    for r in t["table5"]:
        ref = "; ".join(f"{x['benchmark']} {x['diff_pp']:+.2f}, {x['p_holm']}" for x in r["paper_end_tasks"]) or "-"
        out.append(f"| {r['wmax']} | {length_label(r['length'])} | {r['masks']} | {r.get('n', 0)} | {_pp(r)} | "
                   f"{_f(r.get('p'), 4)} | {_f(r.get('p_holm'), 4)}{' *' if r.get('p_holm', 1) < 0.05 else ''} | {ref} |")
    out += ["", "### dasc-wr minus dasc-nr, Holm over all rows (paper: Tables 6-7, wr Avg - nr Avg)", "",
            "| W | length | N | diff (pp) | 95% CI | p Holm | paper (pp) |", "|---:|---|---:|---:|---|---:|---:|"]
    for r in t["wr_vs_nr"]:
        ref = "-" if r["paper_avg_diff"] is None else f"{100 * r['paper_avg_diff']:+.1f}"
        out.append(f"| {r['wmax']} | {length_label(r['length'])} | {r.get('n', 0)} | {_pp(r)} | "
                   f"{_f(r.get('p_holm'), 4)}{' *' if r.get('p_holm', 1) < 0.05 else ''} | {ref} |")
    out += ["", "### INT8: dasc-nr + INT8 minus dasc-nr (paper: Table 4, end tasks, mean of INT8 - native)", "",
            "| arm | length | N | diff (pp) | 95% CI | p Holm | paper (pp) |", "|---|---|---:|---:|---|---:|---:|"]
    for r in t["int8"]:
        ref = "-" if r["paper_end_tasks_mean_diff"] is None else f"{100 * r['paper_end_tasks_mean_diff']:+.2f}"
        out.append(f"| {r['arm']} | {length_label(r['length'])} | {r.get('n', 0)} | {_pp(r)} | "
                   f"{_f(r.get('p_holm'), 4)} | {ref} |")
    if hv:
        out += ["", "### Table 1b: Spearman of the static horizon with observed signals (median [IQR])", "",
                "| signal | ours | (prefix, layer) pairs | paper |", "|---|---|---:|---|"]
        for r in hv:
            out.append(f"| {r['signal']} | {_f(r['median'], 3)} [{_f(r['iqr'][0], 3)}, {_f(r['iqr'][1], 3)}] | "
                       f"{r['pairs']} | {r['paper_median']:.3f} [{r['paper_iqr'][0]:.3f}, {r['paper_iqr'][1]:.3f}] |")
    return "\n".join(out) + "\n"


def write_markdown(results: list[dict], path: str, resamples: int = 10_000, horizons: dict | None = None,
                   json_path: str | None = None) -> dict:
    """The markdown of every result (one per model) to ``path``; the figures as JSON to ``json_path``."""
    computed, parts = [], []
    for result in results:
        t = tables(result, resamples)
        hv = table1b(horizons[t["arch"]], t["arch"]) if horizons and t["arch"] in horizons else None
        t["table1b"] = hv
        computed.append(t)
        parts.append(markdown(t, hv))
    with open(path, "w") as f:
        f.write("\n".join(parts))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(computed, f, indent=1)
    return {"tables": computed}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="evals.run result JSON(s), one per model")
    ap.add_argument("--horizons", default=None, help="ARCH=horizon_validation.json[,ARCH=...] for Table 1b")
    ap.add_argument("--out", default=None, help="markdown file (default: stdout)")
    ap.add_argument("--json", default=None, help="also write every figure as JSON here")
    ap.add_argument("--resamples", type=int, default=10_000)
    args = ap.parse_args(argv)
    try:
        results = [load_for_tables(p) for p in args.results]
        horizons = {}
        for item in filter(None, (args.horizons or "").split(",")):
            arch, _, path = item.partition("=")
            if arch not in ("kda", "gdn") or not path:
                raise ValueError(f"--horizons: expected kda=FILE or gdn=FILE, got {item!r}")
            horizons[arch] = load_result(path)
        if args.resamples < 1:
            raise ValueError("--resamples must be >= 1")
        out = args.out or os.devnull
        write_markdown(results, out, args.resamples, horizons, args.json)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"evals.paper_tables: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if args.out:
        print(f"wrote {args.out}")
    else:
        computed = [tables(r, args.resamples) for r in results]
        print("\n".join(markdown(t, table1b(horizons[t["arch"]], t["arch"]) if t["arch"] in horizons else None)
                        for t in computed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
