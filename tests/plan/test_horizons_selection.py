"""Hand-computed small cases: horizons, retained counts, offsets, padded vs ragged, INT8 bytes, wr window."""
import math

import pytest

from plan_helpers import tiny_config, write_decay_checkpoint, run_dasc
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.plan import PlanOptions, plan_from_path
from trtllm_dasc.plan.selection import replay_unit_window


def inv_softplus(y):
    return y + math.log(-math.expm1(-y))


def horizon_by_hand(a_log, dt_bias, a=-0.3, eps=1e-3):
    g = -math.exp(a_log) * math.log1p(math.exp(a + dt_bias))
    return math.log(eps) / g


def dt_for_horizon(h, a_log, a=-0.3, eps=1e-3):
    """dt_bias that makes the static horizon exactly h tokens."""
    g = math.log(eps) / h
    return inv_softplus(-g / math.exp(a_log)) - a


def test_gdn_horizons_by_hand(tmp_path):
    # softplus(-0.3 + 0.3) = ln 2, exp(ln 2) = 2: g = -2 ln 2, H = ln(1e-3) / g = 4.98 tokens
    raw = tiny_config("gdn", heads=4, key_heads=2)
    a_log, dt = [math.log(2.0), 0.0, 1.0, -1.0], [0.3, 0.3, -2.0, 4.0]
    ck = write_decay_checkpoint(tmp_path / "m", raw, {0: (a_log, dt), 2: (a_log, dt)})
    plan, horizons = plan_from_path(str(ck), PlanOptions(wmax=5))
    expected = [horizon_by_hand(x, y) for x, y in zip(a_log, dt)]
    assert horizons[0].tolist() == pytest.approx(expected, rel=1e-6)
    assert expected[0] == pytest.approx(math.log(1e-3) / (-2 * math.log(2)))
    kept = [u for u, h in enumerate(expected) if h > 5]
    assert plan.retained == [kept, kept]


def test_kda_horizon_per_channel_uses_head_A_log(tmp_path):
    raw = tiny_config("kda", heads=2, dk=3, dv=3)
    a_log = [0.0, math.log(3.0)]
    dt = [0.1, 0.2, 0.3, -0.1, -0.2, -0.3]
    ck = write_decay_checkpoint(tmp_path / "m", raw, {0: (a_log, dt), 2: (a_log, dt)})
    _, horizons = plan_from_path(str(ck), PlanOptions(wmax=0))
    expected = [horizon_by_hand(a_log[u // 3], dt[u]) for u in range(6)]
    assert horizons[1].tolist() == pytest.approx(expected, rel=1e-6)


def _kda_checkpoint(tmp_path, horizons_per_layer, heads=2, dk=4):
    """A kda checkpoint whose static horizons are exactly the given numbers (A_log = 0)."""
    types = ["linear_attention"] * len(horizons_per_layer)
    raw = tiny_config("kda", heads=heads, dk=dk, dv=dk, layer_types=types)
    decay = {l: ([0.0] * heads, [dt_for_horizon(h, 0.0) for h in hs]) for l, hs in enumerate(horizons_per_layer)}
    return write_decay_checkpoint(tmp_path / "m", raw, decay)


HS = [[100, 3, 40, 7, 2, 2, 2, 2],       # layer 0: 2 kept at W=16 (units 0, 2)
      [20, 20, 20, 20, 20, 20, 1, 1],    # layer 1: 6 kept
      [3, 3, 3, 3, 3, 3, 3, 300]]        # layer 2: 1 kept


def test_retained_counts_offsets_and_layout_ratios(tmp_path):
    ck = _kda_checkpoint(tmp_path, HS)
    plan, _ = plan_from_path(str(ck), PlanOptions(wmax=16, placement="off"))
    r = plan.report()
    assert r["retained_per_layer"] == [2, 6, 1]
    assert plan.retained == [[0, 2], [0, 1, 2, 3, 4, 5], [7]]
    assert r["ragged_offsets_per_rank"] == [[0, 2, 8, 9]]
    # ragged: 24 / 9; padded: 24 / (3 * 6)
    assert r["compression_temporal"] == pytest.approx(24 / 9)
    assert r["compression_temporal_padded"] == pytest.approx(24 / 18)
    assert r["layout_gain"] == pytest.approx(6 / 3)
    unit = 4 * 4                                   # d_v fp32
    conv = 3 * (3 * 2 * 4) * 3 * 2                # layers x 3*H*dk channels x 3 taps x bf16
    assert r["slot_bytes_per_rank"] == [9 * unit + conv]
    assert r["dense_slot_bytes_per_rank"] == 24 * unit + conv
    padded, _ = plan_from_path(str(ck), PlanOptions(wmax=16, placement="off", layout="padded"))
    assert padded.report()["slot_bytes_per_rank"] == [3 * 6 * unit + conv]


def test_int8_bytes_by_hand(tmp_path):
    ck = _kda_checkpoint(tmp_path, HS)
    plan, _ = plan_from_path(str(ck), PlanOptions(wmax=16, placement="off", codec="int8"))
    conv = 3 * 24 * 3 * 2
    # kda unit: 4 int8 values + one fp32 scale
    assert plan.report()["slot_bytes_per_rank"] == [9 * (4 + 4) + conv]
    gdn = HybridConfig.from_dict(tiny_config("gdn", heads=4, key_heads=2, dk=8, dv=6))
    # gdn unit = whole head: 6 x 8 int8 + 8 fp32 scales (one per key channel, shared over d_v)
    assert gdn.unit_bytes("int8") == 6 * 8 + 8 * 4
    assert gdn.unit_bytes("native") == 6 * 8 * 4


def test_wmax_zero_keeps_everything_even_short_horizons(tmp_path):
    ck = _kda_checkpoint(tmp_path, HS)
    plan, _ = plan_from_path(str(ck), PlanOptions(wmax=0))
    assert [len(k) for k in plan.retained] == [8, 8, 8] and plan.replay_window == 0


@pytest.mark.parametrize("h,w,expected", [(5.3, 16, 8), (2.0, 16, 4), (0.5, 16, 4), (16.0, 16, 16),
                                          (40.0, 48, 48), (33.0, 512, 64), (9.0, 8, 8)])
def test_replay_unit_window(h, w, expected):
    assert replay_unit_window(h, w) == expected


def test_replay_window_is_longest_omitted(tmp_path):
    ck = _kda_checkpoint(tmp_path, HS)
    plan, _ = plan_from_path(str(ck), PlanOptions(wmax=16))
    # omitted horizons: max is 7 (layer 0) -> rounded up to 8
    assert plan.replay_window == 8
    plan, _ = plan_from_path(str(ck), PlanOptions(wmax=30))
    # now the 20-token units are omitted too -> 32 clamped to W_max 30
    assert plan.replay_window == 30


def test_a_and_eps_are_overridable(tmp_path):
    ck = _kda_checkpoint(tmp_path, HS)
    _, h_default = plan_from_path(str(ck), PlanOptions(wmax=0))
    _, h_eps = plan_from_path(str(ck), PlanOptions(wmax=0, eps=1e-2))
    # H scales with ln(eps) at fixed g
    assert h_eps[0][0] == pytest.approx(h_default[0][0] * math.log(1e-2) / math.log(1e-3))
    _, h_a = plan_from_path(str(ck), PlanOptions(wmax=0, a=0.0))
    assert h_a[0][0] < h_default[0][0]           # a = 0 decays faster than a = -0.3


def test_sharded_read_touches_only_decay_shards(tmp_path, synthetic_kda):
    import json, os, shutil
    ck = tmp_path / "sharded"
    shutil.copytree(synthetic_kda, ck)
    index = json.loads((ck / "model.safetensors.index.json").read_text())
    # a weight in a shard that does not exist: the planner must never open it
    index["weight_map"]["model.layers.0.mlp.down_proj.weight"] = "model-99999-of-99999.safetensors"
    (ck / "model.safetensors.index.json").write_text(json.dumps(index))
    code, out, err = run_dasc("plan", "--model", ck, "--wmax", "16", "--tp", "8", "--json")
    assert code == 0, err
    assert not os.path.exists(ck / "model-99999-of-99999.safetensors")
