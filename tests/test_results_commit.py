"""A result written into the repository's benchmarks/results/ names a clean commit, or the write is refused in
one line (trtllm_dasc/provenance.py: check_results_commit, called by benchmarks/results_io.write_result and
clients/report.write_json); anywhere else (/tmp, a device machine's $OUT) any commit may be written. The long
runs (clients.matched_hbm, serve_wr_fixed_slots, real_model) are refused before they start. No server, no GPU."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks.results_io import write_result
from clients.report import write_json
from trtllm_dasc.evals.run import _write as write_quality
from trtllm_dasc import provenance
from trtllm_dasc.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DIRTY = "abc1234+uncommitted changes"
WRITERS = [write_result, write_json, write_quality]


def test_the_rule_guards_this_repositorys_results_directory():
    assert Path(provenance.RESULTS_DIR).resolve() == RESULTS.resolve()


@pytest.mark.parametrize("write", WRITERS, ids=["write_result", "write_json", "evals"])
@pytest.mark.parametrize("doc", [{"commit": DIRTY}, {"commit": None}, {},
                                 {"commit": "abc1234-dirty"},
                                 {"runs": [{"commit": "abc1234"}, {"commit": DIRTY}]}],
                         ids=["uncommitted", "none", "missing", "dirty", "one-run-dirty"])
def test_results_dir_refuses_a_result_without_a_clean_commit(write, doc):
    path = RESULTS / "_refused_probe.json"
    with pytest.raises(UserError, match="refusing to write .*clean commit") as e:
        write(str(path), {"command": "python x.py", **doc})
    assert "\n" not in str(e.value)
    assert not path.exists()
    # a relative path into it, or one through another spelling of the directory, is the same directory
    with pytest.raises(UserError):
        write(os.path.relpath(path), {"command": "python x.py", **doc})
    with pytest.raises(UserError):
        write(str(RESULTS / "quality" / ".." / "_refused_probe.json"), {"command": "python x.py", **doc})


@pytest.mark.parametrize("write", WRITERS, ids=["write_result", "write_json", "evals"])
def test_elsewhere_any_commit_is_written(write, tmp_path):
    write(str(tmp_path / "r.json"), {"command": "python x.py", "commit": DIRTY})
    assert json.loads((tmp_path / "r.json").read_text())["commit"] == DIRTY


@pytest.mark.parametrize("write", WRITERS, ids=["write_result", "write_json", "evals"])
def test_results_dir_takes_a_clean_commit(write, tmp_path, monkeypatch):
    # a stand-in results directory: nothing is written into the repository's own
    monkeypatch.setattr(provenance, "RESULTS_DIR", str(tmp_path / "results"))
    path = tmp_path / "results" / "r.json"
    write(str(path), {"command": "python x.py", "commit": "abc1234", "runs": [{"commit": "def5678" * 5 + "abcd"}]})
    assert json.loads(path.read_text())["commit"] == "abc1234"


def test_benchmarks_entry_says_a_refused_write_in_one_line(monkeypatch, capsys):
    from benchmarks import __main__ as entry

    def run_module(name, **kw):
        write_result(str(RESULTS / "_refused_probe.json"), {"command": "python x.py", "commit": DIRTY})
    monkeypatch.setattr(entry.runpy, "run_module", run_module)
    assert entry.main(["cache_scaling"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cache_scaling: error: refusing to write" in err[0]


def _never(*a, **k):
    raise AssertionError("the run started")


def test_matched_hbm_is_refused_before_any_cell(tmp_path, capsys, monkeypatch):
    from clients import runner
    from clients.matched_hbm import main
    monkeypatch.setattr(runner, "run_call", _never)
    model = str(ROOT / "trtllm_dasc" / "assets" / "tiny-kimi-linear")
    json_path = RESULTS / "_refused_probe.json"
    rc = main(["--model", model, "--arms", "dense,nr16", "--scale", "0.03", "--prompts", "600", "--device", "cpu",
               "--dtype", "float32", "--max-batch-size", "4", "--paper", "--out", str(tmp_path / "out"),
               "--json", str(json_path), "--commit", DIRTY])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "refusing to write" in err[-1] and DIRTY in err[-1]
    assert not json_path.exists() and not (tmp_path / "out" / "cells").exists()


def test_serve_wr_fixed_slots_is_refused_before_any_cell(tmp_path, capsys, monkeypatch):
    from benchmarks import serve_wr_fixed_slots as mod
    monkeypatch.setattr(mod, "run_call", _never)
    out = RESULTS / "_refused_probe.json"
    rc = mod.main(["--smoke", "--model", "trtllm_dasc/assets/tiny-kimi-linear/config.json", "--load-format", "dummy",
                   "--seed", "0", "--memory-limit-bytes", str(10 ** 11), "--cells-dir", str(tmp_path / "c"),
                   "--work", str(tmp_path / "w"), "--out", str(out), "--commit", DIRTY])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "refusing to write" in err[0]
    assert not out.exists() and not (tmp_path / "c" / "calls").exists() and not (tmp_path / "w" / "servers").exists()


def test_real_model_is_refused_before_the_model_is_built(capsys, monkeypatch):
    from benchmarks import real_model
    monkeypatch.setattr(real_model, "run", _never)
    out = RESULTS / "_refused_probe.json"
    assert real_model.main(["--smoke", "--out", str(out), "--commit", DIRTY]) == 2
    err = capsys.readouterr()
    assert "refusing to write" in err.err and "ready in" not in err.out and not out.exists()


def test_a_quality_run_into_the_results_dir_is_refused_before_it_runs(monkeypatch, capsys):
    # evals.run computes for minutes: an unclean commit is refused up front, in one line, before any arm
    from trtllm_dasc.evals import run as evals_run
    monkeypatch.setattr(evals_run, "run_arm", lambda *a, **k: pytest.fail("an arm ran before the refusal"))
    rc = evals_run.main(["--smoke", "--out", str(RESULTS / "quality" / "_refused_probe.json"), "--commit", DIRTY])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "refusing to write" in err[0]
    assert not (RESULTS / "quality" / "_refused_probe.json").exists()
