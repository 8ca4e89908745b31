"""Horizon-aware precision with the storage placement at TP4, where a rank holds no unit of one codec segment but
receives one from another rank (the review helper's case: gdn, W_max 32, `--precision horizon`: rank 2's INT4
segment is empty and rank 0 sends it a unit). The CPU codec path reshaped that empty group with -1 and the first
checkpoint store aborted every rank; dasc-build had accepted the configuration. Tokens and cached tokens now equal
the TP1 engine's of the same arm. Fails on the old code."""
from __future__ import annotations

import pytest

from tp_helpers import build_tp_model, have_mpi, run_job

pytestmark = pytest.mark.skipif(have_mpi() is not None, reason=str(have_mpi()))


def test_an_empty_codec_segment_on_one_rank_matches_tp1(tmp_path):
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    model = tmp_path / "gdn"
    build_tp_model(model, "gdn", seed=10)
    plan, _ = plan_from_path(str(model), PlanOptions(wmax=32, tp=4, placement="storage", precision="horizon"))
    # the case itself: some rank keeps no unit of a segment another rank sends it units of
    empty = [(x.segment, x.dst) for x in plan.storage.transfers
             if not sum(map(len, plan.segment_retained(x.dst, x.segment)))]
    assert empty, "the model no longer gives a rank an empty codec segment that receives units"
    args = ["--model", str(model), "--wmax", "32", "--precision", "horizon", "--placement", "storage"]
    got = run_job(4, [*args, "--tp", "4"], tmp_path / "tp4.json", timeout=400)
    ref = run_job(1, [*args[:-2], "--tp", "1"], tmp_path / "tp1.json", timeout=300)
    for part in ("cold", "hot", "sampled"):
        assert [g["tokens"] for g in got[part]] == [r["tokens"] for r in ref[part]], part
        assert [g["cached"] for g in got[part]] == [r["cached"] for r in ref[part]], part
        assert not any(g["error"] for g in got[part]), got[part]
    assert any(c for c in (g["cached"] for g in got["hot"])), "no checkpoint hit: the loads were not exercised"
