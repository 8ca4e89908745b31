"""benchmarks/wr_hit_cost.py in smoke mode (CPU, the embedded tiny Kimi-Linear): every timed replay of both
arms hits, wr replays and nr does not, and the per-hit cost is what the per-pass times in the JSON give."""
from __future__ import annotations

import json
import statistics

import pytest
import torch

from benchmarks import wr_hit_cost as bench


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("wr_hit_cost") / "wr_hit_cost.json"
    threads = torch.get_num_threads()
    try:
        rc = bench.main(["--smoke", "--reps", "2", "--out", str(out), "--commit", "test-commit"])
    finally:
        torch.set_num_threads(threads)      # the smoke run sets 1; the rest of the session keeps its own
    assert rc == 0
    return json.loads(out.read_text())


def test_json_records_the_run(result):
    assert result["benchmark"] == "wr_hit_cost"
    assert result["commit"] == "test-commit"
    assert result["command"].startswith("python -m benchmarks wr_hit_cost --smoke")
    assert result["smoke"] is True and result["valid"] is True and result["problems"] == []
    s = result["settings"]
    assert s["wmax"] == 16 and s["reps"] == 2 and s["device"] == "cpu"
    assert result["order"] == [["nr", "wr"], ["wr", "nr"]]
    assert result["target_ms"] == 2.0
    assert result["target_met"] == (result["wr_cost_per_hit_ms"] <= 2.0)
    assert set(result["arms"]) == {"nr", "wr"}
    assert result["arms"]["nr"]["spec"] == "nr16" and result["arms"]["wr"]["spec"] == "wr16"
    # same budget, same plan: the same checkpoint slots in both arms, enough for everything a pass stores
    assert result["arms"]["nr"]["checkpoint_slots"] == result["arms"]["wr"]["checkpoint_slots"] \
        >= s["checkpoints_needed"]


def test_every_timed_replay_hits_in_both_arms(result):
    n = result["replays_per_pass"]
    assert n == result["hits_per_pass"] > 0
    for name in ("nr", "wr"):
        passes = result["arms"][name]["passes"]
        assert len(passes) == 2
        for p in passes:
            assert p["requests"] == p["hits"] == n
            assert p["loads"][name] == n and p["loads"]["wr" if name == "nr" else "nr"] == 0
            assert p["cached_tokens"] == n * result["settings"]["doc_len"]
            assert p["evictions"]["checkpoints"] == p["evictions"]["checkpoints_with_kv"] == 0


def test_wr_replays_and_nr_does_not(result):
    nr, wr = result["arms"]["nr"], result["arms"]["wr"]
    assert nr["replay_window"] == 0 and nr["replayed_tokens_per_hit"] == 0
    assert all(p["replayed_tokens"] == p["replayed_tokens_counter"] == 0 for p in nr["passes"])
    assert wr["replay_window"] > 0
    assert all(p["replayed_tokens"] == p["replayed_tokens_counter"] > 0 for p in wr["passes"])
    # every document is longer than the window: each hit replays the whole window
    assert wr["replayed_tokens_per_hit"] == wr["replay_window"]


def test_per_hit_cost_is_the_median_difference_over_hits(result):
    nr = statistics.median(p["seconds"] for p in result["arms"]["nr"]["passes"])
    wr = statistics.median(p["seconds"] for p in result["arms"]["wr"]["passes"])
    assert result["arms"]["nr"]["median_s"] == pytest.approx(nr)
    assert result["wr_cost_per_hit_ms"] == pytest.approx((wr - nr) * 1e3 / result["hits_per_pass"])
    paired = [(w["seconds"] - n["seconds"]) * 1e3 / result["hits_per_pass"]
              for n, w in zip(result["arms"]["nr"]["passes"], result["arms"]["wr"]["passes"])]
    assert result["paired_cost_per_hit_ms"] == pytest.approx(paired)


@pytest.mark.parametrize("argv, message", [
    ([], "--model DIR is required"),
    (["--smoke", "--reps", "0"], "--reps: must be an integer >= 1, got 0"),
    (["--smoke", "--questions-per-doc", "1"], "--questions-per-doc: must be an integer >= 2"),
    (["--model", "/nonexistent/model"], "no config.json there"),
])
def test_bad_input_is_one_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
