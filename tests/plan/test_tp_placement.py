"""TP placement: bundle permutation (bijection, brute-force optimal) and storage balancing (simulated)."""
import itertools
import json
import math
import random

import pytest

from plan_helpers import run_dasc
from trtllm_dasc.plan import DascPlan, PlanOptions, plan_from_path
from trtllm_dasc.plan.permutation import balance_bundles
from trtllm_dasc.plan.storage import balance_segment


def worst_rank_by_brute_force(loads, tp):
    """Try every split of every layer's bundles into tp equal groups (all rank assignments)."""
    per = len(loads[0]) // tp

    def splits(bundles):
        # all ordered partitions of the bundle list into tp groups of size per
        if not bundles:
            yield []
            return
        for first in itertools.combinations(bundles, per):
            rest = [b for b in bundles if b not in first]
            for tail in splits(rest):
                yield [first] + tail

    per_layer = [list(splits(list(range(len(row))))) for row in loads]
    best = math.inf
    for choice in itertools.product(*per_layer):
        totals = [sum(sum(loads[l][b] for b in choice[l][r]) for l in range(len(loads))) for r in range(tp)]
        best = min(best, max(totals))
    return best


def rank_totals(loads, order, tp):
    per = len(order[0]) // tp
    return [sum(loads[l][order[l][p]] for l in range(len(loads)) for p in range(r * per, (r + 1) * per))
            for r in range(tp)]


CASES = [(layers, bundles, tp, seed) for seed in range(6) for layers, bundles, tp in
         [(2, 4, 2), (3, 4, 2), (2, 6, 3), (3, 6, 2), (2, 6, 2)]]


@pytest.mark.parametrize("layers,bundles,tp,seed", CASES,
                         ids=[f"L{l}-B{b}-T{t}-s{s}" for l, b, t, s in CASES])
def test_permutation_is_optimal_on_brute_forceable_cases(layers, bundles, tp, seed):
    rng = random.Random(seed)
    upb = 8
    loads = [[rng.choice([0, 0, 1, 2, 5, 8, 8]) if seed % 2 else rng.randint(0, upb) for _ in range(bundles)]
             for _ in range(layers)]
    perm = balance_bundles(loads, tp)
    for order in perm.bundle_order:
        assert sorted(order) == list(range(bundles))           # a bijection over whole bundles
    assert perm.rank_loads == rank_totals(loads, perm.bundle_order, tp)
    assert max(perm.rank_loads) == worst_rank_by_brute_force(loads, tp)
    assert perm.optimal


def test_hybrid_plan_permutes_whole_gdn_bundles(synthetic_gdn):
    plan, _ = plan_from_path(synthetic_gdn, PlanOptions(wmax=512, tp=8, placement="hybrid"))
    cfg = plan.config
    upb = cfg.units_per_bundle                                 # 2 value heads per key head
    for l, order in enumerate(plan.bundle_order):
        assert sorted(order) == list(range(cfg.num_bundles))
        kept = set(plan.retained[l])
        for r in range(8):
            local = plan.local_retained(r)[l]
            # recompute by hand which original value heads rank r computes
            mine = [b * upb + j for b in order[r * 2:(r + 1) * 2] for j in range(upb)]
            assert len(local) == sum(u in kept for u in mine)
            assert all(0 <= u < cfg.shard(8).units for u in local)
    off, _ = plan_from_path(synthetic_gdn, PlanOptions(wmax=512, tp=8, placement="off"))
    assert max(plan.rank_units()) <= max(off.rank_units())
    assert sum(plan.rank_units()) == sum(off.rank_units())


def simulate_store_and_load(counts, width, transfers):
    """Units are (rank, position) tags; apply the transfers to per-rank slot arrays, then invert."""
    compute = [[(r, p) for p in range(c)] for r, c in enumerate(counts)]
    slots = [[None] * width for _ in counts]
    for r, units in enumerate(compute):
        for p in range(min(len(units), width)):
            slots[r][p] = units[p]
    for t in transfers:
        for i in range(t.count):
            assert slots[t.dst][t.dst_start + i] is None      # never overwrite a stored unit
            slots[t.dst][t.dst_start + i] = compute[t.src][t.src_start + i]
    restored = [[None] * c for c in counts]
    for r in range(len(counts)):
        for p in range(min(counts[r], width)):
            restored[r][p] = slots[r][p]
    for t in transfers:                                        # the inverse all-to-all
        for i in range(t.count):
            restored[t.src][t.src_start + i] = slots[t.dst][t.dst_start + i]
    return compute, slots, restored


@pytest.mark.parametrize("seed", range(30))
def test_storage_plan_moves_each_unit_once_and_inverts(seed):
    rng = random.Random(seed)
    tp = rng.choice([2, 3, 4, 8])
    counts = [rng.choice([0, 1, 5, 17, 40, 41, 100]) for _ in range(tp)]
    width, transfers = balance_segment(counts)
    assert width == math.ceil(sum(counts) / tp)
    compute, slots, restored = simulate_store_and_load(counts, width, transfers)
    stored = [u for rank in slots for u in rank if u is not None]
    assert sorted(stored) == sorted(u for rank in compute for u in rank)   # each unit stored exactly once
    assert all(len([u for u in rank if u is not None]) <= width for rank in slots)
    assert restored == compute
    # only surplus moves: the minimum possible traffic
    assert sum(t.count for t in transfers) == sum(max(0, c - width) for c in counts)
    assert all(t.src != t.dst for t in transfers)


def test_storage_and_hybrid_share_worst_rank_bytes(synthetic_kda):
    # the paper: both balanced arms have the same worst-rank bytes and slots at a fixed W_max
    reports = {}
    for placement in ("off", "storage", "hybrid"):
        plan, _ = plan_from_path(synthetic_kda, PlanOptions(wmax=16, tp=8, placement=placement))
        reports[placement] = plan.report(694_681_600)
    assert reports["storage"]["bottleneck_slot_bytes"] == reports["hybrid"]["bottleneck_slot_bytes"]
    assert reports["storage"]["slots"] == reports["hybrid"]["slots"] > reports["off"]["slots"]
    assert reports["hybrid"]["moved_units_per_store"] <= reports["storage"]["moved_units_per_store"]
    total = sum(reports["off"]["retained_per_layer"])
    assert reports["storage"]["slot_units_per_rank"] == [math.ceil(total / 8)] * 8


def test_plan_json_round_trip_and_tamper_check(synthetic_kda, tmp_path):
    code, out, err = run_dasc("plan", "--model", synthetic_kda, "--wmax", "64", "--tp", "4", "--placement",
                              "storage", "--json")
    assert code == 0, err
    d = json.loads(out)
    plan = DascPlan.from_dict(d)
    again = plan.report()
    for key in ("slot_bytes_per_rank", "retained_per_layer", "storage_transfers", "bundle_order"):
        assert again[key] == d[key]
    d["retained_units"][0] = d["retained_units"][0][1:]
    with pytest.raises(ValueError, match="edited"):
        DascPlan.from_dict(d)


@pytest.mark.parametrize("layout", ["ragged", "padded"])
def test_transfer_unit_lists_are_exact(synthetic_kda, layout):
    plan, _ = plan_from_path(synthetic_kda, PlanOptions(wmax=128, tp=8, placement="storage", layout=layout))
    moved = []
    for t in plan.storage.transfers:
        units = plan.transfer_units(t)
        assert len(units) == t.count
        local = plan.local_retained(t.src)
        assert all(u in local[l] for l, u in units)            # only units the source really computes
        moved += [(t.src, l, u) for l, u in units]
    assert len(moved) == len(set(moved)) == plan.moved_units  # each moved once
    widths = plan.rank_widths()
    assert len(set(widths)) == 1
    if layout == "padded":
        # per-layer balance: every layer reserves the widest balanced layer's width
        kept = plan.report()["retained_per_layer"]
        assert widths[0] == len(kept) * max(math.ceil(k / 8) for k in kept)


@pytest.mark.parametrize("placement", ["off", "hybrid"])
@pytest.mark.parametrize("edit, needle", [
    (lambda row, n: row + [n + 40], "out of range"),
    (lambda row, n: [-1] + row, "out of range"),
    (lambda row, n: row + row[-1:], "sorted unit ids without repeats"),
    (lambda row, n: row[::-1], "sorted unit ids without repeats"),
    (lambda row, n: row[:1] + [str(row[1])] + row[2:], "integer"),
])
def test_plan_json_with_bad_unit_ids_is_one_line(synthetic_kda, placement, edit, needle):
    """An edited (or corrupt) plan.json naming a unit past the layer's units made the engine's load fail with
    `KeyError: 333` (placement hybrid / storage's bundle lookup) and a repeated or unsorted id was served as if
    valid; from a review reproduction (an engine's plan.json edited, then served). Fails on the old code."""
    from trtllm_dasc.errors import UserError
    plan, _ = plan_from_path(synthetic_kda, PlanOptions(wmax=64, tp=2, placement=placement))
    d = json.loads(json.dumps(plan.to_dict()))
    layer = next(i for i, row in enumerate(d["retained_units"]) if len(row) >= 2)
    d["retained_units"][layer] = edit(d["retained_units"][layer], plan.config.units_per_layer)
    with pytest.raises(UserError, match=needle) as info:
        DascPlan.from_dict(d)
    assert f"layer {layer}" in str(info.value) and "\n" not in str(info.value)
