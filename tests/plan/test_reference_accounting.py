"""The paper's matched-HBM accounting (App. C.1) on the released models' configs, through the real CLI."""
import json

import pytest

from plan_helpers import KIMI_REF, QWEN_REF, run_dasc


@pytest.mark.parametrize("config,budget,dense,slots", [
    (KIMI_REF, 694_681_600, 5_427_200, 127),
    (QWEN_REF, 1_236_271_104, 9_658_368, 127),
], ids=["kimi-linear-48b-TP8", "qwen3-next-80b-TP8"])
def test_dense_checkpoint_and_slots_match_paper(config, budget, dense, slots):
    code, out, err = run_dasc("plan", "--model", config, "--wmax", "0", "--tp", "8", "--budget-bytes", budget,
                              "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["dense_slot_bytes_per_rank"] == dense
    assert r["slots"] == slots and r["dense_slots"] == slots
    assert r["slot_bytes_per_rank"] == [dense] * 8
    assert r["bottleneck_slot_bytes"] == dense
    assert r["compression_temporal"] == 1.0 and r["compression_ckpt"] == 1.0


def test_dense_bytes_by_hand():
    # kimi: 20 kda layers; per rank 32/8 heads x 128 x 128 fp32 + conv 3*32*128/8 channels x 3 taps bf16
    assert 20 * (4 * 128 * 128 * 4 + 3 * 32 * 128 // 8 * 3 * 2) == 5_427_200
    # qwen: 36 gdn layers; per rank 32/8 value heads x 128 x 128 fp32 + conv (2*16*128 + 32*128)/8 x 3 bf16
    assert 36 * (4 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) // 8 * 3 * 2) == 9_658_368


def test_int8_temporal_ratio_is_papers_3_88():
    # App. E.1: int8 payload + one fp32 scale per (l, h, k) gives 3.88x on the temporal payload, not 4x
    code, out, err = run_dasc("plan", "--model", KIMI_REF, "--wmax", "0", "--tp", "8", "--codec", "int8", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert round(r["compression_temporal"], 2) == 3.88
    # kda unit = one channel column: 128 int8 values + one fp32 scale
    assert r["unit_bytes"] == 128 + 4
    assert r["bottleneck_slot_bytes"] == 20 * 4 * 128 * (128 + 4) + 184_320


def test_table_output_is_readable():
    code, out, err = run_dasc("plan", "--model", QWEN_REF, "--wmax", "0", "--tp", "8", "--budget-bytes",
                              1_236_271_104)
    assert code == 0, err
    assert "qwen3_next (gdn), 36 linear layers" in out and "9,658,368" in out and " 127 " in out
