"""The resumable matched-HBM protocol against real tritonservers (dasc-build engines of the embedded model, CPU):
  - a run split over two calls (--cells-dir, a first call cut short by its deadline, then the rest) and merged
    from its cells equals the unsplit run in everything but timings: manifest, cells, every request's prompt
    and cached tokens, output tokens, the engine's own counters;
  - which units a call cut by --max-units runs (runner.plan_units, without servers; tests/clients/
    test_dummy_cells.py cuts a served call with --max-units 1): the call after a cut is the same whatever
    cut it, since what a call runs depends on the cells done only;
  - the HTTP SSE transport (generate_stream) and the gRPC one give the same hits and token counts.
One client (concurrency 1) makes the cache's eviction order, and so every hit, independent of timing."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clients.matched_hbm import main

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "trtllm_dasc" / "assets" / "tiny-kimi-linear")
# two phases (dense's boundary Q=4 and INT8's Q=15), one block each, one seed: two units, four cells
ARGV = ["--model", MODEL, "--arms", "dense,nr16+int8", "--dense-slots", "3", "--scale", "0.03",
        "--blocks-per-phase", "1", "--seeds", "42", "--concurrency", "1", "--output-tokens", "2", "--device", "cpu",
        "--dtype", "float32", "--max-batch-size", "4", "--torch-threads", "1", "--plot", "none"]
# what a repeat of the same measurement may change: clocks, and where it ran
TIMING = {"seconds", "ttft_ms", "e2e_ms", "input_tokens_per_s", "protocol_s", "ready_s", "server_log", "call",
          "calls", "exchange", "arm_calls", "ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "vs_dense"}


def _load(path):
    with open(path) as f:
        return json.load(f)


def _strip(x):
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in TIMING}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def _merge_mod():
    from benchmarks import merge_matched_hbm as mod
    return mod


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cells")
    out = {}
    assert main([*ARGV, "--out", str(d / "whole"), "--json", str(d / "whole.json")]) == 0
    out["whole"] = _load(d / "whole.json")
    # the split by a wall-clock deadline: one already past stops the first call after each arm's first unit (a
    # call always measures one); the second call, without one, runs the rest
    dl = ["--out", str(d / "dl"), "--cells-dir", str(d / "dl_cells"), "--json", str(d / "dl.json")]
    assert main([*ARGV, *dl, "--call-deadline-s", "0.001"]) == 0
    out["dl_half"] = _load(d / "dl.json")
    assert main([*ARGV, *dl]) == 0
    assert _merge_mod().main(["--cells", str(d / "dl_cells"), "--out", str(d / "dl_merged.json")]) == 0
    out["dl_merged"] = _load(d / "dl_merged.json")
    # the dense arm alone (its blocks are those of the two phases all the same)
    grpc = [*ARGV, "--transport", "grpc", "--phase-arms", "dense,nr16+int8", "--out", str(d / "grpc"), "--json",
            str(d / "grpc.json")]
    grpc[grpc.index("--arms") + 1] = "dense"
    assert main(grpc) == 0
    out["grpc"] = _load(d / "grpc.json")
    out["dir"] = d
    return out


def _requests(res):
    """Per arm, per block in order: the replay's prompt order, L_i, C_i, output tokens, engine counters."""
    return {a["key"]: [(b["phase"], b["seed"], b["replay"]["order"], b["replay"]["prompt_len"], b["replay"]["cached"],
                        b["replay"]["output_tokens"], b["server"]["cached_tokens"], b["fill"]["checkpoints_cached"])
                       for b in a["blocks"]] for a in res["arms"]}


def test_first_call_is_partial_and_says_so(runs):
    half = runs["dl_half"]
    assert half["complete"] is False and (half["cells_done"], half["cells_total"]) == (2, 4)
    # the dense cell of the unit ran beside the arm's: the first unit of each arm, nothing more
    assert [(a["key"], a["cells"], a["pending"]) for a in half["arms"]] == [("dense", 1, 1), ("nr16+int8", 1, 1)]
    assert "vs_dense" not in half["arms"][1]


def test_max_units_takes_the_first_units_an_arm_lacks():
    """Which units a call with --max-units runs (the server-free part of the cut: the rest is any call's)."""
    from clients.runner import arm_units, plan_units

    class Store:
        def __init__(self, done):
            self.have = set(done)

        def done(self, arm, unit):
            return (arm, unit) in self.have
    manifest = {"baseline": "dense", "units": ["u0", "u1", "u2"]}
    keys = ["dense", "nr16"]
    assert plan_units(Store([]), manifest, keys, 1) == ["u0"]
    assert plan_units(Store([]), manifest, keys, None) == ["u0", "u1", "u2"]
    # a unit whose dense cell alone is done is still to run (its dasc cell pairs with a dense one of its call)
    store = Store([("dense", "u0"), ("nr16", "u0"), ("dense", "u1")])
    assert plan_units(store, manifest, keys, 1) == ["u1"]
    assert plan_units(store, manifest, keys, 5) == ["u1", "u2"]
    # the baseline runs every unit of the call again, the other arms only what they lack
    assert arm_units(store, manifest, "dense", ["u1", "u2"]) == ["u1", "u2"]
    assert arm_units(Store([("nr16", "u1")]), manifest, "nr16", ["u1", "u2"]) == ["u2"]


def test_split_run_merged_equals_the_unsplit_run(runs):
    whole, merged = runs["whole"], runs["dl_merged"]
    assert merged["complete"] and whole["complete"]
    assert merged["manifest"] == whole["manifest"] and merged["manifest"]["units"] == 2
    assert len(merged["calls"]) == 2 and len(whole["calls"]) == 1
    assert _requests(merged) == _requests(whole)
    # everything else but timings and provenance: phases, slots, blocks, the hit rates of the summaries
    prov = ("command", "commit", "calls", "cells_dir", "cells_dirs", "json_path", "python", "cpus", "assembled_by")
    assert (_strip({k: v for k, v in merged.items() if k not in prov})
            == _strip({k: v for k, v in whole.items() if k not in prov}))
    for a in merged["arms"]:
        assert a["summary"]["seeds"]["hit_rate"]["std"] == 0.0 and a["summary"]["seeds"]["hit_rate"]["mean"] > 0


def test_a_deadline_stops_between_units_and_the_next_call_finishes(runs):
    half, merged, whole = runs["dl_half"], runs["dl_merged"], runs["whole"]
    assert half["complete"] is False and (half["cells_done"], half["cells_total"]) == (2, 4)
    assert [(a["key"], a["cells"]) for a in half["arms"]] == [("dense", 1), ("nr16+int8", 1)]
    calls = sorted((runs["dir"] / "dl_cells" / "calls").glob("*.json"))
    first = _load(calls[0])
    # the call says where it stopped and what is left
    assert first["stopped_before"] == ["dense", _load(runs["dir"] / "dl_cells" / "manifest.json")["units"][1]]
    assert (first["units_left"], first["cells_left"]) == (1, 1)
    # the second call, without a deadline, ran the rest: the merge is the unsplit run
    # (test_split_run_merged_equals_the_unsplit_run compares everything else)
    assert merged["complete"] and len(merged["calls"]) == 2 and _requests(merged) == _requests(whole)


def test_the_budget_reserves_the_later_arms_start_and_cells():
    from clients.runner import CallBudget
    now = [100.0]
    # 10 requests a unit; measured: 2 s a request (20 s a unit) and a 50 s server start
    b = CallBudget(300.0, lambda u: 10, clock=lambda: now[0])
    b.record_unit("u0", 20.0)
    b.record_start(50.0)
    # the baseline's 2nd unit: 20 s + the arm's start 50 s + its two units 40 s = 110 s -> by 210 <= 300
    assert b.fits("u1", [["u0", "u1"]], first=False)
    now[0] = 191.0
    assert not b.fits("u1", [["u0", "u1"]], first=False)
    # an arm with nothing owed after it needs only its own unit; the first unit always runs
    assert b.fits("u1", [[]], first=False) and CallBudget(0.0, lambda u: 1, clock=lambda: 5.0).fits("u", [], True)
    b.record_unit("u2", 40.0)        # a slower unit: 4 s a request from now on
    assert b.cost(["a", "b"]) == 80.0


def test_a_first_unit_waits_for_a_fresh_call_when_one_could_do_it():
    """A GPU call's first unit with priors (0.05 s a request, 60 s a warm start): the numbers of the first
    cells call of 12-04 on a fresh H200: the 48B dense server ready after 337 s of a 537 s deadline, a unit of
    1,800 requests per arm, one arm after the baseline."""
    from clients.runner import CallBudget
    now = [337.0]
    cold = CallBudget(537.0, lambda u: 1800, clock=lambda: now[0], length=537.0, prior_rate=0.05,
                      prior_start=60.0)
    cold.record_start(337.0)
    # now: 90 s + (the slowest start so far, 337 s) + 90 s = 517 s by 854 > 537; a fresh call: 60 + 90 + 60 +
    # 90 = 300 s <= 537: stop, the next call (warm kernels) runs it
    assert not cold.fits("u0", [["u0"]], first=True)
    # the same unit early in a call fits: it runs
    now[0] = 38.0
    warm = CallBudget(537.0, lambda u: 1800, clock=lambda: now[0], length=537.0, prior_rate=0.05,
                      prior_start=60.0)
    warm.record_start(38.0)
    assert warm.fits("u0", [["u0"]], first=True)          # 38 + 90 + 60 + 90 = 278 <= 537
    # a unit no call of this length could fit (10,000 requests: 500 s an arm; a fresh call needs 60 + 500 + 60 +
    # 500 = 1,120 s) is not started either, even early in a call: the timeout would only kill it
    now[0] = 5.0
    huge = CallBudget(537.0, lambda u: 10_000, clock=lambda: now[0], length=537.0, prior_rate=0.05,
                      prior_start=60.0)
    assert not huge.fits("u0", [["u0"]], first=True) and huge.too_long == 1120.0
    assert cold.too_long is None
    # without priors (a CPU call) the first unit always runs, as before
    assert CallBudget(537.0, lambda u: 1800, clock=lambda: 537.0, length=537.0).fits("u0", [["u0"]], first=True)
    # a rate measured in the call replaces the prior: at 100 s, 0.05 s a request owes 90 + 337 + 90 (617 > 537),
    # 0.01 s a request (measured) 18 + 337 + 18 (473 <= 537)
    now[0] = 100.0
    assert not cold.fits("u0", [["u0"]], first=True)
    cold.record_unit("u9", 18.0)
    assert cold.fits("u0", [["u0"]], first=True)


def test_each_ratio_pairs_cells_of_one_call(runs):
    d = runs["dir"] / "dl_cells"
    cells = {(c["arm"], c["unit"]): c["call"] for c in map(_load, (d / "cells").glob("*/*.json"))}
    # the manifest's units: phase 0 (Q=4) and 1 (Q=15), each the middle block of the dataset (evenly spread)
    units = _load(d / "manifest.json")["units"]
    assert units == [f"p0-b{6016 // 4}-s42", f"p1-b{802 // 2}-s42"]
    assert sorted(cells) == sorted((arm, u) for arm in ("dense", "nr16+int8") for u in units)
    for unit in units:
        assert cells[("dense", unit)] == cells[("nr16+int8", unit)]
    assert cells[("dense", units[0])] != cells[("dense", units[1])]
    assert "vs_dense" in runs["dl_merged"]["arms"][1]


def test_http_and_grpc_transports_give_the_same_hits_and_tokens(runs):
    http, grpc = runs["whole"], runs["grpc"]
    assert http["transport"] == "http" and grpc["transport"] == "grpc"
    assert _requests(http)["dense"] == _requests(grpc)["dense"]
    for a in http["arms"]:
        for b in a["blocks"]:
            rp = b["replay"]
            # two output tokens each; the client's Eq. 9 counts equal the engine's over the replay
            assert rp["output_tokens"] == 2 * rp["requests"]
            assert rp["cached_tokens"] == b["server"]["cached_tokens"] and rp["prompt_tokens"] == b["server"]["prompt_tokens"]
            # the first SSE chunk comes before the stream ends
            assert all(0 < t < e for t, e in zip(rp["ttft_ms"], rp["e2e_ms"]))
    # some misses at dense's Q=15 block, so the comparison is not between two all-hit runs
    dense = http["arms"][0]["blocks"]
    assert any(c < n - 1 for b in dense for c, n in zip(b["replay"]["cached"], b["replay"]["prompt_len"]))


def test_a_call_with_another_manifest_is_refused(runs, capsys):
    d = runs["dir"]
    argv = [*ARGV, "--out", str(d / "other"), "--cells-dir", str(d / "dl_cells")]
    argv[argv.index("--seeds") + 1] = "7"
    assert main(argv) == 2
    assert "another manifest" in capsys.readouterr().err


def test_a_unit_is_planned_at_its_phase_rate_from_earlier_calls():
    """12-05 15:36: a second job with a 479 s deadline; the dense server ready at ~60 s; its first unit a Q=1617
    one (3,234 requests an arm). At the 0.05 s prior it looked like 60 + 162 + 60 + 162 = 444 s and ran; dense
    took 0.0686 s a request there (222 s) and nr16's partner cell no longer fit. The directory's earlier cell
    of that phase (0.0686 s a request) now sets the floor: 60 + 222 + 60 + 222 = 564 s > 479, not started."""
    from clients.cells_estimate import phase_rates
    from clients.protocol import unit_phase
    from clients.runner import CallBudget
    manifest = {"units": ["p3-b7-s7", "p4-b4-s42", "p4-b4-s123"],
                "phases": [{"q": 1, "repeats": 1}] * 3 + [{"q": 851, "repeats": 1}, {"q": 1617, "repeats": 1}]}
    cells = [{"arm": "dense", "unit": "p4-b4-s42", "seconds": 221.85},     # 0.0686 s a request (2 x 1617)
             {"arm": "nr16", "unit": "p3-b7-s7", "seconds": 85.1},         # 0.05 s a request (2 x 851)
             {"arm": "dense", "unit": "p9-b0-s1", "seconds": 1e9}]         # not in this manifest: ignored
    known = phase_rates(manifest, cells)
    assert known == pytest.approx({4: 221.85 / 3234, 3: 85.1 / 1702})
    requests = lambda u: 3234 if unit_phase(u) == 4 else 1702  # noqa: E731
    now = [60.0]
    args = dict(clock=lambda: now[0], length=479.0, prior_rate=0.05, prior_start=60.0)
    unaware = CallBudget(479.0, requests, **args)
    unaware.record_start(60.0)
    assert unaware.fits("p4-b4-s123", [["p4-b4-s123"]], first=True)       # 444 <= 479: the 12-05 mistake
    aware = CallBudget(479.0, requests, known_rate=lambda u: known.get(unit_phase(u)), **args)
    aware.record_start(60.0)
    assert not aware.fits("p4-b4-s123", [["p4-b4-s123"]], first=True)
    # a phase faster than the call's own measured rate does not lower it: the floor only raises
    aware.record_unit("p4-b4-s42", 0.1 * 3234)
    assert aware.cost(["p3-b7-s7"]) == pytest.approx(0.1 * 1702)


def test_a_fresh_call_is_planned_with_the_directory_s_own_server_starts(tmp_path, monkeypatch):
    """A model whose servers take 200 s to be ready even on a warm kernel cache: a unit of 3,000 requests an
    arm at 0.05 s (150 s) fits a 537 s call by the fixed 60 s prior (60 + 150 + 60 + 150 = 420 s), so a call
    that could not start it skipped it without saying it needs a longer deadline, every call. With the
    directory's median ready time (205 s) a fresh call needs 205 + 150 + 205 + 150 = 710 s > 537: the hint."""
    import json
    import shutil
    import types
    from clients import runner
    from clients.cells import CellStore
    from clients.cells_estimate import ready_prior
    # the recorded ready times: a median over every arm that has one (a cold 400 s first start does not set it)
    calls = [{"call": "a", "arms": [{"key": "dense", "ready_s": 400.0}, {"key": "nr16", "ready_s": 190.0}]},
             {"call": "b", "arms": [{"key": "dense", "ready_s": 200.0}, {"key": "nr16", "failed": "x"}]},
             {"call": "c", "arms": [{"key": "dense", "ready_s": 210.0}]}, {"call": "d"}]
    assert ready_prior(calls) == pytest.approx(205.0) and ready_prior(calls[:1] + calls[2:]) == pytest.approx(210.0)
    assert ready_prior([{"call": "d"}, {"call": "e", "arms": []}]) is None
    now = [100.0]
    for prior, hint in ((60.0, None), (ready_prior(calls), 710.0)):
        b = runner.CallBudget(537.0, lambda u: 3000, clock=lambda: now[0], length=537.0, prior_rate=0.05,
                              prior_start=prior)
        b.record_start(200.0)
        assert not b.fits("u0", [["u0"]], first=True) and b.too_long == hint
    # run_call plans with it: the directory's calls (the committed fs3300 directory, 67 / 27 / 23 / 22 / 23 s)
    src = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "cells",
                       "mh_kimi48_full_b1_fs3300_prompt_only_hr21.27_c97d5d57")
    if not os.path.isdir(src):
        pytest.skip("the committed fs3300 cells directory is not in this checkout")
    root = tmp_path / "cells"
    shutil.copytree(src, root)
    manifest = json.loads((root / "manifest.json").read_text())
    store = CellStore(str(root), manifest)
    seen = {}

    class Stop(Exception):
        pass

    def capture(*a, **k):
        seen.update(k)
        raise Stop

    monkeypatch.setattr(runner, "CallBudget", capture)
    args = types.SimpleNamespace(call_deadline_s=537.0, device="cuda", request_estimate_s=None,
                                 ready_estimate_s=None)
    with pytest.raises(Stop):
        runner.run_call(store, types.SimpleNamespace(args=args), "new", "97d5d57", ["dense", "nr16"], None, False)
    assert seen["prior_start"] == pytest.approx(ready_prior(store.calls())) == pytest.approx(23.332678438999892)
    args.ready_estimate_s = 90.0       # the flag still wins
    with pytest.raises(Stop):
        runner.run_call(store, types.SimpleNamespace(args=args), "new", "97d5d57", ["dense", "nr16"], None, False)
    assert seen["prior_start"] == 90.0


def test_a_fresh_call_s_estimate_counts_the_call_s_setup_before_its_first_server():
    """A fresh call spends its setup (planning, engine builds) before its first server starts: a first unit that
    fits a warm server's start but not that setup was skipped by every call as one 'a fresh call could do', never
    flagged as needing a longer deadline (reproduced on the CPU: a 40 s deadline, 21-30 s of setup and start,
    three calls in a row stopped before the same unit, none said why)."""
    from clients.runner import CallBudget
    now = [95.0]
    b = CallBudget(480.0, lambda u: 3400, clock=lambda: now[0], length=480.0, prior_rate=0.05, prior_start=60.0)
    b.record_start(55.0)                  # a warm start, under the prior, begun after 40 s of setup
    # 170 s a unit per arm: now 95 + 170 + 60 + 170 = 495 > 480; a fresh call: 40 of setup + 60 + 400 = 500 > 480,
    # as this (fresh, warm) call shows: no call of this length does it
    assert not b.fits("u0", [["u0"]], first=True) and b.too_long == 500.0
