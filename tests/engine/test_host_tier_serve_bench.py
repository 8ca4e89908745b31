"""benchmarks/host_tier_serve.py on CPU (--smoke): the JSON holds both arms' protocol blocks, whose hit rates
the client's records and the engine's own counters agree on, a host arm whose host hits and copy bytes follow
from the planner's slot size, the copies part, and the issue's targets written down with the verdict."""
from __future__ import annotations

import json
import math

import pytest

from benchmarks import host_tier_serve as bench


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("host-tier-serve") / "r.json"
    assert bench.main(["--smoke", "--out", str(out), "--commit", "abc"]) == 0
    return json.loads(out.read_text())


def test_smoke_records_the_protocol_and_the_tier(result):
    assert result["command"].startswith("python -m benchmarks host_tier_serve --smoke")
    assert result["commit"] == "abc"
    assert result["targets"] == {"hit_rate_ratio_min": 2.0, "ttft": "nr16+host mean < nr16 mean",
                                 "promotion_over_prefill_max": 0.1}
    assert [p["q"] for p in result["phases"]][-1] == 16          # the full-dataset phase: every prompt
    gpu, host = result["arms"]["nr16"], result["arms"]["nr16+host"]
    for arm in (gpu, host):
        assert [b["phase"] for b in arm["blocks"]] == [p["name"] for p in result["phases"]]
        for b in arm["blocks"]:
            # the client's per-request cached tokens and the engine's counters: two counts of Eq. 9
            assert b["hit_rate"] == pytest.approx(b["server_hit_rate"])
            assert 0 <= b["hit_rate"] <= 1 and b["ttft_ms_mean"] > 0
    assert gpu["host_checkpoint_slots"] == 0 and all(b["tier"]["hits"]["host"] == 0 for b in gpu["blocks"])
    slot = result["slots"]["nr16"]
    assert gpu["checkpoint_slots"] == host["checkpoint_slots"] == slot["slots"]
    # the host tier is host-factor x the budget: that many bytes of the planner's nr16 slots
    assert host["host_checkpoint_slots"] == 8 * result["budget_bytes"] // slot["slot_bytes"]
    full = [b for b in host["blocks"] if "full dataset" in b["phase"]][0]
    assert full["tier"]["hits"]["host"] > 0 and full["tier"]["checkpoint_promotions"] == full["tier"]["hits"]["host"]
    # more checkpoint memory behind the same GPU budget: at least the GPU-only arm's hits
    assert full["hit_rate"] >= [b for b in gpu["blocks"] if "full dataset" in b["phase"]][0]["hit_rate"]
    # every promotion is one slot host -> device (no host kv here)
    promotions = sum(b["tier"]["checkpoint_promotions"] for b in host["blocks"])
    assert host["host_tier"]["copy_bytes"]["to_device"] >= promotions * slot["slot_bytes"] > 0


def test_a_run_split_over_calls_names_every_call(tmp_path):
    # two calls into one --out: the second keeps the first's arm, and the file names both commands, each beside
    # what it measured (the top-level command alone is the last call's)
    out = tmp_path / "r.json"
    assert bench.main(["--smoke", "--arms", "nr16", "--parts", "serve", "--out", str(out), "--commit", "abc"]) == 0
    assert bench.main(["--smoke", "--arms", "nr16,nr16+host", "--out", str(out), "--commit", "abc"]) == 0
    doc = json.loads(out.read_text())
    first, second = doc["calls"]
    assert "--arms nr16 --parts serve" in first["command"] and first["arms"] == ["nr16"]
    assert "--arms nr16,nr16+host --out" in second["command"] and second["arms"] == ["nr16+host"]
    assert doc["arms"]["nr16"]["command"] == first["command"]
    assert doc["arms"]["nr16+host"]["command"] == doc["copies"]["command"] == doc["command"] == second["command"]


def test_smoke_measures_the_copies(result):
    c = result["copies"]
    assert c["bandwidth"]["slot_bytes"] == result["slots"]["nr16"]["slot_bytes"]
    for value in (c["bandwidth"]["to_host_GBps"], c["bandwidth"]["to_device_GBps"], c["promotion_s"],
                  c["prefill_s"], c["overlap"]["both_s"], c["overlap"]["demotion_s"]):
        assert math.isfinite(value) and value > 0
    assert c["promotion_over_prefill"] == pytest.approx(c["promotion_s"] / c["prefill_s"])
    assert c["overlap_meaningful"] is False
    v = result["verdict"]
    assert v["promotion_target_met"] == (c["promotion_over_prefill"] <= 0.1)
    assert set(v) >= {"hit_rate_target_met", "ttft_target_met", "promotion_target_met"}
    full = {a: [b for b in r["blocks"] if "full dataset" in b["phase"]][0] for a, r in result["arms"].items()}
    assert v["ttft_target_met"] == (full["nr16+host"]["ttft_ms_mean"] < full["nr16"]["ttft_ms_mean"])
    assert v["hit_rate_target_met"] == (full["nr16+host"]["hit_rate"] >= 2 * full["nr16"]["hit_rate"] > 0
                                        or full["nr16"]["hit_rate"] == 0 < full["nr16+host"]["hit_rate"])


def test_every_arm_is_an_engine_config_of_what_its_name_says():
    # each arm's engine is configured before its (GPU) run: a misspelt field or value would only fail there
    from types import SimpleNamespace
    args = SimpleNamespace(model="m", device="cpu", dtype="float32", host_factor=8, max_batch=4, max_num_tokens=None)
    for arm in bench.ARMS:
        cfg = bench.engine_config(args, arm, budget=1000, kv_blocks=64, max_context=256)
        parts = arm.split("+")
        assert cfg.wmax == (0 if parts[0] == "dense" else 16), arm
        assert (cfg.host_cache_bytes == 8000) == ("host" in parts), arm
        assert cfg.eviction == ("cost" if "cost" in parts else "lru"), arm
        assert cfg.host_write_policy == ("write-through" if "wt" in parts else "write-back"), arm
        assert cfg.codec == ("int8" if "int8" in parts else "native"), arm
