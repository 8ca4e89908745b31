"""benchmarks/state_bandwidth.py times the planner's masks: for both reference models at W_max 16 and 128,
the timed lists are one TP8 rank's share of the units whose static horizon exceeds W_max, recomputed here
from the same decay tensors by DESIGN.md's formula (not by the planner's code)."""
from __future__ import annotations

import dataclasses
import filecmp
from pathlib import Path

import numpy as np
import pytest

from benchmarks import state_bandwidth as bw

ROOT = Path(__file__).resolve().parents[2]

# DESIGN.md item 1
A, EPS, TP = -0.3, 1e-3, 8


def kept_units(cfg, wmax: int) -> list[set[int]]:
    """Per linear layer, the unit ids with H_s = ln(eps) / g > W_max, g = -exp(A_log) * softplus(a + dt_bias)."""
    A_log, dt_bias = bw.decay_weights(cfg)
    per_head = dt_bias.shape[1] // A_log.shape[1]
    out = []
    for a_log, dt in zip(A_log.astype(np.float64), dt_bias.astype(np.float64)):
        # a head's rate covers each of its units (gdn: the head itself, kda: its key channels)
        g = -np.repeat(np.exp(a_log), per_head) * np.log1p(np.exp(A + dt))
        out.append({u for u, h in enumerate(np.log(EPS) / g) if h > wmax})
    return out


def to_global(plan, rank: int, lists: list[list[int]]) -> list[set[int]]:
    """Local unit ids of ``rank`` -> original ids: local bundle slot p of the rank holds bundle_order[l][p]."""
    cfg = plan.config
    per_rank, upb = cfg.num_bundles // TP, cfg.units_per_bundle
    return [{order[rank * per_rank + u // upb] * upb + u % upb for u in local}
            for order, local in zip(plan.bundle_order, lists)]


def check_rank_share(masks, kept: list[set[int]]) -> None:
    plan, n_local = masks.plan, bw.MODELS[masks.model]["n"]
    assert len(masks.lists) == len(kept) == bw.MODELS[masks.model]["L"]
    for local in masks.lists:
        assert local == sorted(set(local)) and all(0 <= u < n_local for u in local)
    # every rank's share, in original ids: disjoint, together exactly the kept set
    shares = [to_global(plan, r, masks.lists if r == masks.rank else plan.local_retained(r)) for r in range(TP)]
    for layer, want in enumerate(kept):
        per_rank = [s[layer] for s in shares]
        assert set().union(*per_rank) == want
        assert sum(map(len, per_rank)) == len(want)
    # the timed rank is the most loaded one (its own slot is the widest)
    counts = [[len(s[layer]) for layer in range(len(kept))] for s in shares]
    width = sum if plan.options.layout == "ragged" else (lambda c: len(c) * max(c))
    assert width(counts[masks.rank]) == max(width(c) for c in counts)
    rec = masks.record()
    assert rec["retained_per_layer"] == counts[masks.rank] and rec["retained_sum"] == sum(counts[masks.rank])


@pytest.mark.parametrize("layout", ["ragged", "padded"])
@pytest.mark.parametrize("wmax", [16, 128])
@pytest.mark.parametrize("model", list(bw.MODELS))
def test_plan_masks_are_a_rank_share_of_the_kept_units(model, wmax, layout):
    (masks,) = bw.plan_masks(model, [wmax], layout)
    assert (masks.model, masks.wmax, masks.source) == (model, wmax, "plan")
    kept = kept_units(bw.reference_config(model), wmax)
    total = sum(map(len, kept))
    # a threshold that keeps some units and drops others, or the check below proves little
    assert 0 < total < bw.MODELS[model]["L"] * bw.MODELS[model]["n"] * TP
    check_rank_share(masks, kept)
    # ragged: the engine's default placement; padded: hybrid would move units (refused there), so off
    assert masks.placement == ("hybrid" if layout == "ragged" else "off")


@pytest.mark.parametrize("model", list(bw.MODELS))
def test_the_check_rejects_other_masks(model):
    (masks,) = bw.plan_masks(model, [128], "ragged")
    kept16 = kept_units(bw.reference_config(model), 16)
    # the W_max 128 plan is not a share of what W_max 16 keeps
    with pytest.raises(AssertionError):
        check_rank_share(masks, kept16)
    # nor are the old random-fraction masks a share of the planner's selection
    kept128 = kept_units(bw.reference_config(model), 128)
    with pytest.raises(AssertionError):
        check_rank_share(dataclasses.replace(masks, lists=bw.random_masks(model, 128).lists), kept128)


def test_reference_configs_are_the_shared_ones():
    shared = ROOT.parent / "shared" / "reference"
    if not shared.is_dir():
        pytest.skip(f"{shared} is not here (the benchmark's copies live in tests/data)")
    for name in bw.REFERENCE.values():
        assert filecmp.cmp(Path(bw.REFERENCE_DIR) / name, shared / name, shallow=False)


def test_bytes_without_the_conv_copy_are_the_units_alone():
    # by hand: 2 layers x 3 units of 2 x 4 fp32, half kept; conv 6 x 3 per layer in bf16 (2 B read, 2 written)
    from state_helpers import make_layout
    lay = make_layout(2, 3, 2, 4, keep=0.5, conv=(6, 3))
    conv = 2 * 6 * 3 * (2 + 2)
    for op in ("store", "load"):
        assert bw.bytes_moved(lay, op, 5) - bw.bytes_moved(lay, op, 5, with_conv=False) == 5 * conv
    units = lay.num_retained * 2 * 4
    assert bw.bytes_moved(lay, "store", 1, with_conv=False) == units * 4 + lay.num_retained * lay.unit_bytes()
