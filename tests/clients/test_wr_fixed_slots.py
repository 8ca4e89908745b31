"""benchmarks/serve_wr_fixed_slots.py (Table 8, fixed slots) at a tiny scale on real tritonservers (CPU): run in
two calls (one seed each), every multi-turn request is served from the previous turn's prompt-end checkpoint
(C = L_prev - 1, counted from the workload alone), wr replays at most W tokens per hit and nr none, and the
per-hit cost is recomputed by hand from the cells: dTTFT x requests / N_hit. The workload at the paper's
size has 1,051 turns in 200 conversations and a hit rate near 0.80."""
from __future__ import annotations

import json
import statistics

import pytest

from clients.multiturn import MultiTurnConfig


def _driver():
    from benchmarks import serve_wr_fixed_slots as mod
    return mod


def test_paper_sized_workload():
    cfg = MultiTurnConfig(vocab=163840)
    counts = cfg.turn_counts()
    assert (len(counts), sum(counts), sorted(set(counts))) == (200, 1051, [5, 6])
    lens = cached = 0
    for c in range(0, 200, 10):
        ps = cfg.conversation(c, counts[c])
        for k, p in enumerate(ps):
            if k:
                assert (p[:len(ps[k - 1])] == ps[k - 1]).all()      # each turn extends the one before
            lens += len(p)
            cached += len(ps[k - 1]) - 1 if k else 0
    assert 0.75 < cached / lens < 0.82


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("wrfs")
    mod = _driver()
    common = ["--smoke", "--cells-dir", str(d / "cells"), "--work", str(d / "work"), "--out", str(d / "r.json")]
    assert mod.main([*common, "--max-units", "1"]) == 0
    first = json.loads((d / "r.json").read_text())
    assert mod.main(common) == 0
    cells = [json.loads(p.read_text()) for p in sorted((d / "cells" / "cells").glob("*/*.json"))]
    return first, json.loads((d / "r.json").read_text()), cells


def test_split_calls_fill_the_table(run):
    first, final, cells = run
    assert first["cells_done"] == 2 and first["table8"] == {}
    assert final["cells_done"] == final["cells_total"] == 4 and list(final["table8"]) == ["16"]
    assert final["slots"] == 899 and final["commit"]
    for c in cells:
        # nr and wr of one seed ran in the same call
        assert any(o["call"] == c["call"] and o["unit"] == c["unit"] and o["arm"] != c["arm"] for o in cells)


def test_hits_come_from_the_previous_turn_and_wr_replays(run):
    _, _, cells = run
    cfg = MultiTurnConfig(vocab=3072, conversations=4, turns=10, scale=0.02)
    for c in cells:
        cell = c["cell"]
        for conv, turn, n, cached, replayed in zip(cell["conversation"], cell["turn"], cell["prompt_len"],
                                                   cell["cached"], cell["replayed"]):
            prompts = cfg.conversation(conv, cfg.turn_counts()[conv])
            assert n == len(prompts[turn])
            assert cached == (len(prompts[turn - 1]) - 1 if turn else 0)
            assert replayed == 0 if c["arm"].startswith("nr") or not turn else 0 < replayed <= 16
        assert cell["server"]["cached_tokens"] == sum(cell["cached"])
        assert cell["server"]["replayed_tokens"] == sum(cell["replayed"])


def test_cost_per_hit_is_dttft_times_requests_over_hits(run):
    _, final, cells = run
    row = final["table8"]["16"]
    by = {(c["arm"], c["cell"]["seed"]): c["cell"] for c in cells}
    cost, delta = [], []
    for s in row["seeds"]:
        nr, wr = by[("nr16", s)], by[("wr16", s)]
        d = statistics.fmean(wr["ttft_ms"]) - statistics.fmean(nr["ttft_ms"])
        hits = sum(1 for x in wr["cached"] if x > 0)
        assert hits == 6                       # 10 turns in 4 conversations: all but the first turns
        delta.append(d)
        cost.append(d * 10 / hits)
    assert row["delta_ttft_ms"]["mean"] == pytest.approx(statistics.fmean(delta))
    assert row["cost_per_hit_ms"]["mean"] == pytest.approx(statistics.fmean(cost))
    assert row["cost_per_hit_ms"]["std"] == pytest.approx(statistics.stdev(cost))
    assert row["paper_cost_per_hit_ms"] == 67.0 and row["target_ms"] == pytest.approx(6.7)
