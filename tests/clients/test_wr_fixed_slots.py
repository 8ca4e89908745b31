"""benchmarks/serve_wr_fixed_slots.py (Table 8, fixed slots) at a tiny scale on real tritonservers (CPU): run in
two calls (one seed each), every multi-turn request is served from the previous turn's prompt-end checkpoint
(C = L_prev - 1, counted from the workload alone), wr replays at most W tokens per hit and nr none, and the
per-hit cost is recomputed by hand from the cells: dTTFT x requests / N_hit. The workload at the paper's
size has 1,051 turns in 200 conversations and a hit rate near 0.80. The run uses the full-size path's flags
(a config.json, --load-format dummy, --memory-limit-bytes) and is compared with the same measurement unsplit
(one call, under a deadline it never reaches); the deadline's gate, the pairing of cells of one call, the merge
and the KV sizing (against dasc-build's own memory check) are checked on their own."""
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


TINY_CONFIG = "trtllm_dasc/assets/tiny-kimi-linear/config.json"
# the embedded tiny model's config with dummy weights (the full-size path's flags), a memory limit far above it
DUMMY = ["--smoke", "--model", TINY_CONFIG, "--load-format", "dummy", "--seed", "0",
         "--memory-limit-bytes", str(10 ** 11)]


def _cells(root):
    return [json.loads(p.read_text()) for p in sorted((root / "cells").glob("*/*.json"))]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The same measurement split over two calls (--max-units 1, then the rest) and unsplit in one call (under a
    deadline it never reaches)."""
    d = tmp_path_factory.mktemp("wrfs")
    mod = _driver()
    common = [*DUMMY, "--cells-dir", str(d / "cells"), "--work", str(d / "work"), "--out", str(d / "r.json")]
    assert mod.main([*common, "--max-units", "1"]) == 0
    first = json.loads((d / "r.json").read_text())
    assert mod.main(common) == 0
    whole = [*DUMMY, "--cells-dir", str(d / "whole"), "--work", str(d / "work"), "--out", str(d / "w.json"),
             "--call-deadline-s", "600"]
    assert mod.main(whole) == 0
    return {"first": first, "final": json.loads((d / "r.json").read_text()), "cells": _cells(d / "cells"),
            "whole": json.loads((d / "w.json").read_text()), "whole_cells": _cells(d / "whole"), "dir": d}


def test_split_calls_fill_the_table(run):
    first, final, cells = run["first"], run["final"], run["cells"]
    assert first["cells_done"] == 2 and first["table8"] == {} and first["pending"] == {"16": ["s7"]}
    assert final["cells_done"] == final["cells_total"] == 4 and list(final["table8"]) == ["16"]
    assert final["slots"] == 899 and final["commit"] and final["pending"] == {} and len(final["calls"]) == 2
    for c in cells:
        # nr and wr of one seed ran in the same call
        assert any(o["call"] == c["call"] and o["unit"] == c["unit"] and o["arm"] != c["arm"] for o in cells)


def test_dummy_weights_and_memory_limit_reach_the_engines(run):
    final = run["final"]
    assert final["load_format"] == "dummy" and final["weights_seed"] == 0 and final["model"] == TINY_CONFIG
    flags = " ".join(final["build_flags"])
    assert "--load-format dummy --seed 0" in flags and f"--memory-limit-bytes {10 ** 11}" in flags
    kv = final["kv_cache"]
    # 4 conversations + 4 running requests, each at the longest prompt (the lognormal shape's cap at scale 0.02,
    # 82 tokens, + 2 x (2 + 2) of turns + 1: 6 blocks of 16)
    assert (kv["need"], kv["live"], kv["blocks"]) == (48, 2 * 6 + 4, 48) and "--kv-blocks 48" in flags
    model_dir = run["dir"] / "work" / "engines" / "wr16" / "model"
    assert (model_dir / "config.json").exists() and not list(model_dir.glob("*.safetensors"))


def test_split_run_equals_the_unsplit_one(run):
    """Same manifest, same cells, the same table but for the timings."""
    final, whole = run["final"], run["whole"]
    assert final["manifest_id"] == whole["manifest_id"]
    key = lambda c: (c["arm"], c["unit"])  # noqa: E731
    split = {key(c): c["cell"] for c in run["cells"]}
    one = {key(c): c["cell"] for c in run["whole_cells"]}
    assert sorted(split) == sorted(one) == [("nr16", "s42"), ("nr16", "s7"), ("wr16", "s42"), ("wr16", "s7")]
    assert len(run["cells"]) == len(run["whole_cells"]) == 4         # no cell measured twice
    assert len({c["call"] for c in run["whole_cells"]}) == 1 and len({c["call"] for c in run["cells"]}) == 2
    for k in split:
        for field in ("requests", "order", "conversation", "turn", "prompt_len", "cached", "replayed"):
            assert split[k][field] == one[k][field], (k, field)
    a, b = final["table8"]["16"], whole["table8"]["16"]
    assert a["seeds"] == b["seeds"] == [42, 7]
    for field in ("hit_rate_nr", "hit_rate_wr", "replay_tokens_per_hit"):
        assert a[field]["per_seed"] == b[field]["per_seed"], field
    assert whole["calls"][0]["deadline_s"] == 600 and whole["calls"][0]["stopped_before"] is None


def test_merge_equals_the_resumed_run_and_refuses_mixed_commits(run, tmp_path):
    import shutil
    mod = _driver()
    d = run["dir"]
    assert mod.main(["--merge", str(d / "cells"), "--out", str(tmp_path / "m.json")]) == 0
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["table8"] == run["final"]["table8"] and merged["commit"] == run["final"]["commit"]
    bad = tmp_path / "bad"
    shutil.copytree(d / "whole", bad)
    cell = next((bad / "cells" / "wr16").glob("*.json"))
    cell.write_text(json.dumps({**json.loads(cell.read_text()), "commit": "0" * 40}))
    assert mod.main(["--merge", str(d / "cells"), str(bad), "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()


def test_a_pair_never_joins_two_calls():
    from benchmarks.serve_wr_fixed_slots import table
    manifest = {"arms": [{"wmax": 16}], "seeds": [1]}

    def cell(arm, call, ttft):
        return {"arm": arm, "unit": "s1", "call": call, "cell": {"seed": 1, "requests": 2, "ttft_ms": [ttft, ttft],
                                                                   "cached": [0, 10], "prompt_len": [10, 20],
                                                                   "replayed": [0, 4 if arm == "wr16" else 0]}}
    cells = [cell("nr16", "A", 100.0), cell("wr16", "B", 130.0)]
    assert table(manifest, cells) == {}                      # nr of call A, wr of call B: no pair
    cells += [cell("wr16", "A", 110.0), cell("nr16", "B", 50.0)]
    row = table(manifest, cells)["16"]                       # call A's pair (the first call with both)
    # dTTFT 10 ms, 2 requests, 1 hit: 20 ms a hit
    assert row["delta_ttft_ms"]["per_seed"] == [10.0] and row["cost_per_hit_ms"]["per_seed"] == [20.0]


def test_the_deadline_starts_nothing_that_cannot_end():
    from clients.fixed_slots import UnitDeadline
    now = [0.0]
    # 100 requests a cell; nr16 measured at 0.1 s a request, nothing else yet; default rate 0.3, start 30, build 5
    g = UnitDeadline(200.0, 100, {"nr16": [0.1, 0.05]}, 0.3, 30.0, 5.0, clock=lambda: now[0])
    assert g.cell_s("nr16") == pytest.approx(10.0) and g.cell_s("wr16") == pytest.approx(10.0)   # the most seen
    assert g.cell_s("nr64") == pytest.approx(10.0)
    # a W owes two builds, two starts and one pair: 10 + 60 + 20 = 90
    now[0] = 110.0
    assert g.fits_w(16, 42)
    now[0] = 110.5
    assert not g.fits_w(16, 42) and g.stopped == ("nr16", "s42")
    g = UnitDeadline(200.0, 100, {}, 0.3, 30.0, 5.0, clock=lambda: now[0])
    assert g.cell_s("wr16") == pytest.approx(30.0)           # nothing measured: the conservative default
    g.record_start(12.0)
    g.record_cell("nr16", 5.0)                              # 0.05 s a request
    g.record_cell("wr16", 8.0)
    # the third seed of nr: its cell 5 + wr's start 12 + wr's three cells 24 = 41
    now[0] = 159.0
    assert g.fits_seed(16, 1, 2)
    now[0] = 159.5
    assert not g.fits_seed(16, 1, 2) and g.stopped == ("nr16", "s1")


def test_a_deadline_too_short_for_one_pair_starts_no_server(tmp_path):
    mod = _driver()
    args = [*DUMMY, "--cells-dir", str(tmp_path / "c"), "--work", str(tmp_path / "w"),
            "--out", str(tmp_path / "r.json"), "--call-deadline-s", "5"]
    assert mod.main(args) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["cells_done"] == 0 and r["pending"] == {"16": ["s42", "s7"]}
    assert r["calls"][0]["stopped_before"] == ["nr16", "s42"] and r["calls"][0]["servers"] == []
    assert not (tmp_path / "w" / "servers").exists()


@pytest.mark.parametrize("flags, needle", [
    (["--memory-limit-bytes", "lots"], "--memory-limit-bytes must be a number of bytes"),
    (["--memory-limit-bytes", "0"], "--memory-limit-bytes must be >= 1"),
    (["--memory-headroom-gib", "-1"], "--memory-headroom-gib must be >= 0")])
def test_bad_memory_flags_are_refused_as_matched_hbm_refuses_them(flags, needle, tmp_path, capsys):
    """The same flags as clients.matched_hbm (tests/clients/test_cli_errors.py), refused in the same one line,
    before any server starts."""
    mod = _driver()
    args = [*DUMMY, *flags, "--cells-dir", str(tmp_path / "c"), "--work", str(tmp_path / "w"),
            "--out", str(tmp_path / "r.json")]
    assert mod.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and not (tmp_path / "w" / "servers").exists()


def test_kv_cache_is_what_fits_and_dasc_build_agrees(run, tmp_path, capsys):
    """Between the live conversations' need and the whole workload's, the KV blocks are the most that fit: the
    engine's own build check (dasc-build --memory-limit-bytes) takes that many blocks and refuses one more. Built
    as the wr arm: the same slots as nr's, and its replay spans make its step the largest of the arms'."""
    from build_scripts import dasc_build
    mod = _driver()

    def plan(limit):
        rc = mod.main([*DUMMY[:-1], str(limit), "--cells-dir", str(tmp_path / f"c{limit}"), "--plan-only"])
        return rc, (json.loads(capsys.readouterr().out) if rc == 0 else None)
    fixed, block = run["final"]["kv_cache"]["fixed_bytes"], run["final"]["kv_cache"]["block_bytes"]
    limit = fixed + (20 + 1) * block + block // 2          # 20 blocks (+ the padding block) and half of another
    rc, p = plan(limit)
    assert rc == 0 and p["kv_cache"]["blocks"] == 20 and p["kv_cache"]["fit"] == 20
    flags = p["build_flags"].split()
    assert flags[flags.index("--kv-blocks") + 1] == "20"

    def build(blocks):
        f = list(flags)
        f[f.index("--kv-blocks") + 1] = str(blocks)
        return dasc_build.main(["--model", TINY_CONFIG, "--output", str(tmp_path / f"e{blocks}"), "--force",
                                "--state-budget-bytes", str(900 * p["checkpoint_bytes"]["nr16"]), *f, "--wmax", "16",
                                "--policy", "wr"])
    assert build(20) == 0
    capsys.readouterr()
    assert build(21) != 0 and "memory" in capsys.readouterr().err.lower()
    # fewer blocks than the live conversations hold: refused before anything is built
    rc, _ = plan(fixed + (15 + 1) * block)
    assert rc == 2 and "live conversations" in capsys.readouterr().err


def test_hits_come_from_the_previous_turn_and_wr_replays(run):
    cells = run["cells"] + run["whole_cells"]
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


@pytest.mark.parametrize("which", ["final", "whole"])
def test_cost_per_hit_is_dttft_times_requests_over_hits(run, which):
    final, cells = run[which], run["cells" if which == "final" else "whole_cells"]
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
