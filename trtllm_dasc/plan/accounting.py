"""Checkpoint bytes, compression ratios and slot counts, exactly as the paper counts them (App. C.1).

    bytes_r     = temporal_r + conv                  conv stays uncompressed in its own dtype
    bottleneck  = max_r bytes_r                      a logical checkpoint spans every rank
    N           = floor(B / bottleneck) - 1          slot 0 is reserved by the allocator
    C_temp      = sum n_l / sum r_l  (ragged)        sum n_l / (L R_max)  (padded)   [x codec bytes]
    C_ckpt      = dense bytes per rank / bottleneck  what capacity grows by at a fixed budget
"""
from __future__ import annotations

from statistics import median

from trtllm_dasc.config import HybridConfig
from trtllm_dasc.errors import UserError
from trtllm_dasc.plan.selection import padded_width, ragged_offsets


def slot_bytes_per_rank(cfg: HybridConfig, tp: int, rank_widths: list[int], codec: str,
                        conv_codec: str = "native") -> list[int]:
    unit = cfg.unit_bytes(codec)
    conv = cfg.conv_bytes_per_rank(tp, conv_codec)
    return [w * unit + conv for w in rank_widths]


def mixed_slot_bytes_per_rank(cfg: HybridConfig, tp: int, codecs: list[str], widths: list[list[int]],
                              conv_codec: str = "native") -> list[int]:
    """Horizon precision (Eq. 8 with mixed widths): rank r stores widths[s][r] units of codec segment s."""
    conv = cfg.conv_bytes_per_rank(tp, conv_codec)
    return [sum(w[r] * cfg.unit_bytes(c) for c, w in zip(codecs, widths)) + conv for r in range(tp)]


def band_report(plan) -> list[dict]:
    """Per horizon band: its codec, horizon range, kept units (model-wide and per rank) and stored bytes."""
    cfg, bands = plan.config, plan.options.bands
    per_rank, upb, tp = cfg.num_bundles // plan.options.tp, cfg.units_per_bundle, plan.options.tp
    units = [[0] * tp for _ in bands.codecs]
    for kept, row, order in zip(plan.retained, plan.retained_bands, plan.bundle_order):
        rank_of_bundle = {b: p // per_rank for p, b in enumerate(order)}
        for u, i in zip(kept, row):
            units[i][rank_of_bundle[u // upb]] += 1
    out = []
    for i, ((lo, hi), codec) in enumerate(zip(bands.ranges(plan.options.wmax), bands.codecs)):
        n = sum(units[i])
        out.append({"band": i, "codec": codec, "horizon_from": lo, "horizon_from_inclusive": i > 0,
                    "horizon_below": None if hi == float("inf") else hi,
                    "units": n, "units_per_rank": units[i], "unit_bytes": cfg.unit_bytes(codec),
                    "temporal_bytes": n * cfg.unit_bytes(codec)})
    return out


MAX_BUDGET_BYTES = 2**63 - 1


def slots_for_budget(budget_bytes: int, slot_bytes: int, what: str = "one slot", allow_none: bool = False) -> int:
    """Deployable slots N = floor(B / b) - 1; a budget that holds none is an error (``what`` names the slot
    in it), unless ``allow_none`` (the dense comparison arm of a plan that does fit)."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0:
        raise UserError(f"the checkpoint budget must be a positive integer of bytes, got {budget_bytes!r}")
    if budget_bytes > MAX_BUDGET_BYTES:
        raise UserError(f"the checkpoint budget must be at most 2^63 - 1 bytes (int64), got {budget_bytes}")
    n = budget_bytes // slot_bytes - 1
    if n < 1 and not allow_none:
        raise UserError(f"budget of {budget_bytes} B holds no deployable slot: {what} takes {slot_bytes} B "
                        f"per rank and slot 0 is reserved, so at least {2 * slot_bytes} B are needed")
    return max(n, 0)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def report(plan, budget_bytes: int | None = None) -> dict:
    """The `dasc plan --json` object: the contract keys first, then the plan itself (reloadable)."""
    cfg, opt = plan.config, plan.options
    units = [cfg.units_per_layer] * cfg.num_linear_layers
    kept = [len(k) for k in plan.retained]
    native_unit, unit = cfg.unit_bytes("native"), cfg.unit_bytes(opt.codec)
    dense_temporal = sum(units) * native_unit
    stored_units = sum(kept) if opt.layout == "ragged" else cfg.num_linear_layers * padded_width(kept)
    slot_bytes = plan.slot_bytes_per_rank()
    dense = cfg.dense_checkpoint_bytes_per_rank(opt.tp)
    bottleneck = max(slot_bytes)
    conv = cfg.conv_bytes_per_rank(opt.tp, opt.conv_codec)
    out = {
        "arch": cfg.arch,
        "model_type": cfg.model_type,
        "num_linear_layers": cfg.num_linear_layers,
        "units_per_layer": units,
        "retained_per_layer": kept,
        "dense_slot_bytes_per_rank": dense,
        "slot_bytes_per_rank": slot_bytes,
        "bottleneck_slot_bytes": bottleneck,
        # model-wide temporal payload ratio (paper Sec. 4.1 / App. B), in bytes so the codec counts
        "compression_temporal": _ratio(dense_temporal, stored_units * unit),
        "compression_ckpt": dense / bottleneck,
        "wmax": opt.wmax, "tp": opt.tp, "placement": opt.placement, "codec": opt.codec, "layout": opt.layout,
        "precision": opt.precision, "conv_codec": opt.conv_codec,
        "a": opt.a, "eps": opt.eps,
        "temporal_dtype": cfg.temporal_dtype, "conv_dtype": cfg.conv_dtype,
        "unit_bytes": unit,
        "conv_bytes_per_rank": conv,
        "temporal_bytes_per_rank": [b - conv for b in slot_bytes],
        "units_per_rank": plan.rank_units(),
        "slot_units_per_rank": plan.rank_widths(),
        "ragged_offsets_per_rank": [ragged_offsets([len(units) for units in plan.local_retained(r)])
                                    for r in range(opt.tp)],
        "padded_width": padded_width(kept),
        "compression_temporal_ragged": _ratio(dense_temporal, sum(kept) * unit),
        "compression_temporal_padded": _ratio(dense_temporal, cfg.num_linear_layers * padded_width(kept) * unit),
        "layout_gain": _ratio(padded_width(kept), sum(kept) / len(kept)) if kept else None,
        "moved_units_per_store": plan.moved_units,
        "median_retained_fraction": median(k / n for k, n in zip(kept, units)),
        # the replay window under the report's JSON key (kept: a contract)
        "wr_window": plan.replay_window,
        "permutation_optimal": plan.permutation_optimal,
    }
    if budget_bytes is not None:
        out["budget_bytes"] = budget_bytes
        # the plan asked about must fit; the dense arm it is compared with may not (then 0 slots, no ratio)
        out["slots"] = slots_for_budget(budget_bytes, bottleneck, f"one slot of this plan (W_max={opt.wmax}, "
                                        f"{opt.layout}, {opt.codec}, TP{opt.tp} {opt.placement})")
        out["dense_slots"] = slots_for_budget(budget_bytes, dense, allow_none=True)
        out["capacity_ratio"] = _ratio(out["slots"], out["dense_slots"])
    if opt.bands is not None:
        _mixed_keys(plan, out, dense_temporal)
    out.update(plan.to_dict())
    return out


def _mixed_keys(plan, out: dict, dense_temporal: int) -> None:
    """Horizon precision: the contract keys recomputed over mixed unit widths, plus the bands."""
    bands = band_report(plan)
    stored = sum(b["temporal_bytes"] for b in bands)
    kept = sum(b["units"] for b in bands)
    out["codec"] = "mixed"
    out["precision"] = plan.options.precision
    out["unit_bytes"] = stored / kept if kept else None
    out["compression_temporal"] = out["compression_temporal_ragged"] = _ratio(dense_temporal, stored)
    out["compression_temporal_padded"] = None
    out["bands"] = bands
    out["codec_segments"] = [{"codec": c, "unit_bytes": plan.config.unit_bytes(c), "slot_units_per_rank": w}
                             for c, w in zip(plan.codec_segments, plan.segment_widths())]

