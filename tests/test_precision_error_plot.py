"""The codec error figure (benchmarks/precision_error_plot.py) draws what precision_error measured: each band
with units a panel, each arm's medians as they are in the JSON, the static bound beside the retention, a band
without units left out; a result it cannot read is refused in one line."""
from __future__ import annotations

import json
import math

import pytest

from benchmarks import precision_error_plot as pep


def _result():
    pts = [0, 16, 64, 1024, 4096]
    band = lambda b, units, codec: {  # noqa: E731
        "band": b, "horizon_from": 16.0 * 64 ** b, "horizon_below": None if b == 2 else 16.0 * 64 ** (b + 1),
        "horizon_codec": codec, "units": units, "max_horizon": 1000.0 * (b + 1),
        "bound": [1e-3 ** (t / (1000.0 * (b + 1))) for t in pts],
        "arms": {"int8": {"rel_error": [1e-2 / (1 + t) for t in pts], "retention": [1 / (1 + t) for t in pts]},
                 "conv8": {"rel_error": [None, 1e-4, 1e-5, 1e-6, 1e-7], "retention": None},
                 "int4": {"rel_error": None if not units else [0.1] * 5, "retention": None if not units else [1.0] * 5}}}
    return {"model": "m", "wmax": 16, "precision": "horizon", "prefix": 64, "prefixes": 2, "commit": "abc1234",
            "tokens_after_load": pts, "bands": [band(0, 10, "int4"), band(1, 0, "int8"), band(2, 3, "native")]}


def test_the_curves_are_the_results_numbers():
    r = _result()
    panels = pep.curves(r)
    assert [p["name"].split(":")[0] for p in panels] == ["horizons [16, 1024)", "horizons [65536, inf)"]
    for panel, band in zip(panels, (r["bands"][0], r["bands"][2])):
        assert panel["x"] == r["tokens_after_load"] and panel["bound"] == band["bound"]
        assert panel["rel_error"] == {a: v["rel_error"] for a, v in band["arms"].items()}
        # an arm without retention (conv8: nothing written to the temporal state) draws no retention curve
        assert set(panel["retention"]) == {"int8", "int4"}
        assert math.isclose(panel["bound"][3], 1e-3 ** (1024 / band["max_horizon"]))


def test_a_figure_per_result_and_bad_input_refused(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_result()))
    assert pep.main([str(path)]) == 0 and (tmp_path / "r.png").stat().st_size > 10_000
    assert pep.main([str(path), "--out", str(tmp_path / "f.png")]) == 0 and (tmp_path / "f.png").is_file()
    (tmp_path / "bad.json").write_text('{"bands": []}')
    assert pep.main([str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.json" in err[0]
    with pytest.raises(SystemExit):
        pep.main([str(path), str(path), "--out", "x.png"])
