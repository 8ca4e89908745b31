"""benchmarks/ab_state_bandwidth.py: the per-codec figures of an A/B call, checked against numbers written
out by hand (not recomputed by the joiner's own code)."""
import json

import pytest

from benchmarks import ab_state_bandwidth as ab


def _result(commit, pcts):
    return {"command": f"python -m benchmarks state_bandwidth --commit {commit}", "commit": commit,
            "device": "NVIDIA H200",
            "codec_verdicts": {c: {"pct_of_same_size_copy_graph": {"min_pct": p, "arm": f"kimi W=16 {c} store"},
                                   "pct_of_copy_graph": {"min_pct": 1.0, "arm": "other figure"}}
                               for c, p in pcts.items()}}


def test_the_head_minus_base_is_the_difference_of_the_sides_means(tmp_path):
    files = {"base_1": _result("aaa", {"int4+c8": 78.0, "int8+c8": 86.0}),
             "head_1": _result("bbb", {"int4+c8": 82.0, "int8+c8": 86.5}),
             "head_2": _result("bbb", {"int4+c8": 84.0, "int8+c8": 85.5}),
             "base_2": _result("aaa", {"int4+c8": 79.0, "int8+c8": 87.0})}
    for name, r in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(r))
    out = tmp_path / "joined.json"
    assert ab.main([str(tmp_path), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["base_commit"] == "aaa" and got["head_commit"] == "bbb" and got["runs_missing"] == []
    assert got["per_codec"]["int4+c8"]["head_minus_base_points"] == pytest.approx(83.0 - 78.5)
    assert got["per_codec"]["int8+c8"]["head_minus_base_points"] == pytest.approx(86.0 - 86.5)
    assert got["per_codec"]["int4+c8"]["runs"] == {"base_1": 78.0, "head_1": 82.0, "head_2": 84.0, "base_2": 79.0}


def test_a_run_cut_by_the_call_is_named_and_the_rest_still_join(tmp_path):
    (tmp_path / "base_1.json").write_text(json.dumps(_result("aaa", {"mixed+c8": 78.0})))
    (tmp_path / "head_1.json").write_text(json.dumps(_result("bbb", {"mixed+c8": 81.0})))
    out = tmp_path / "joined.json"
    assert ab.main([str(tmp_path), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["runs_missing"] == ["head_2", "base_2"]
    assert got["per_codec"]["mixed+c8"]["head_minus_base_points"] == pytest.approx(3.0)


def test_one_side_at_two_commits_is_refused(tmp_path, capsys):
    (tmp_path / "base_1.json").write_text(json.dumps(_result("aaa", {"int4": 80.0})))
    (tmp_path / "base_2.json").write_text(json.dumps(_result("ccc", {"int4": 80.0})))
    (tmp_path / "head_1.json").write_text(json.dumps(_result("bbb", {"int4": 80.0})))
    assert ab.main([str(tmp_path)]) == 2
    assert "several commits" in capsys.readouterr().err


def test_no_head_run_is_refused(tmp_path, capsys):
    (tmp_path / "base_1.json").write_text(json.dumps(_result("aaa", {"int4": 80.0})))
    assert ab.main([str(tmp_path)]) == 2
    assert "at least one base and one head" in capsys.readouterr().err
