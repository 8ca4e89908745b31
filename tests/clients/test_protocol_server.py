"""The protocol against real tritonservers (dasc-build engines of the embedded model, CPU): two arms at one
budget, plus the same dasc arm in-process. The client's Eq. 9 hit rate must equal the engine's own
counters over each replay (cache_stats), and where a block fits an arm's slots every replay request must
be served from its prompt-end checkpoint (C_i = L_i - 1: an independent count from first principles)."""
from __future__ import annotations

import json
import os

import pytest

from clients.matched_hbm import main

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "trtllm_dasc", "assets", "tiny-kimi-linear")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("mh")
    # float32: dense 104,960 B, dasc-nr W=16 + INT8 31,428 B; a budget of 4 dense checkpoints gives 3 and 12
    # slots: the INT8 arm holds a dense-boundary block (4 prompts) with room for the captures in flight
    argv = ["--model", MODEL, "--out", str(out), "--arms", "dense,nr16+int8", "--dense-slots", "3", "--scale", "0.03",
            "--blocks-per-phase", "1", "--seeds", "42,7", "--concurrency", "4", "--output-tokens", "2",
            "--device", "cpu", "--dtype", "float32", "--max-batch-size", "4", "--torch-threads", "1",
            "--inprocess", "nr16+int8"]
    assert main(argv) == 0
    with open(out / "matched_hbm.json") as f:
        res = json.load(f)
    res["out"] = out
    return res


def arm(res, spec, target="triton"):
    return next(a for a in res["arms"] if a["spec"] == spec and a["target"] == target)


def test_slots_phases_and_provenance(result):
    assert result["command"].startswith("python -m clients.matched_hbm --model")
    assert result["commit"]
    assert [a["slots"] for a in result["arms"]] == [3, 12, 12]
    assert [(p["q"], p["arms"]) for p in result["phases"]] == [(4, ["dense"]), (15, ["nr16+int8"])]
    assert (result["out"] / "matched_hbm.png").read_bytes()[:4] == b"\x89PNG"
    for a in result["arms"]:
        assert len(a["blocks"]) == 2 * 2          # phases x seeds
        s = a["summary"]["seeds"]
        assert 0 < s["hit_rate"]["mean"] < 1 and s["ttft_mean_ms"]["mean"] > 0
        assert set(a["summary"]["per_seed"]) == {"42", "7"}
    assert "vs_dense" in result["arms"][1] and "triton_over_inprocess" in result["arms"][2]


def test_client_hit_rate_equals_engine_counters(result):
    for a in result["arms"]:
        for b in a["blocks"]:
            rp, sv = b["replay"], b["server"]
            assert sv["requests"] == rp["requests"] == b["q"]
            assert sv["prompt_tokens"] == rp["prompt_tokens"] == sum(rp["prompt_len"])
            assert sv["cached_tokens"] == rp["cached_tokens"] == sum(rp["cached"])
            assert sv["hit_rate"] == pytest.approx(rp["hit_rate"], abs=0)
            assert sv["kv_block_evictions"] == 0               # KV never decides a hit
            assert sorted(rp["order"]) == list(range(*b["prompts"]))


def test_hits_match_an_independent_count(result):
    for target in ("triton", "in-process"):
        int8 = arm(result, "nr16+int8", target)
        for b in int8["blocks"]:
            if b["q"] == 4:
                # 4 prompt ends, the branch points and the captures of 4 requests in flight fit 12 slots
                # (not 6: concurrent fills hold capture slots and may evict a finished prompt's end)
                assert b["fill"]["checkpoint_evictions"] == 0 and b["server"]["checkpoint_evictions"] == 0
                # so every replay request is served from its prompt end: C_i = L_i - 1
                assert b["replay"]["cached"] == [n - 1 for n in b["replay"]["prompt_len"]], target
    dense = arm(result, "dense")
    for b in dense["blocks"]:
        if b["q"] == 15:
            # 15 distinct prompt ends cannot all be held by 3 slots: some request must miss its end
            assert b["replay"]["cached_tokens"] < sum(n - 1 for n in b["replay"]["prompt_len"])
    # the replay order depends on the seed only
    orders = {(a["target"], b["q"], b["seed"]): b["replay"]["order"] for a in result["arms"] for b in a["blocks"]}
    assert orders[("triton", 15, 42)] == orders[("in-process", 15, 42)] != orders[("triton", 15, 7)]


def test_ttft_positive_and_before_the_end(result):
    for a in result["arms"]:
        for b in a["blocks"]:
            for ttft, e2e in zip(b["replay"]["ttft_ms"], b["replay"]["e2e_ms"]):
                # two output tokens: the first streams before the final response
                assert 0 < ttft < e2e
            assert b["replay"]["seconds"] * 1e3 >= max(b["replay"]["e2e_ms"])
