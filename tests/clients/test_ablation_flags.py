"""clients.matched_hbm's ablation knobs (--step-delay-ms, --step-slowdown; issue 33's "is it the engine's speed?"):
passed to every arm's dasc-build, part of the manifest (an ablation's cells never merge with the plain run's),
absent when unset (so the manifests of every existing cells directory stay as they were), and an out-of-range
value is refused in one line before anything is built."""
from __future__ import annotations

import json

import pytest

from clients.matched_hbm import engine_flags, main
from test_paper_checkpoints import PLAN, _Phase, _Work, _args


def test_unset_knobs_leave_the_engine_flags_as_they_were():
    built = engine_flags(_args("--paper"), _Work(), [_Phase()], 1)
    assert not any(f.startswith("--ablation") for f in built)


def test_set_knobs_reach_every_arms_dasc_build():
    built = engine_flags(_args("--paper", "--step-delay-ms", "40", "--step-slowdown", "1.5"), _Work(), [_Phase()], 1)
    assert built[built.index("--ablation-step-delay-ms") + 1] == "40.0"
    assert built[built.index("--ablation-step-slowdown") + 1] == "1.5"


def test_an_ablation_is_another_manifest(capsys):
    ids = []
    for extra in ([], ["--step-delay-ms", "40"], ["--step-slowdown", "2"]):
        assert main([*PLAN, "--paper", *extra]) == 0
        ids.append(json.loads(capsys.readouterr().out)["manifest_id"])
    assert len(set(ids)) == 3


@pytest.mark.parametrize("flags", [["--step-delay-ms", "-1"], ["--step-delay-ms", "nan"], ["--step-slowdown", "0.5"],
                                   ["--step-slowdown", "1000"]])
def test_out_of_range_is_one_line(flags, capsys):
    assert main([*PLAN, "--paper", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flags[0] in err[0]
