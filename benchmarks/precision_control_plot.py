"""The horizon-order control as a figure (issue 35): horizon bands against their count-matched shuffled
controls, from precision_control's JSONs (nothing is measured again), one column per result.

Top row: the kept-unit state error T tokens after the load (median over prefixes). Bottom row: the mean
KL divergence of the next-token distribution from the exact row's over the window ending at T. Black: the
horizon bands; gray: each shuffled control (same codec counts per layer, random kept units, so the same
bytes); blue: uniform INT8, for scale. A gap between black and gray is what the horizon order buys.

    python -m benchmarks precision_control_plot benchmarks/results/precision_control_{tiny_kda_profile,kda}.json \
        --out benchmarks/results/precision_control.png
"""
from __future__ import annotations

import argparse
import json
import sys

METRICS = (("state", "kept-unit state error at T"), ("kl", "mean next-token KL over the window ending at T"))


def curves(result: dict) -> dict:
    """{metric: {arm: [(T, median), ...]}} with empty windows (None) and non-positive values left out
    (log axes); what the figure draws, kept apart from matplotlib so it can be checked."""
    xs = result["tokens_after_load"]
    out = {}
    for metric, _ in METRICS:
        out[metric] = {arm: [(x, y) for x, y in zip(xs, ys) if y is not None and y > 0]
                       for arm, ys in result["median"][metric].items()}
    return out


def _style(arm: str) -> dict:
    if arm == "horizon":
        return {"color": "black", "linewidth": 2.4, "marker": "o", "zorder": 3}
    if arm == "int8":
        return {"color": "tab:blue", "linewidth": 1.4, "marker": "s", "linestyle": "--"}
    return {"color": "tab:gray", "linewidth": 1.0, "marker": ".", "alpha": 0.8}


def plot(results: list[tuple[str, dict]], path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(4.6 * len(results), 7.2), squeeze=False)
    for j, (_, result) in enumerate(results):
        drawn = curves(result)
        for i, (metric, label) in enumerate(METRICS):
            ax = axes[i][j]
            shuffled_labelled = False
            for arm, pts in drawn[metric].items():
                if not pts:
                    continue
                name = arm
                if arm.startswith("shuffled"):
                    name, shuffled_labelled = (None if shuffled_labelled else "shuffled (each seed)"), True
                ax.plot(*zip(*pts), label=name, **_style(arm))
            ax.set_xscale("symlog", linthresh=16)
            ax.set_yscale("log")
            ax.set_xlabel("tokens after the hit (T)")
            ax.set_ylabel(label, fontsize=8)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
            if i == 0:
                counts = ", ".join(f"{n} {c}" for c, n in result["kept_units_by_codec"].items())
                ax.set_title(f"{result['model']}\n{counts}; {result['prefixes']} prefixes of {result['prefix']}",
                             fontsize=8)
    first = results[0][1]
    fig.suptitle(f"horizon bands vs count-matched shuffled bands: W_max {first['wmax']}, {first['precision']}, "
                 f"commit {first.get('commit', '?')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="precision_control JSONs, one column each")
    ap.add_argument("--out", required=True, help="the figure (PNG)")
    args = ap.parse_args(argv)
    loaded = []
    for p in args.results:
        try:
            with open(p) as f:
                r = json.load(f)
            curves(r)
            r["kept_units_by_codec"], r["model"], r["wmax"]    # what the titles need
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            print(f"precision_control_plot: error: {p} is not a precision_control result: {e!r}", file=sys.stderr)
            return 2
        loaded.append((p, r))
    print(f"wrote {plot(loaded, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
