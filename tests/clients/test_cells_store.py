"""clients/cells.py and merge_matched_hbm.py --cells without a server: the merge refuses cells of mixed
manifests or commits, a call at another commit is refused before it measures, an edited manifest is caught;
which units a call takes (clients/runner.py); the paper-mode defaults and the seeded block subset."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.cells import CellStore, load_dirs, manifest_id
from clients.runner import arm_units, plan_units
from clients.workload import phase_blocks
from trtllm_dasc.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = {"kind": "t", "baseline": "dense", "arms": [{"key": "dense"}, {"key": "nr16"}, {"key": "wr16"}],
            "units": ["p0-b0-s42", "p0-b1-s42", "p1-b0-s42"], "config": {"budget_bytes": 100}}


def _store(path, **change):
    return CellStore(str(path), {**MANIFEST, **change})


def _merge_main(argv):
    from benchmarks import merge_matched_hbm as mod
    return mod.main(argv)


def test_manifest_id_is_a_hash_of_the_content():
    assert manifest_id(MANIFEST) == manifest_id(dict(reversed(list(MANIFEST.items()))))
    assert manifest_id(MANIFEST) != manifest_id({**MANIFEST, "config": {"budget_bytes": 101}})


def test_merge_refuses_mixed_manifests(tmp_path):
    a, b = _store(tmp_path / "a"), _store(tmp_path / "b", config={"budget_bytes": 200})
    a.write("dense", "p0-b0-s42", "c1", "abc", {"blocks": []})
    b.write("dense", "p0-b1-s42", "c2", "abc", {"blocks": []})
    with pytest.raises(UserError, match="different manifests.*'config'"):
        load_dirs([a.root, b.root])
    # and over the command line: one line, exit 2
    assert _merge_main(["--cells", a.root, b.root, "--out", str(tmp_path / "m.json")]) == 2
    assert not (tmp_path / "m.json").exists()


def test_merge_refuses_mixed_commits(tmp_path):
    a, b = _store(tmp_path / "a"), _store(tmp_path / "b")
    a.write("dense", "p0-b0-s42", "c1", "abc", {"blocks": []})
    b.write("dense", "p0-b1-s42", "c2", "def", {"blocks": []})
    assert load_dirs([a.root])[0]["id"] == load_dirs([b.root])[0]["id"]
    with pytest.raises(UserError, match="different commits"):
        load_dirs([a.root, b.root])


def test_a_directory_given_twice_counts_each_call_once(tmp_path):
    # the calls were listed once per directory: a merge of D D doubled calls, arm_calls and the plot's count
    a = _store(tmp_path / "a")
    a.begin_call("c1", {"commit": "abc"})
    a.begin_call("c2", {"commit": "abc"})
    a.write("dense", "p0-b0-s42", "c1", "abc", {"blocks": []})
    assert sorted(c["call"] for c in load_dirs([a.root, a.root])[1]) == ["c1", "c2"]


def test_a_cell_of_another_manifest_or_an_edited_manifest_is_refused(tmp_path):
    a = _store(tmp_path / "a")
    path = Path(a.write("dense", "p0-b0-s42", "c1", "abc", {"blocks": []}))
    cell = json.loads(path.read_text())
    path.write_text(json.dumps({**cell, "manifest_id": "0" * 16}))
    with pytest.raises(UserError, match="belongs to manifest"):
        load_dirs([a.root])
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    (tmp_path / "a" / "manifest.json").write_text(json.dumps({**m, "seeds": [1]}))
    with pytest.raises(UserError, match="edited"):
        load_dirs([a.root])


def test_a_call_at_another_commit_is_refused_before_it_measures(tmp_path):
    s = _store(tmp_path)
    s.begin_call("c1", {"commit": "abc"})
    s.begin_call("c2", {"commit": "abc"})
    with pytest.raises(UserError, match="one measurement, one commit"):
        _store(tmp_path).begin_call("c3", {"commit": "abc+uncommitted changes"})
    with pytest.raises(UserError, match="another manifest"):
        _store(tmp_path, units=["p0-b0-s7"])


def test_a_call_takes_units_an_arm_lacks_and_the_baseline_runs_beside_each(tmp_path):
    s = _store(tmp_path)
    m = s.manifest
    assert plan_units(s, m, ["dense", "nr16"], 2) == ["p0-b0-s42", "p0-b1-s42"]
    s.write("dense", "p0-b0-s42", "c1", "abc", {"blocks": []})
    s.write("nr16", "p0-b0-s42", "c1", "abc", {"blocks": []})
    # nr16 has unit 0: the next call for it starts at unit 1
    assert plan_units(s, m, ["dense", "nr16"], None) == ["p0-b1-s42", "p1-b0-s42"]
    # wr16 lacks all three: dense runs all three again beside it (new cells of this call), wr16 all three
    units = plan_units(s, m, ["dense", "nr16", "wr16"], None)
    assert units == MANIFEST["units"]
    assert arm_units(s, m, "dense", units) == units
    assert arm_units(s, m, "nr16", units) == ["p0-b1-s42", "p1-b0-s42"]
    # a call of the baseline alone runs what the baseline lacks
    assert plan_units(s, m, ["dense"], None) == ["p0-b1-s42", "p1-b0-s42"]


def test_seeded_block_subset_is_fixed_by_seed_q_and_dataset():
    a = phase_blocks(12032, 150, 5, seed=0)
    assert a == phase_blocks(12032, 150, 5, seed=0) != phase_blocks(12032, 150, 5, seed=1)
    assert len(a) == 5 and len(set(a)) == 5 and all(hi - lo == 150 and lo % 150 == 0 for lo, hi in a)
    assert a == sorted(a) and a[-1][1] <= 12032 // 150 * 150
    assert phase_blocks(12032, 150, None, seed=0) == [(b * 150, b * 150 + 150) for b in range(80)]


def test_paper_mode_sets_app_c2(tmp_path):
    from clients.matched_hbm import add_arguments, check
    from trtllm_dasc.cli import _Parser
    p = _Parser(prog="matched_hbm")
    add_arguments(p)
    model = str(ROOT / "trtllm_dasc" / "assets" / "tiny-kimi-linear")
    args = p.parse_args(["--model", model, "--paper"])
    arms, proto, work = check(args)
    assert (args.dense_slots, args.concurrency, args.prefill_chunk, args.max_num_tokens) == (127, 96, 8192, 8192)
    assert (proto.dense_repeats, proto.full_phase, proto.seeds, proto.output_tokens) == (6, True, (42, 123, 7), 1)
    assert args.phase_arms == "dense,nr16,nr64,nr128,nr512" and args.transport == "http"
    assert work.prompts == 12032 and proto.blocks_per_phase is None
    # a flag given wins over the paper's value
    args = p.parse_args(["--model", model, "--paper", "--dense-repeats", "2", "--dense-slots", "8"])
    check(args)
    assert (args.dense_repeats, args.dense_slots) == (2, 8)
    # a budget subset under --paper is a seeded sample
    args = p.parse_args(["--model", model, "--paper", "--blocks-per-phase", "3"])
    assert check(args)[1].block_seed == 0


def test_cells_without_their_manifest_are_refused(tmp_path):
    # a directory whose manifest.json was deleted (or only its cells/ copied) took the manifest of the call that
    # opened it, and counted the cells there as done for it whatever they measured: units were skipped, and
    # only the merge found out
    a = _store(tmp_path)
    a.write("nr16", "p0-b0-s42", "c1", "abc", {"blocks": []})
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(UserError, match="no manifest"):
        _store(tmp_path, config={"budget_bytes": 200})
    assert not (tmp_path / "manifest.json").exists()
    # a fresh store (no --cells-dir: OUT/cells emptied first) still starts over
    assert not CellStore(str(tmp_path), MANIFEST, fresh=True).done("nr16", "p0-b0-s42")
