"""The codec error study as a figure (issue 35, item 3): error against tokens after the hit, one curve per
codec, one panel per horizon band, from precision_error's JSON (nothing is measured again).

Top row: the band's relative state error (median over prefixes) T tokens after the load, per arm (uniform
int8 / fp8 / int4, the 8-bit conv state, and the horizon mix, whose curve is the band's own codec inside the
mix). Bottom row: retention, the share of the written error still there, beside the paper's static decay
bound for the band's slowest unit (eps^(T / H_max), dashed): a codec whose retention stays above the bound
keeps its error longer than the horizons say.

    python -m benchmarks precision_error_plot benchmarks/results/precision_error_kda.json [...]   # JSON.png each
    python -m benchmarks precision_error_plot RESULT.json --out FIG.png
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ARM_STYLE = {"int8": "tab:blue", "fp8": "tab:orange", "int4": "tab:red", "conv8": "tab:gray", "horizon": "black"}


def _band_name(row: dict) -> str:
    hi = row["horizon_below"]
    return (f"horizons [{row['horizon_from']:g}, {'inf' if hi is None else f'{hi:g}'}): {row['units']} units, "
            f"mix codec {row['horizon_codec']}")


def curves(result: dict) -> list[dict]:
    """Per band with units: {'name', 'x', 'rel_error': {arm: [...]}, 'retention': {arm: [...]}, 'bound'}; x
    the tokens after the load. What the figure draws, kept apart from matplotlib so it can be checked."""
    out = []
    for row in result["bands"]:
        if not row["units"]:
            continue
        rel = {a: v["rel_error"] for a, v in row["arms"].items() if v["rel_error"] is not None}
        ret = {a: v["retention"] for a, v in row["arms"].items() if v["retention"] is not None}
        out.append({"name": _band_name(row), "x": list(result["tokens_after_load"]), "rel_error": rel,
                    "retention": ret, "bound": row["bound"]})
    return out


def plot(result: dict, path: str, source: str = "") -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = curves(result)
    if not panels:
        raise ValueError("no horizon band with units: nothing to plot")
    fig, axes = plt.subplots(2, len(panels), figsize=(5.2 * len(panels), 7.5), squeeze=False)
    for j, panel in enumerate(panels):
        # symlog: T = 0 (the load itself) sits on the axis beside 16 ... 4096
        for i, (key, label) in enumerate((("rel_error", "relative error of the band's state"),
                                          ("retention", "retention of the written error"))):
            ax = axes[i][j]
            for arm, ys in panel[key].items():
                pts = [(x, y) for x, y in zip(panel["x"], ys) if y is not None and y == y and y > 0]
                if pts:
                    ax.plot(*zip(*pts), marker="o", color=ARM_STYLE.get(arm), label=arm,
                            linewidth=2.2 if arm == "horizon" else 1.4)
            if key == "retention":
                pts = [(x, b) for x, b in zip(panel["x"], panel["bound"]) if b is not None and b > 0]
                if pts:
                    ax.plot(*zip(*pts), linestyle="--", color="tab:green", label="static bound eps^(T/H_max)")
            ax.set_xscale("symlog", linthresh=16)
            ax.set_yscale("log")
            ax.set_xlabel("tokens after the hit (T)")
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
            if i == 0:
                ax.set_title(panel["name"], fontsize=9)
            ax.legend(fontsize=7)
    fig.suptitle(f"{result['model']}: W_max {result['wmax']}, {result['precision']}, prefix {result['prefix']} x "
                 f"{result['prefixes']}, commit {result.get('commit', '?')}" + (f"\n{source}" if source else ""),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks precision_error_plot",
                                description="Draw precision_error results: error vs tokens after the hit.")
    p.add_argument("results", nargs="+", help="precision_error JSON files")
    p.add_argument("--out", help="the figure's path (one result only; default: the JSON's path with .png)")
    args = p.parse_args(argv)
    if args.out and len(args.results) > 1:
        p.error("--out takes one result; without it each JSON gets its .png beside it")
    for path in args.results:
        try:
            with open(path) as f:
                result = json.load(f)
            out = args.out or os.path.splitext(path)[0] + ".png"
            plot(result, out, source=os.path.relpath(path))
        except (OSError, ValueError, KeyError) as e:
            print(f"precision_error_plot: {path}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
