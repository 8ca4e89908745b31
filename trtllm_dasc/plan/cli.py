"""`dasc plan`: plan dasc compression for a checkpoint and report what a checkpoint costs.

    dasc plan --model DIR --wmax 16 --tp 8 --placement hybrid --budget-bytes 694681600
    dasc plan --model DIR --wmax 16,64,128,512 --tp 8          # one table row per W_max
    dasc plan --model DIR --wmax 16 --tp 8 --json > plan.json  # one JSON object (reloadable plan)
"""
from __future__ import annotations

import json
import os
import sys

from trtllm_dasc.config import CONV_CODECS
from trtllm_dasc.errors import UserError
from trtllm_dasc.plan.horizons import DEFAULT_A, DEFAULT_EPS
from trtllm_dasc.plan.plan import PlanOptions, plan_from_path
from trtllm_dasc.spec import DEFAULT_WMAX, DTYPES, add_arm_arguments
from trtllm_dasc.plan.plot import plot_plan


def add_arguments(p) -> None:
    p.add_argument("--model", required=True,
                   help="checkpoint directory (config.json + safetensors) or a bare config.json (then --wmax 0)")
    p.add_argument("--wmax", default=str(DEFAULT_WMAX),
                   help="W_max in tokens: a unit is kept iff its horizon > W_max, so a tie (horizon == W_max) "
                        "is omitted; horizons next to an integer are computed correctly rounded, so every CPU "
                        "selects the same units. 0 keeps all. A comma list (16,64,128) prints one table row "
                        f"per value (default {DEFAULT_WMAX})")
    add_arm_arguments(p, ("tp", "placement", "codec", "precision", "conv_codec", "layout"))
    p.add_argument("--budget-bytes", type=int, default=None,
                   help="per-rank checkpoint memory budget: reports dense_slots and slots = floor(B/b) - 1")
    p.add_argument("--a", type=float, default=DEFAULT_A, help=f"static gate logit (default {DEFAULT_A})")
    p.add_argument("--eps", type=float, default=DEFAULT_EPS, help=f"horizon threshold (default {DEFAULT_EPS})")
    p.add_argument("--temporal-dtype", default="float32", choices=DTYPES,
                   help="dtype of the recurrent state in a checkpoint (default float32)")
    p.add_argument("--conv-dtype", default="bfloat16", choices=DTYPES,
                   help="dtype of the short-conv state in a checkpoint (default bfloat16)")
    add_arm_arguments(p, ("selection", "mask_seed"))
    p.add_argument("--json", action="store_true", help="print one JSON object (needs a single --wmax)")
    p.add_argument("--plot", metavar="FILE.png", help="draw per-layer horizon profiles and capacity vs W_max")


def parse_wmax_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in str(text).split(",") if v.strip() != ""]
    except ValueError:
        raise UserError(f"--wmax must be an integer or a comma list of integers, got {text!r}") from None
    if not values:
        raise UserError("--wmax is empty")
    return values


def _options(args, wmax: int) -> PlanOptions:
    return PlanOptions(wmax=wmax, tp=args.tp, placement=args.placement, codec=args.codec, layout=args.layout,
                       a=args.a, eps=args.eps, selection=args.selection, mask_seed=args.mask_seed,
                       precision=getattr(args, "precision", "uniform"),
                       conv_codec=getattr(args, "conv_codec", "native"))


def check_output_file(path: str, flag: str) -> None:
    """Refuse an output file we could not write before doing the work that fills it: opening it for
    append is the one test that also holds for root and for special file systems."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UserError(f"{flag} {path} is a directory, not a file")
    if not os.path.isdir(folder):
        raise UserError(f"{flag} {path}: directory {folder} does not exist")
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot write there: {e.strerror or e}") from None
    if not existed:
        os.remove(path)


def check_plot_format(path: str) -> None:
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise UserError("--plot needs matplotlib (pip install matplotlib)") from None
    formats = FigureCanvasBase.get_supported_filetypes()
    # no extension: matplotlib writes its default format (png)
    if ext and ext not in formats:
        raise UserError(f"--plot {path}: unknown image format {ext!r}; use one of {', '.join(sorted(formats))}")


def run(args) -> int:
    wmaxes = parse_wmax_list(args.wmax)
    if args.json and len(wmaxes) != 1:
        raise UserError("--json prints one plan: give a single --wmax")
    if args.plot == "":
        raise UserError("--plot is empty: give the image file to write (FILE.png), or leave --plot out")
    if args.plot:
        check_output_file(args.plot, "--plot")
        check_plot_format(args.plot)
    scaled = args.codec != "native" or getattr(args, "precision", "uniform") != "uniform"
    if scaled and args.temporal_dtype == "float16":
        # a checkpoint keeps a scaled codec's scales in the temporal dtype (state/codec_naive.check_scale_dtype)
        fix = "--precision uniform" if args.codec == "native" else "--codec native"
        raise UserError("--temporal-dtype float16 cannot hold the per-row scales of a scaled codec (int8, fp8, "
                        f"int4 or --precision horizon): use float32 or bfloat16, or {fix}")
    dtypes = {"temporal_dtype": args.temporal_dtype, "conv_dtype": args.conv_dtype}
    reports, horizons = [], None
    for w in wmaxes:
        plan, horizons = plan_from_path(args.model, _options(args, w), **dtypes)
        reports.append(plan.report(args.budget_bytes))
    if args.plot:
        if horizons is None:
            raise UserError("--plot needs the decay weights: pass a checkpoint directory")
        plot_plan(args.plot, plan.config, horizons, _options(args, wmaxes[0]), args.budget_bytes)
    if args.json:
        json.dump(reports[0], sys.stdout)
        sys.stdout.write("\n")
    else:
        print(format_table(reports))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


def format_table(reports: list[dict]) -> str:
    r0 = reports[0]
    lines = [f"model: {r0['model_type']} ({r0['arch']}), {r0['num_linear_layers']} linear layers x "
             f"{r0['units_per_layer'][0]} units; TP{r0['tp']} placement={r0['placement']} codec={r0['codec']} "
             + (f"precision={r0['precision']} " if r0.get("bands") else "")
             + (f"conv_codec={r0['conv_codec']} " if r0.get("conv_codec", "native") != "native" else "") +
             f"layout={r0['layout']}",
             f"dense checkpoint: {r0['dense_slot_bytes_per_rank']:,} B/rank "
             f"(conv {r0['conv_bytes_per_rank']:,} B)"]
    if r0.get("decay_summary"):
        d = r0["decay_summary"]
        lines.append(f"decay alpha median {d['decay_median']:.3f} IQR [{d['decay_iqr'][0]:.3f}, "
                     f"{d['decay_iqr'][1]:.3f}]; horizon median {d['horizon_median']:.1f} tokens")
    budget = "budget_bytes" in r0
    head = f"{'W_max':>6} {'kept':>7} {'C_temp':>7} {'C_pad':>6} {'worst B/rank':>13} {'C_ckpt':>7}"
    head += f" {'slots':>6} {'x dense':>7}" if budget else ""
    head += f" {'moved':>6} {'wr W':>5}"
    lines += ["", head, "-" * len(head)]
    for r in reports:
        kept = sum(r["retained_per_layer"]) / sum(r["units_per_layer"])
        row = (f"{r['wmax']:>6} {kept:>7.1%} {_num(r['compression_temporal']):>7} "
               f"{'-' if r.get('bands') else _num(r['compression_temporal_padded']):>6} {r['bottleneck_slot_bytes']:>13,} "
               f"{r['compression_ckpt']:>7.2f}")
        if budget:
            row += f" {r['slots']:>6} {_num(r['capacity_ratio']):>7}"
        row += f" {r['moved_units_per_store']:>6} {r['wr_window']:>5}"
        lines.append(row)
    if budget:
        lines.append(f"\nbudget {r0['budget_bytes']:,} B/rank: dense {r0['dense_slots']} slots (slot 0 reserved)")
    for r in reports:
        if r.get("bands"):
            lines.append(format_bands(r))
    return "\n".join(lines)


def format_bands(r: dict) -> str:
    """Capacity per horizon band (precision horizon): units, codec, bytes and their share of a checkpoint."""
    total = sum(b["temporal_bytes"] for b in r["bands"]) or 1
    head = f"{'band':>4} {'horizon':>17} {'codec':>6} {'units':>7} {'B/unit':>6} {'temporal B':>12} {'share':>6}"
    lines = ["", f"W_max {r['wmax']}, {r['precision']}: bottleneck {r['bottleneck_slot_bytes']:,} B/rank, "
             f"{r['compression_ckpt']:.2f}x dense", head, "-" * len(head)]
    for b in r["bands"]:
        hi = "inf" if b["horizon_below"] is None else f"{b['horizon_below']:g}"
        # band 0 starts above W_max (a unit whose horizon equals W_max is omitted); later bands include their start
        opening = "[" if b.get("horizon_from_inclusive", True) else "("
        lines.append(f"{b['band']:>4} {opening + format(b['horizon_from'], 'g') + ', ' + hi + ')':>17} {b['codec']:>6} "
                     f"{b['units']:>7} {b['unit_bytes']:>6} {b['temporal_bytes']:>12,} "
                     f"{b['temporal_bytes'] / total:>6.1%}")
    return "\n".join(lines)


def _num(x) -> str:
    # None: nothing kept (the temporal payload is empty), or no dense slot fits the budget
    return "inf" if x is None else f"{x:.2f}"
