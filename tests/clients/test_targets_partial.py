"""The matched-HBM target line (clients/targets.py: dasc-nr W=16 vs dense, mean TTFT <= -42.6%, input throughput
>= +68.4%) and the partial ratios of an unfinished measurement (clients/assemble.py), on small synthetic cells
with hand-computed figures: a verdict only where both arms have complete within-seed ratios; before that a
partial ratio over the phases both arms completed, named, never judged. No server."""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from clients import targets
from clients.assemble import assemble
from clients.matched_hbm import result_of
from trtllm_dasc.errors import UserError

PHASES = [{"name": "Q=4 (dense)", "q": 4, "arms": ["dense"], "repeats": 1, "blocks": [[0, 4]], "blocks_in_dataset": 1},
          {"name": "Q=8 (nr16)", "q": 8, "arms": ["nr16"], "repeats": 1, "blocks": [[0, 8]], "blocks_in_dataset": 1}]
SEEDS = ("42", "7")
UNITS = [f"p{i}-b0-s{s}" for i in range(2) for s in SEEDS]


def _manifest():
    arm = {"target": "triton", "wmax": 16, "policy": "nr", "codec": "native", "placement": "off", "slots": 1,
           "checkpoint_bytes": 1}
    return {"id": "m", "protocol": "p", "baseline": "dense", "units": UNITS, "block_selection": "all",
            "phases": PHASES, "seeds": [int(s) for s in SEEDS], "config": {"build_flags": []},
            "arms": [{**arm, "key": "dense", "spec": "dense", "label": "dense"},
                     {**arm, "key": "nr16", "spec": "nr16", "label": "dasc-nr W=16"}]}


def _cell(arm, unit, call, ttft, seconds):
    """One cell: one block of 4 requests of 100 prompt tokens each, every request at ``ttft`` ms, the replay
    ``seconds`` long (input throughput 400 / seconds)."""
    i, _, s = unit.split("-")
    block = {"phase": PHASES[int(i[1:])]["name"], "seed": s[1:],
             "replay": {"ttft_ms": [ttft] * 4, "prompt_tokens": 400, "seconds": seconds, "cached_tokens": 100},
             "server": {"prompt_tokens": 400, "cached_tokens": 100, "checkpoint_evictions": 0, "kv_block_evictions": 0}}
    return {"arm": arm, "unit": unit, "call": call, "blocks": [block]}


# (ttft ms, replay seconds) of each arm's cell, per unit
DENSE = {"p0-b0-s42": (100, 1.0), "p0-b0-s7": (200, 2.0), "p1-b0-s42": (400, 4.0), "p1-b0-s7": (300, 3.0)}


def _cells(nr16: dict, call="c1", dense_units=None):
    return ([_cell("dense", u, "c1", *DENSE[u]) for u in (dense_units or DENSE)]
            + [_cell("nr16", u, call if not isinstance(call, dict) else call.get(u, "c1"), *v) for u, v in nr16.items()])


def _nr16(result):
    return next(a for a in result["arms"] if a["key"] == "nr16")


def test_complete_ratios_get_a_verdict_met():
    # TTFT halved and replays twice as fast in every cell: ratios 0.5 and 2.0 in each seed
    nr16 = {u: (t / 2, s / 2) for u, (t, s) in DENSE.items()}
    r = result_of(_manifest(), [], _cells(nr16), {"command": "c", "commit": "abc1234"})
    a = _nr16(r)
    assert "vs_dense_partial" not in a and "phase_weighted" not in a["vs_dense"]   # every block ran: pooled is it
    assert a["vs_dense"]["ttft_mean_ms"]["per_seed"] == pytest.approx({"42": 0.5, "7": 0.5})
    assert r["target"] == targets.TARGET
    v = r["target_verdict"]
    assert v["met"] is True and v["ttft_mean_change"] == pytest.approx(-0.5)
    assert v["input_throughput_change"] == pytest.approx(1.0)
    assert targets.describe(v).startswith("target met")


def test_complete_ratios_that_miss_say_by_how_much():
    # TTFT -30% (12.6 points short of -42.6%), throughput +100% (met)
    nr16 = {u: (t * 0.7, s / 2) for u, (t, s) in DENSE.items()}
    v = targets.verdict(assemble(_manifest(), [], _cells(nr16))["arms"])
    assert v["met"] is False and not v["ttft_met"] and v["input_throughput_met"]
    assert v["ttft_mean_change"] == pytest.approx(-0.3)
    line = targets.describe(v)
    assert line.startswith("target MISSED") and "TTFT short by 12.6% points" in line


def test_an_unfinished_arm_gets_partial_ratios_over_the_phases_both_completed_and_no_verdict():
    # nr16 lacks phase 1's seed 7: phase 0 is complete for both arms, phase 1 is not
    nr16 = {"p0-b0-s42": (50, 0.25), "p0-b0-s7": (150, 1.0), "p1-b0-s42": (100, 1.0)}
    r = result_of(_manifest(), [], _cells(nr16), {"command": "c", "commit": "abc1234"})
    a = _nr16(r)
    assert a["pending"] == 1 and "vs_dense" not in a
    p = a["vs_dense_partial"]
    assert p["phases"] == ["Q=4 (dense)"] and (p["units"], p["units_total"]) == (2, 4)
    assert "not the protocol's figure" in p["partial"]
    # by hand, phase 0 only: TTFT 50/100 and 150/200; throughput (400/0.25)/(400/1) and (400/1)/(400/2)
    ttft, thr = [0.5, 0.75], [4.0, 2.0]
    assert p["ttft_mean_ms"]["per_seed"] == pytest.approx(dict(zip(SEEDS, ttft)))
    assert p["ttft_mean_ms"]["mean"] == pytest.approx(statistics.fmean(ttft))
    assert p["ttft_mean_ms"]["std"] == pytest.approx(statistics.stdev(ttft))
    assert p["input_tokens_per_s"]["mean"] == pytest.approx(3.0)
    assert p["input_tokens_per_s"]["std"] == pytest.approx(statistics.stdev(thr))
    v = r["target_verdict"]
    assert v["met"] is None and v["partial"]["phases"] == ["Q=4 (dense)"]
    assert v["partial"]["ttft_mean_change"] == pytest.approx(-0.375)
    assert "not measured" in targets.describe(v) and "partial, phases Q=4 (dense) only" in targets.describe(v)


def test_a_phase_whose_cells_are_not_paired_within_a_call_is_left_out():
    # every nr16 cell done, but phase 1's seed 7 ran in a call without a dense cell of that unit: no complete
    # ratio, and the partial one covers phase 0 only
    nr16 = {u: (t / 2, s / 2) for u, (t, s) in DENSE.items()}
    calls = {"p1-b0-s7": "c2"}
    a = _nr16(assemble(_manifest(), [], _cells(nr16, call=calls)))
    assert a["unpaired_cells"] == 1 and "vs_dense" not in a
    assert a["vs_dense_partial"]["phases"] == ["Q=4 (dense)"]


def test_no_phase_complete_for_both_means_no_partial_ratio():
    nr16 = {"p0-b0-s42": (50, 0.5), "p1-b0-s42": (100, 1.0)}
    a = _nr16(assemble(_manifest(), [], _cells(nr16)))
    assert "vs_dense_partial" not in a
    assert targets.verdict([a])["met"] is None and "partial" not in targets.verdict([a])


def test_without_the_arm_there_is_nothing_to_judge():
    assert targets.verdict([{"spec": "nr16+int8", "target": "triton"}]) == {"met": None, "why": "no nr16 arm"}


def test_the_run_prints_the_target_before_any_cell_and_records_it(tmp_path, capsys, monkeypatch):
    from clients import runner
    from clients.matched_hbm import main
    model = str(Path(__file__).resolve().parents[2] / "trtllm_dasc" / "assets" / "tiny-kimi-linear")

    def stop(*a, **k):
        print("[cells start]", file=__import__("sys").stderr)
        raise UserError("stopped before the first cell")
    monkeypatch.setattr(runner, "run_call", stop)
    rc = main(["--model", model, "--arms", "dense,nr16", "--dense-slots", "3", "--scale", "0.03", "--prompts", "600",
               "--device", "cpu", "--dtype", "float32", "--out", str(tmp_path / "out"),
               "--json", str(tmp_path / "r.json"), "--commit", "abc1234"])
    err = capsys.readouterr().err
    assert rc == 2 and targets.TARGET_LINE in err and err.index(targets.TARGET_LINE) < err.index("[cells start]")
    import json
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["target"] == targets.TARGET and r["target_verdict"]["met"] is None


def test_a_run_of_another_model_is_not_judged_by_the_kimi_target():
    # the target is the paper's Kimi-Linear-48B-A3B figure: a Qwen3-Next-80B run (or a tiny CPU model) shows its
    # ratios but gets no verdict; the released Kimi config (and a config that cannot be read here) does
    data = Path(__file__).resolve().parents[1] / "data"
    nr16 = {u: (t / 2, s / 2) for u, (t, s) in DENSE.items()}
    arms = result_of(_manifest(), [], _cells(nr16), {"command": "c", "commit": "abc1234"})["arms"]
    qwen = targets.verdict(arms, str(data / "qwen3-next-80b-a3b.config.json"))
    assert qwen["met"] is None and "Kimi-Linear-48B" in qwen["why"] and "qwen3_next" in qwen["why"]
    assert targets.verdict(arms, str(data / "kimi-linear-48b-a3b.config.json"))["met"] is True
    assert targets.verdict(arms, "/nonexistent/config.json")["met"] is True


def _subset_manifest():
    # phase 0 has 3 blocks in the dataset and the run measured 1 of them (--blocks-per-phase 1): weight 3
    m = _manifest()
    m["phases"] = [{**PHASES[0], "blocks_in_dataset": 3}, PHASES[1]]
    return m


def test_a_block_subset_is_judged_phase_weighted_with_the_pooled_figure_beside_it():
    # nr16 halves phase 0's TTFT and replay time and matches dense in phase 1
    nr16 = {u: ((t / 2, s / 2) if u.startswith("p0") else (t, s)) for u, (t, s) in DENSE.items()}
    r = result_of(_subset_manifest(), [], _cells(nr16), {"command": "c", "commit": "abc1234"})
    pw = _nr16(r)["vs_dense"]["phase_weighted"]
    assert pw["weights"] == {"Q=4 (dense)": 3.0, "Q=8 (nr16)": 1.0}
    # by hand, 4 requests a block, phase 0 counted 3 times. Seed 42: dense TTFT (12 x 100 + 4 x 400) / 16 = 175,
    # nr16 (12 x 50 + 4 x 400) / 16 = 137.5; replay seconds dense 3 x 1 + 4 = 7, nr16 3 x 0.5 + 4 = 5.5.
    # Seed 7: dense (12 x 200 + 4 x 300) / 16 = 225, nr16 (12 x 100 + 1200) / 16 = 150; seconds 9 and 6.
    ttft, thr = [137.5 / 175, 150 / 225], [7 / 5.5, 9 / 6]
    assert pw["ttft_mean_ms"]["per_seed"] == pytest.approx(dict(zip(SEEDS, ttft)))
    assert pw["input_tokens_per_s"]["per_seed"] == pytest.approx(dict(zip(SEEDS, thr)))
    assert pw["arm"]["ttft_mean_ms"]["mean"] == pytest.approx((137.5 + 150) / 2)
    v = r["target_verdict"]
    assert v["figure"].startswith("phase-weighted")
    assert v["ttft_mean_change"] == pytest.approx(statistics.fmean(ttft) - 1)
    assert v["input_throughput_change"] == pytest.approx(statistics.fmean(thr) - 1)
    # pooled as measured (8 requests a seed): seed 42 (200 + 1600) / (400 + 1600), seed 7 (400 + 1200) / (800 + 1200)
    assert v["pooled_as_measured"]["ttft_mean_change"] == pytest.approx((0.9 + 0.8) / 2 - 1)
    assert v["met"] is False and "pooled as measured: mean TTFT -15.0%" in targets.describe(v)


def test_a_partial_block_subset_is_phase_weighted_too():
    nr16 = {"p0-b0-s42": (50, 0.5), "p0-b0-s7": (100, 1.0), "p1-b0-s42": (400, 4.0)}
    r = result_of(_subset_manifest(), [], _cells(nr16), {"command": "c", "commit": "abc1234"})
    p = _nr16(r)["vs_dense_partial"]
    # one phase: its weight cancels in every ratio, so weighted equals pooled
    assert p["phase_weighted"]["weights"] == {"Q=4 (dense)": 3.0}
    assert p["phase_weighted"]["ttft_mean_ms"]["mean"] == pytest.approx(p["ttft_mean_ms"]["mean"])
    assert r["target_verdict"]["partial"]["figure"].startswith("phase-weighted")


def test_an_earlier_calls_failure_is_history_once_every_cell_is_done():
    """A call whose arm failed (a server died) and a later call that ran its cells: the measurement is whole,
    so failed_arms (which makes the exit code 1 and says cells are missing) no longer lists the failure; it
    stays as recovered_failures. While cells are missing it is failed_arms, as before."""
    calls = [{"call": "c1", "failed_arms": [{"key": "nr16", "spec": "nr16", "error": "server died"}]}, {"call": "c2"}]
    nr16 = {u: (t / 2, s / 2) for u, (t, s) in DENSE.items()}
    whole = result_of(_manifest(), calls, _cells(nr16, call="c2"), {"command": "c", "commit": "abc1234"})
    assert whole["complete"] and "failed_arms" not in whole
    assert whole["recovered_failures"] == [{"spec": "nr16", "error": "server died"}]
    part = result_of(_manifest(), calls[:1], _cells({}), {"command": "c", "commit": "abc1234"})
    assert not part["complete"] and part["failed_arms"] == [{"spec": "nr16", "error": "server died"}]
    assert "recovered_failures" not in part
