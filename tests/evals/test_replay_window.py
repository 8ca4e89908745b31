"""evals.run --replay-window (ProtocolConfig.replay_window): every wr arm's hit replays that many tokens instead of
its W_max. The reference is the dense arm: on the committed trained KDA model (benchmarks/quality_models/kda),
W=128 omits the channels it retrieves through, so wr128's default 128-token replay loses niah_single_1 at 1,024
tokens; a replay over the whole prompt recomputes every omitted channel from zero, as the dense prefill did, and
must find the needles dense finds. About 10 s on a CPU."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from trtllm_dasc.evals.protocol import ProtocolConfig, parse_arm, run_arm
from trtllm_dasc.evals.report import accuracy_table

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "quality_models", "kda")
CFG = ProtocolConfig(tasks=("niah_single_1",), lengths=(1024,), instances=4, max_batch=4)


def _accuracy(spec: str, cfg: ProtocolConfig) -> float:
    out = run_arm(MODEL, parse_arm(spec), cfg)
    assert out["misses"] == [], out["misses"]
    return accuracy_table([out])[spec]["accuracy"]


def test_a_replay_over_the_whole_prompt_finds_what_dense_finds():
    dense = _accuracy("dense", CFG)
    assert dense >= 0.75, dense                       # the model retrieves here, or there is nothing to lose
    assert _accuracy("wr128", CFG) <= dense - 0.5      # the default replay (W_max = 128 tokens) loses the needles
    assert _accuracy("wr128", dataclasses.replace(CFG, replay_window=1024)) >= dense - 0.25


@pytest.mark.parametrize("bad", [0, -3, True, 2.5])
def test_a_replay_window_must_be_a_positive_token_count(bad):
    with pytest.raises(ValueError, match="replay_window"):
        dataclasses.replace(CFG, replay_window=bad)


def test_the_flag_is_recorded_and_checked_and_a_merge_keeps_one_window(tmp_path, monkeypatch, capsys):
    import trtllm_dasc.evals.run as run
    seen = []

    def fake_run_arm(model, arm, cfg, progress=None):
        seen.append(cfg.replay_window)
        scores = {"niah_single_1": {"128": {str(i): {"score": 1.0, "rounds": [1.0], "cached": 127, "prompt": 128}
                                            for i in range(3)}}}
        return {"arm": arm.spec, "scores": scores, "misses": [], "round_misses": [], "rounds": 1, "seconds": 0.0}
    monkeypatch.setattr(run, "run_arm", fake_run_arm)
    common = ["--model", MODEL, "--tasks", "niah_single_1", "--lengths", "128", "--instances", "3", "--resamples", "50"]
    assert run.main(common + ["--arms", "wr16", "--replay-window", "64", "--out", str(tmp_path / "a.json")]) == 0
    assert seen == [64] and json.loads((tmp_path / "a.json").read_text())["replay_window"] == 64
    assert run.main(common + ["--arms", "dense", "--out", str(tmp_path / "b.json")]) == 0
    assert run.main(common + ["--arms", "wr16", "--replay-window", "0", "--out", str(tmp_path / "c.json")]) == 2
    assert "--replay-window must be >= 1" in capsys.readouterr().err
    # runs of other replay windows are other measurements: never merged into one
    assert run.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out",
                     str(tmp_path / "m.json")]) == 2
    assert "replay_window" in capsys.readouterr().err
    # nor read as the protocol's dasc-wr by the tables
    from trtllm_dasc.evals import paper_tables, tables
    assert paper_tables.main([str(tmp_path / "a.json"), "--out", str(tmp_path / "t.md")]) == 2
    assert tables.main([str(tmp_path / "a.json")]) == 2
    assert capsys.readouterr().err.count("--replay-window 64 diagnostic") == 2
