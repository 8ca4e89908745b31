"""evals.run's presets and its shard merge: `--paper` must be App. C.3's RULER protocol (checked against an
enumeration written here, not the module's), `--smoke` must run end to end on the CPU, and a merge of a
complete sharded run must report nothing missing whatever the preset (the expected arms are the ones the
shards were run with)."""
from __future__ import annotations

import json
import os

import pytest

import trtllm_dasc
import trtllm_dasc.evals.run as run

TINY_MODEL = os.path.join(os.path.dirname(trtllm_dasc.__file__), "assets", "tiny-kimi-linear")
SEEDS = (1234, 2027, 3407, 4519, 5683)              # the five mask seeds of the paper's random-mask control
SUBTASKS = {"niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
            "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"}


def app_c3_arms() -> set[str]:
    """Issue 34 / App. C.3, written out: dense; dasc-nr and dasc-wr at W = 16/64/128/512; dasc-nr + INT8 at
    W = 16; five count-matched random masks at every W."""
    arms = {"dense", "nr16+int8"}
    for w in (16, 64, 128, 512):
        arms |= {f"nr{w}", f"wr{w}"} | {f"rand{w}@{s}" for s in SEEDS}
    return arms


def precision_arms_by_hand() -> set[str]:
    arms = {"dense"}
    for w in (16, 64):
        arms |= {f"nr{w}", f"nr{w}+int8", f"nr{w}+horizon"} | {f"nr{w}+horizon@{s}" for s in SEEDS}
    return arms


@pytest.fixture
def fake_protocol(monkeypatch):
    """run_arm replaced by a recorder returning a deterministic per-instance result of the real shape: the
    presets' settings are checked without running the engine."""
    calls = []

    def fake_run_arm(model, arm, cfg, progress=None):
        calls.append((arm.spec, cfg))
        scores = {t: {str(n): {str(cfg.seed_base + i): {"score": float((i + n + len(t) + len(arm.spec)) % 2),
                                                          "rounds": [0.0] * cfg.rounds, "cached": n - 1, "prompt": n}
                                for i in range(cfg.instances)} for n in cfg.lengths} for t in cfg.tasks}
        return {"arm": arm.spec, "scores": scores, "misses": [], "round_misses": [], "rounds": cfg.rounds,
                "seconds": 0.0}
    monkeypatch.setattr(run, "run_arm", fake_run_arm)
    return calls


def test_the_paper_preset_is_app_c3s_protocol(fake_protocol, tmp_path):
    out = tmp_path / "paper.json"
    # --resamples only keeps the statistics of the fake scores quick: the preset does not set it
    assert run.main(["--paper", "--model", TINY_MODEL, "--out", str(out), "--resamples", "50"]) == 0
    specs = [spec for spec, _ in fake_protocol]
    assert len(specs) == len(set(specs)) == 30 and set(specs) == app_c3_arms()
    for _, cfg in fake_protocol:
        assert set(cfg.tasks) == SUBTASKS and len(cfg.tasks) == 13
        assert cfg.instances == 30 and cfg.lengths == (4096, 8192)
        assert cfg.warm is True and cfg.rounds == 3       # one warm-up pass, three measured replay rounds
        assert cfg.seed_base == 0                          # the same 30 unique instances under every arm
    result = json.loads(out.read_text())
    assert result["preset"] == "paper" and result["rounds"] == 3 and set(result["planned_arms"]) == app_c3_arms()
    assert "Table 2" in (tmp_path / "paper.md").read_text()
    # an explicit flag wins over the preset
    fake_protocol.clear()
    assert run.main(["--paper", "--model", TINY_MODEL, "--out", str(out), "--resamples", "50",
                     "--lengths", "4096,8192,16384", "--instances", "2", "--arms", "dense"]) == 0
    assert [(s, c.lengths, c.instances, c.rounds) for s, c in fake_protocol] == [("dense", (4096, 8192, 16384), 2, 3)]


def _sharded(tmp_path, preset: list[str], shards: int) -> list[str]:
    parts = []
    for i in range(shards):
        parts.append(str(tmp_path / f"part{i}.json"))
        assert run.main([*preset, "--model", TINY_MODEL, "--tasks", "niah_single_1,vt", "--lengths", "128",
                         "--instances", "3", "--resamples", "50", "--shard", f"{i}/{shards}", "--out", parts[-1]]) == 0
    return parts


@pytest.mark.parametrize("preset, expected", [(["--paper"], app_c3_arms),
                                              (["--arms", "precision"], precision_arms_by_hand)])
def test_a_complete_sharded_run_merges_with_nothing_missing(fake_protocol, tmp_path, capsys, preset, expected):
    parts = _sharded(tmp_path, preset, 4)
    capsys.readouterr()
    assert run.main(["--merge", *parts, "--out", str(tmp_path / "merged.json"), "--resamples", "50"]) == 0
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert merged["missing_arms"] == [] and "in no part" not in capsys.readouterr().err
    assert set(merged["planned_arms"]) == {a["arm"] for a in merged["arms"]} == expected()
    # parts written before the arm list was recorded: derived from their commands, the same answer
    for p in parts:
        r = json.loads(open(p).read())
        del r["planned_arms"]
        open(p, "w").write(json.dumps(r))
    assert run.main(["--merge", *parts, "--out", str(tmp_path / "legacy.json"), "--resamples", "50"]) == 0
    assert json.loads((tmp_path / "legacy.json").read_text())["missing_arms"] == []
    # a shard lost: exactly its arms are missing, and said
    lost = {a["arm"] for a in json.loads(open(parts[1]).read())["arms"]}
    assert run.main(["--merge", parts[0], parts[2], parts[3], "--out", str(tmp_path / "half.json"),
                     "--resamples", "50"]) == 0
    half = json.loads((tmp_path / "half.json").read_text())
    assert set(half["missing_arms"]) == lost
    assert f"{len(lost)} of the run's {len(expected())} arms" in capsys.readouterr().err
    # and joining that merge with the lost shard (a later call's arms) completes it
    assert run.main(["--merge", str(tmp_path / "half.json"), parts[1], "--out", str(tmp_path / "whole.json"),
                     "--resamples", "50"]) == 0
    assert json.loads((tmp_path / "whole.json").read_text())["missing_arms"] == []


def test_smoke_runs_end_to_end_on_the_cpu(tmp_path):
    """The real engine on a random-weight tiny model (about 10 s): every arm scored, no miss, the tables written."""
    out = tmp_path / "smoke.json"
    assert run.main(["--smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["preset"] == "smoke" and result["rounds"] == 3 and result["lengths"] == [256]
    assert [a["arm"] for a in result["arms"]] == ["dense", "nr16", "wr16", "nr16+int8", "rand16@1234", "rand16@2027"]
    for arm in result["arms"]:
        assert arm["misses"] == [] and arm["round_misses"] == []
        cells = [rec for task in arm["scores"].values() for cell in task.values() for rec in cell.values()]
        assert len(cells) == 2 * 3 and all(len(rec["rounds"]) == 3 for rec in cells)
    assert result["comparisons"]["nr_vs_dense"] and "Table 2" in (tmp_path / "smoke.md").read_text()


def test_runs_at_other_lengths_join_into_the_run_over_every_length(fake_protocol, tmp_path, capsys):
    """A run per length (scripts/gpu/quality_lengths.sh), each sharded, merged into one: the same result as one
    unsharded run over both lengths (the reference: evals.run itself, run once over 128 and 160)."""
    common = ["--model", TINY_MODEL, "--arms", "dense,nr16,rand16@1234", "--tasks", "niah_single_1,vt",
              "--instances", "3", "--resamples", "50"]
    assert run.main(common + ["--lengths", "128,160", "--out", str(tmp_path / "whole.json")]) == 0
    parts = []
    for n in (128, 160):
        for i in range(2):
            parts.append(str(tmp_path / f"l{n}_{i}.json"))
            assert run.main(common + ["--lengths", str(n), "--shard", f"{i}/2", "--out", parts[-1]]) == 0
    assert run.main(["--merge", *parts, "--out", str(tmp_path / "joined.json"), "--resamples", "50"]) == 0
    whole, joined = (json.loads((tmp_path / f).read_text()) for f in ("whole.json", "joined.json"))
    assert joined["lengths"] == [128, 160] and joined["missing_arms"] == []
    assert [a["arm"] for a in joined["arms"]] == ["dense", "nr16", "rand16@1234"]
    assert {a["arm"]: a["scores"] for a in joined["arms"]} == {a["arm"]: a["scores"] for a in whole["arms"]}
    assert joined["accuracy"] == whole["accuracy"] and joined["comparisons"] == whole["comparisons"]
    # a length's shard lost: its arm is missing there, and the message says at which length
    capsys.readouterr()
    assert run.main(["--merge", *parts[:3], "--out", str(tmp_path / "part.json"), "--resamples", "50"]) == 0
    lost = [a["arm"] for a in json.loads(open(parts[3]).read())["arms"]]
    assert json.loads((tmp_path / "part.json").read_text())["missing_arms"] == lost == ["nr16"]
    assert "nr16 at 160" in capsys.readouterr().err
    assert json.loads((tmp_path / "part.json").read_text())["missing_at"] == {"nr16": [160]}
    # topping that merge up with the lost shard completes it (a later call's arms), cell by cell
    assert run.main(["--merge", str(tmp_path / "part.json"), parts[3], "--out", str(tmp_path / "full.json"),
                     "--resamples", "50"]) == 0
    full = json.loads((tmp_path / "full.json").read_text())
    assert full["missing_arms"] == [] and full["accuracy"] == whole["accuracy"]
    # a cell two parts hold (an arm at a length) is refused in one line, never counted twice
    assert run.main(["--merge", str(tmp_path / "whole.json"), parts[0], "--out", str(tmp_path / "x.json")]) == 2
    assert "at 128 tokens is in both" in capsys.readouterr().err
