"""The paper's matched-HBM accounting (App. C.1) on the released models' configs, through the real CLI."""
import json
from pathlib import Path

import pytest

from plan_helpers import KIMI_REF, QWEN_REF, run_dasc
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.plan.accounting import slots_for_budget
from trtllm_dasc.state.layout import StateLayout


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


SHARED = Path("/work/shared/reference")
PAPER = [  # config, dense bytes per rank at TP8, the paper's budget, deployable dense slots
    (KIMI_REF, 5_427_200, 694_681_600, 127),
    (QWEN_REF, 9_658_368, 1_236_271_104, 127),
    (SHARED / KIMI_REF.name, 5_427_200, 694_681_600, 127),
    (SHARED / QWEN_REF.name, 9_658_368, 1_236_271_104, 127),
]


@pytest.mark.parametrize("config,dense,budget,slots", PAPER,
                         ids=["kimi-tests-data", "qwen-tests-data", "kimi-shared-reference", "qwen-shared-reference"])
def test_dense_bytes_and_slots_through_the_api(config, dense, budget, slots):
    """The planner's config, the state store's layout and the slot rule all give the paper's numbers."""
    if not config.is_file():
        pytest.skip(f"{config} is not on this machine")
    cfg = HybridConfig.from_path(str(config))
    assert cfg.dense_checkpoint_bytes_per_rank(8) == dense
    layout = StateLayout.from_config(cfg, 8)
    assert layout.slot_bytes() == dense
    assert layout.conv_bytes_per_slot() == cfg.conv_bytes_per_rank(8)
    assert slots_for_budget(budget, dense) == slots
    # one byte less than 128 slots' worth loses the 127th deployable slot
    assert slots_for_budget(128 * dense - 1, dense) == 126


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
