"""The horizon-order figure (benchmarks/precision_control_plot.py) draws what precision_control measured:
each arm's medians as they are in the JSON, an empty window (KL at T = 0) and zero values left off the log
axes; a file that is not such a result is refused in one line."""
from __future__ import annotations

import json

from benchmarks import precision_control_plot as pcp


def _result():
    return {"model": "m", "wmax": 16, "precision": "horizon:128,1024:int4,int8,int8", "prefix": 64, "prefixes": 2,
            "commit": "abc1234", "tokens_after_load": [0, 16, 64], "kept_units_by_codec": {"int4": 3, "int8": 2},
            "median": {"state": {"horizon": [0.05, 0.01, 0.002], "int8": [0.006, 0.0, 0.001],
                                 "shuffled@1": [0.09, 0.05, 0.02]},
                       "kl": {"horizon": [None, 1e-6, 4e-8], "int8": [None, 8e-8, 2e-8],
                              "shuffled@1": [None, 2e-5, 4e-6]}}}


def test_the_curves_are_the_results_medians():
    c = pcp.curves(_result())
    assert c["state"]["horizon"] == [(0, 0.05), (16, 0.01), (64, 0.002)]
    assert c["state"]["int8"] == [(0, 0.006), (64, 0.001)]            # a zero cannot sit on a log axis
    assert c["kl"]["shuffled@1"] == [(16, 2e-5), (64, 4e-6)]          # no window before the load
    assert set(c["kl"]) == {"horizon", "int8", "shuffled@1"}


def test_a_figure_from_two_results_and_bad_input_refused(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_result()))
    b.write_text(json.dumps({**_result(), "model": "other"}))
    out = tmp_path / "fig.png"
    assert pcp.main([str(a), str(b), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"bands": []}))                           # precision_error's shape, not this
    assert pcp.main([str(bad), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "is not a precision_control result" in err and len(err.strip().splitlines()) == 1
