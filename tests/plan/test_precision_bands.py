"""Horizon-aware precision (issue 35): bands from horizons, mixed-width Eq. 8 accounting recomputed by hand
from the decay weights, the JSON / table of `dasc plan`, and one-line refusals of bad band specs."""
import json
import math

import numpy as np
import pytest

from plan_helpers import run_dasc, tiny_config, write_decay_checkpoint
from trtllm_dasc.errors import UserError
from trtllm_dasc.plan import DascPlan, PlanOptions, plan_from_path
from trtllm_dasc.plan.precision import parse_precision

# bytes of one kda unit (V = 8 fp32 values, one row): native 32, int8 / fp8 8 + 4, int4 4 + 4
UNIT = {"native": 32, "int8": 12, "fp8": 12, "int4": 8}


def _horizon(a_log, dt):
    sp = math.log1p(math.exp(-0.3 + dt))
    return math.log(1e-3) / (-math.exp(a_log) * sp)


@pytest.fixture
def kda_ckpt(tmp_path):
    """4 heads x 8 channels per layer, 2 linear layers; dt_bias spread so horizons span 1 .. 1e5 tokens."""
    raw = tiny_config("kda", heads=4, dk=8, dv=8)
    rng = np.random.default_rng(5)
    decay = {}
    for layer in (0, 2):
        a_log = rng.uniform(-1, 1, 4).tolist()
        dt = rng.uniform(-12, 1, 32).tolist()
        decay[layer] = (a_log, dt)
    return write_decay_checkpoint(tmp_path / "ck", raw, decay), decay


def _expected(decay, wmax, ths, codecs, tp, placement):
    """Brute force: every unit's horizon, band and bytes; rank = head // (heads / tp) (no permutation)."""
    per_codec_rank = {}
    for a_log, dt in decay.values():
        for u, d in enumerate(dt):
            h = _horizon(a_log[u // 8], d)
            if h <= wmax:
                continue
            codec = codecs[sum(h >= t for t in ths)]
            r = (u // 8) // (4 // tp)
            per_codec_rank.setdefault(codec, [0] * tp)[r] += 1
    conv = 2 * (3 * 4 * 8 // tp) * 3 * 2
    if placement == "off":
        return max(sum(UNIT[c] * n[r] for c, n in per_codec_rank.items()) for r in range(tp)) + conv
    return sum(UNIT[c] * math.ceil(sum(n) / tp) for c, n in per_codec_rank.items()) + conv


@pytest.mark.parametrize("placement,tp", [("off", 2), ("storage", 2), ("off", 1)])
def test_mixed_bottleneck_matches_brute_force(kda_ckpt, placement, tp):
    path, decay = kda_ckpt
    spec = "horizon:40,400:int4,int8,native"
    plan, _ = plan_from_path(str(path), PlanOptions(wmax=8, tp=tp, placement=placement, precision=spec))
    r = plan.report()
    assert r["bottleneck_slot_bytes"] == _expected(decay, 8, (40, 400), ("int4", "int8", "native"), tp, placement)
    counts = {b["codec"]: b["units"] for b in r["bands"]}
    assert sum(counts.values()) == sum(r["retained_per_layer"]) and min(counts.values()) > 0
    # reloadable, with its bands
    again = DascPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again.report() == r


def test_shuffled_bands_are_the_count_matched_control(kda_ckpt):
    """horizon...@seed (issue 35's control): per layer the same number of units of each codec as the horizon
    bands (counted here from the decay weights), so the same bytes at TP 1, but on other units; seeded."""
    from collections import Counter
    path, decay = kda_ckpt
    spec = "horizon:40,400:int4,int8,native"
    codecs = ("int4", "int8", "native")

    def plan(precision):
        return plan_from_path(str(path), PlanOptions(wmax=8, tp=1, placement="off", precision=precision))[0]

    ordered, shuffled, again, other = plan(spec), plan(spec + "@7"), plan(spec + "@7"), plan(spec + "@8")
    assert shuffled.options.precision == spec + "@7"
    moved = 0
    for l, (a_log, dt) in enumerate(decay.values()):
        want = {u: codecs[sum(_horizon(a_log[u // 8], d) >= t for t in (40, 400))]
                for u, d in enumerate(dt) if _horizon(a_log[u // 8], d) > 8}
        got = dict(zip(shuffled.retained[l], (codecs[b] for b in shuffled.retained_bands[l])))
        assert shuffled.retained[l] == ordered.retained[l] == sorted(want)
        assert Counter(got.values()) == Counter(want.values())
        moved += sum(got[u] != want[u] for u in want)
    assert moved > 0
    assert shuffled.retained_bands == again.retained_bands != other.retained_bands
    assert shuffled.report()["bottleneck_slot_bytes"] == ordered.report()["bottleneck_slot_bytes"] == \
        _expected(decay, 8, (40, 400), codecs, 1, "off")


def test_uniform_spec_equals_codec(kda_ckpt):
    """All bands int8 account exactly like --codec int8 (the paper's arm)."""
    path, _ = kda_ckpt
    a = plan_from_path(str(path), PlanOptions(wmax=8, tp=2, placement="storage", codec="int8"))[0].report()
    b = plan_from_path(str(path), PlanOptions(wmax=8, tp=2, placement="storage",
                                              precision="horizon:40:int8,int8"))[0].report()
    assert a["bottleneck_slot_bytes"] == b["bottleneck_slot_bytes"]


def test_cli_json_and_table(kda_ckpt):
    path, decay = kda_ckpt
    code, out, err = run_dasc("plan", "--model", path, "--wmax", "8", "--tp", "2", "--placement", "off",
                              "--precision", "horizon:40,400", "--budget-bytes", "100000", "--json")
    assert code == 0, err
    r = json.loads(out)
    for key in ("arch", "num_linear_layers", "units_per_layer", "retained_per_layer", "dense_slot_bytes_per_rank",
                "slot_bytes_per_rank", "bottleneck_slot_bytes", "compression_temporal", "compression_ckpt",
                "dense_slots", "slots", "bands", "precision", "codec_segments"):
        assert key in r
    assert r["precision"] == "horizon:40,400:int4,int8,native"
    assert [b["codec"] for b in r["bands"]] == ["int4", "int8", "native"]
    assert r["bottleneck_slot_bytes"] == _expected(decay, 8, (40, 400), ("int4", "int8", "native"), 2, "off")
    assert r["slots"] == 100000 // r["bottleneck_slot_bytes"] - 1
    code, out, err = run_dasc("plan", "--model", path, "--wmax", "8", "--tp", "2", "--precision", "horizon:40,400")
    assert code == 0 and "band" in out and "int4" in out and "[40, 400)" in out
    # band 0 is open at W_max: a unit whose horizon equals W_max is omitted, not stored in it
    assert "(8, 40)" in out and "[8, 40)" not in out
    assert [b["horizon_from_inclusive"] for b in r["bands"]] == [False, True, True]


@pytest.mark.parametrize("spec,match", [
    ("horizon:abc", "comma list of integers"),
    ("horizon:400,40", "increase strictly"),
    ("horizon:8,400", "must exceed --wmax"),
    ("horizon:40,400:int4,int8", "need 3 codecs"),
    ("horizon:40,400:int4,int8,int3", "unknown codec"),
    ("horizon:40,400,4000", "default codecs"),
    ("bands:40", "uniform' or 'horizon"),
    ("horizon:40,400@x", "seed after '@'"),
    ("horizon@-3", "seed after '@'"),
    ("horizon:1_000,2_000", "comma list of integers"),
    ("horizon:\u0663\u0662,128", "comma list of integers"),
    ("horizon:--40,400", "comma list of integers"),
    ("horizon:40,400:", "nothing after the second"),
    ("horizon:-40,400", "integers in"),
])
def test_bad_specs_refused_in_one_line(kda_ckpt, spec, match):
    path, _ = kda_ckpt
    with pytest.raises(UserError, match=match):
        parse_precision(spec, 8)
    code, out, err = run_dasc("plan", "--model", path, "--wmax", "8", "--precision", spec)
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1 and match.split()[0] in err


def test_padded_and_codec_conflicts_refused():
    with pytest.raises(UserError, match="ragged"):
        PlanOptions(wmax=8, precision="horizon:40,400", layout="padded")
    with pytest.raises(UserError, match="uniform"):
        PlanOptions(wmax=8, precision="horizon:40,400", codec="int8")


@pytest.mark.parametrize("wmax,spec", [(16, "horizon:128,1024:int4,int8,int8"), (127, "horizon:128,1024:int4,int8,int8"),
                                       (128, "horizon:1024:int8,int8"), (512, "horizon:1024:int8,int8")])
def test_default_bands_drop_thresholds_at_or_below_wmax(wmax, spec):
    """--precision horizon: INT4 below 128 tokens of horizon, INT8 above (chosen by the quality runs in
    docs/quality.md); where W_max leaves the INT4 band empty it goes, rather than refusing the W_max."""
    assert parse_precision("horizon", wmax).spec() == spec
    assert parse_precision("horizon@7", wmax).spec() == spec + "@7"
    assert PlanOptions(wmax=wmax, precision="horizon").precision == spec
    with pytest.raises(UserError, match="1024 must exceed --wmax 1024"):
        parse_precision("horizon", 1024)


@pytest.mark.parametrize("flags", [("--precision", "horizon:40,400:int4,int8,native"), ("--codec", "int4")])
def test_int4_on_an_odd_value_head_dim_is_refused_by_the_plan(tmp_path, flags):
    """dasc plan priced odd int4 rows and dasc-build wrote the engine; it then failed to start (LayoutError:
    value_dim 15 must be even). Now the plan refuses it in one line, for bands and for the uniform codec; the
    same model with int8 plans. From a review helper; fails on the old code."""
    raw = tiny_config("gdn", heads=4, dk=8, dv=15)
    rng = np.random.default_rng(5)
    decay = {layer: (rng.uniform(-1, 1, 4).tolist(), rng.uniform(-12, 1, 4).tolist()) for layer in (0, 2)}
    path = write_decay_checkpoint(tmp_path / "odd", raw, decay)
    code, out, err = run_dasc("plan", "--model", path, "--wmax", "8", *flags)
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "value head dim 15 is odd" in err
    code, out, err = run_dasc("plan", "--model", path, "--wmax", "8", "--codec", "int8")
    assert code == 0, err
