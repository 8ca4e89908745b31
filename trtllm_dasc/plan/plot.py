"""Figures for `dasc plan --plot`: per-layer horizon profiles (paper Figs. 4-6) and capacity vs W_max."""
from __future__ import annotations

import dataclasses

import numpy as np

from trtllm_dasc.config import HybridConfig
from trtllm_dasc.errors import UserError
from trtllm_dasc.plan.plan import PlanOptions, build_plan

SWEEP = (0, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def capacity_curve(cfg: HybridConfig, horizons, options: PlanOptions, placement: str, layout: str):
    """C_ckpt (dense bytes / worst-rank bytes) at every W_max of SWEEP."""
    out = []
    for w in SWEEP:
        opt = dataclasses.replace(options, wmax=w, placement=placement, layout=layout)
        plan = build_plan(cfg, horizons, opt)
        out.append(cfg.dense_checkpoint_bytes_per_rank(opt.tp) / plan.bottleneck_slot_bytes())
    return out


def plot_plan(path: str, cfg: HybridConfig, horizons, options: PlanOptions, budget_bytes=None) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot needs matplotlib (pip install matplotlib)") from None

    fig, (ax_h, ax_c) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [1.4, 1]})
    # rows: linear layers in model order; columns: units in architectural order (head-major)
    grid = np.log10(np.clip(np.stack(horizons), 1e-1, 1e6))
    im = ax_h.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest")
    ax_h.set_xlabel(f"unit: {cfg.family.unit_name}, architectural order")
    ax_h.set_ylabel("linear layer (model layer id)")
    ax_h.set_yticks(range(len(cfg.linear_layers)))
    ax_h.set_yticklabels([str(i) for i in cfg.linear_layers], fontsize=6)
    ax_h.set_title(f"static horizons log10(H_s)  (a={options.a}, eps={options.eps})")
    fig.colorbar(im, ax=ax_h, label="log10 tokens")
    if options.wmax > 0:
        kept = [(h > options.wmax).mean() for h in horizons]
        ax_k = ax_h.twiny()
        ax_k.plot(kept, range(len(kept)), "w.-", lw=1)
        ax_k.set_xlim(0, 1)
        ax_k.set_xlabel(f"kept fraction at W_max={options.wmax} (white)")
    for placement, style in (("off", "o--"), ("storage", "s-"), ("hybrid", "^-")):
        ax_c.plot(SWEEP[1:], capacity_curve(cfg, horizons, options, placement, "ragged")[1:], style,
                  label=f"ragged, {placement}")
    ax_c.plot(SWEEP[1:], capacity_curve(cfg, horizons, options, "off", "padded")[1:], "x:", label="padded, off")
    ax_c.set_xscale("log", base=2)
    ax_c.set_xlabel("W_max (tokens)")
    ax_c.set_ylabel("checkpoint capacity x dense (C_ckpt)")
    ax_c.set_title(f"capacity vs W_max, TP{options.tp}, codec {options.codec}")
    ax_c.grid(alpha=0.3)
    ax_c.legend()
    fig.suptitle(f"{cfg.model_type}: {cfg.num_linear_layers} {cfg.arch} layers")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as e:
        # an unwritable path, or an extension matplotlib has no writer for
        raise UserError(f"--plot {path}: cannot write the figure: {getattr(e, 'strerror', None) or e}") from None
    finally:
        plt.close(fig)
