"""The TP benchmark's bookkeeping, without MPI: arms naming their own placement (`nr16:storage`), the slots and
most loaded rank's bytes the serving benchmark expects for them against what `dasc plan --json` prints, the
all-to-all clock and its per-protocol delta."""
from __future__ import annotations

import io
import json
import time
from contextlib import redirect_stdout

import pytest

from tp_helpers import build_tp_model

from clients import arms as armlib
from clients.matched_hbm import exchange_delta
from trtllm_dasc.parallel.exchange_clock import ExchangeClock
from trtllm_dasc.engine.arms import parse_arm
from trtllm_dasc.errors import UserError


@pytest.fixture(scope="module")
def kda_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp-arms-kda")
    build_tp_model(path, "kda", seed=3)
    return str(path)


def _dasc_plan(model: str, *flags) -> dict:
    from trtllm_dasc.cli import main
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["plan", "--model", model, "--json", *map(str, flags)]) == 0
    return json.loads(out.getvalue())


def test_arm_spec_names_its_placement():
    a = parse_arm("wr64+int8:storage")
    assert (a.wmax, a.policy, a.codec, a.placement) == (64, "wr", "int8", "storage")
    assert a.label == "dasc-wr W=64 + INT8 [storage]"
    assert a.build_flags()[-2:] == ["--placement", "storage"]
    assert a.engine_fields()["placement"] == "storage"
    # without a suffix the run's placement applies: the arm sets none
    assert parse_arm("nr16").placement is None and "placement" not in parse_arm("nr16").engine_fields()
    assert parse_arm("dense:hybrid").placement == "hybrid"
    for bad in ("nr16:sideways", "nr16:", "nr16+int8:storage:off"):
        with pytest.raises(UserError, match="storage"):
            parse_arm(bad)


@pytest.mark.parametrize("spec, run_placement", [("nr32:storage", "off"), ("nr32:off", "hybrid"), ("nr32", "storage"),
                                                 ("wr16+int8:hybrid", "off")])
def test_capacity_equals_dasc_plan(kda_model, spec, run_placement):
    """What the benchmark checks each arm's engine against is what `dasc plan` prints for the arm's own
    placement (the run's when the arm names none)."""
    arm = parse_arm(spec)
    budget = 10_000_000
    cap = armlib.capacity(kda_model, arm, budget, "float32", tp=4, placement=run_placement)
    want = _dasc_plan(kda_model, "--wmax", arm.wmax, "--tp", 4, "--placement", arm.placement or run_placement,
                      "--codec", arm.codec, "--budget-bytes", budget, "--conv-dtype", "float32")
    assert cap["slots"] == want["slots"]
    assert cap["checkpoint_bytes"] == want["bottleneck_slot_bytes"] == max(want["slot_bytes_per_rank"])


def test_storage_placement_changes_the_worst_rank(kda_model):
    """The comparison the placements exist for: storage balancing lowers the most loaded rank's bytes."""
    off = armlib.capacity(kda_model, parse_arm("nr32:off"), 10_000_000, "float32", tp=4)
    storage = armlib.capacity(kda_model, parse_arm("nr32:storage"), 10_000_000, "float32", tp=4)
    assert storage["checkpoint_bytes"] < off["checkpoint_bytes"] and storage["slots"] >= off["slots"]


def test_matched_hbm_refuses_a_placement_at_tp1(kda_model, tmp_path):
    from clients.matched_hbm import add_arguments, check
    from trtllm_dasc.cli import _Parser
    p = _Parser(prog="matched_hbm")
    add_arguments(p)
    args = p.parse_args(["--model", kda_model, "--out", str(tmp_path), "--arms", "dense,nr16:storage",
                         "--dense-slots", "4"])
    with pytest.raises(UserError, match="--tp > 1"):
        check(args)


def test_exchange_clock_counts_ops_calls_bytes_and_time():
    clock = ExchangeClock("cpu")
    for _ in range(2):
        clock.op("store")
        clock.time("store", 100, lambda: time.sleep(0.01))
        clock.time("store", 50, lambda: None)
    clock.op("load")
    clock.time("load", 7, lambda: time.sleep(0.005))
    r = clock.report()
    assert (r["store"]["ops"], r["store"]["calls"], r["store"]["bytes_sent"]) == (2, 4, 300)
    assert r["store"]["seconds"] >= 0.02 and r["store"]["ms_per_op"] == pytest.approx(500 * r["store"]["seconds"])
    assert (r["load"]["ops"], r["load"]["calls"], r["load"]["bytes_sent"]) == (1, 1, 7)
    assert r["load"]["seconds"] >= 0.005


def test_exchange_delta_is_the_protocols_share():
    before = {"store": {"ops": 2, "calls": 2, "seconds": 0.5, "bytes_sent": 10},
              "load": {"ops": 0, "calls": 0, "seconds": 0.0, "bytes_sent": 0}}
    after = {"store": {"ops": 6, "calls": 6, "seconds": 0.9, "bytes_sent": 50},
             "load": {"ops": 4, "calls": 4, "seconds": 0.2, "bytes_sent": 8}}
    d = exchange_delta(before, after)
    assert d["store"] == {"ops": 4, "calls": 4, "bytes_sent": 40, "ms_per_op": pytest.approx(100.0)}
    assert d["load"]["ms_per_op"] == pytest.approx(50.0)
    assert exchange_delta(None, None) is None
    assert exchange_delta(None, after)["store"]["ops"] == 6


def test_keep_going_records_a_failed_arm_and_runs_the_next(kda_model, tmp_path, monkeypatch):
    """The TP8 grid is 25 servers: one that dies is recorded under failed_arms and the grid goes on (without
    --keep-going the failure ends the run, as before). Servers are stubbed: what is tested is the loop."""
    from clients import matched_hbm
    from trtllm_dasc.cli import _Parser
    monkeypatch.setattr(armlib, "build_engine", lambda model, arm, out, budget, flags: out)
    monkeypatch.setattr(armlib, "share_kernels", lambda engine, cache: None)
    from clients import assemble, runner
    served = []
    block = {"seed": 42, "phase": "p", "replay": {"ttft_ms": [1.0], "prompt_tokens": 1, "cached_tokens": 0,
                                                   "seconds": 1.0},
             "server": {"prompt_tokens": 1, "cached_tokens": 0, "checkpoint_evictions": 0, "kv_block_evictions": 0}}

    def fake_served(arm, engine, units, store, ctx, call, commit, gate=None, record=None, started=None):
        served.append(arm["spec"])
        if arm["spec"] == "nr16:storage":
            raise RuntimeError("arm nr16:storage: tritonserver exited with code 139")
        for u in units:
            store.write(arm["key"], u, call, commit, {"blocks": [block]})
        return {"placement": arm["placement"]}
    monkeypatch.setattr(runner, "served", fake_served)
    monkeypatch.setattr(assemble, "ratios", lambda entry, base: {})      # no figures to compare here
    p = _Parser(prog="matched_hbm")
    matched_hbm.add_arguments(p)
    argv = ["--model", kda_model, "--out", str(tmp_path), "--arms", "dense,nr16:storage,nr16:off", "--tp", "4",
            "--dense-slots", "4", "--scale", "0.03", "--blocks-per-phase", "1", "--device", "cpu", "--dtype", "float32"]
    result = matched_hbm.run(p.parse_args([*argv, "--keep-going"]))
    assert served == ["dense", "nr16:storage", "nr16:off"]
    assert [a["spec"] for a in result["arms"]] == ["dense", "nr16:off"]
    assert result["failed_arms"] == [{"spec": "nr16:storage", "error": "arm nr16:storage: tritonserver exited with "
                                      "code 139"}]
    with open(result["json_path"]) as f:
        assert json.load(f)["failed_arms"][0]["spec"] == "nr16:storage"
    served.clear()
    with pytest.raises(RuntimeError, match="code 139"):
        matched_hbm.run(p.parse_args(argv))
    assert served == ["dense", "nr16:storage"]


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="no CUDA device: the clock's event path")
def test_exchange_clock_on_the_gpu_reads_events_once_the_device_passed_them():
    """On a GPU the clock never waits: a collective still queued is left for a later report, then counted."""
    import torch
    clock = ExchangeClock("cuda")
    torch.cuda.synchronize()
    clock.op("store")
    clock.time("store", 64, lambda: torch.cuda._sleep(200_000_000))      # ~0.1 s of device time, queued
    early = clock.report()
    assert early["store"]["calls"] == 1 and early["store"]["bytes_sent"] == 64
    assert early["store"]["seconds"] == 0.0                                 # not reached yet: not waited for
    late = clock.report(wait=True)
    assert late["store"]["seconds"] > 0.01
    assert late["store"]["ms_per_op"] == pytest.approx(1e3 * late["store"]["seconds"])
    assert clock.report()["store"]["seconds"] == late["store"]["seconds"]   # counted once


def test_an_arm_runs_only_the_units_its_own_calls_baseline_measured(kda_model, tmp_path, monkeypatch):
    """Cells are paired within a call. A baseline (dense) server that dies under --keep-going used to leave
    the arm's cells of that call without a partner, and later calls never ran those units again: the result
    stayed incomplete whatever followed (session 36's review). Now the arm skips what its baseline did not
    measure in the same call, and the next call measures both."""
    from clients import matched_hbm
    from trtllm_dasc.cli import _Parser
    monkeypatch.setattr(armlib, "build_engine", lambda model, arm, out, budget, flags: out)
    monkeypatch.setattr(armlib, "share_kernels", lambda engine, cache: None)
    from clients import assemble, runner
    served, fail = [], {"dense"}
    block = {"seed": 42, "phase": "p", "replay": {"ttft_ms": [1.0], "prompt_tokens": 1, "cached_tokens": 0,
                                                   "seconds": 1.0},
             "server": {"prompt_tokens": 1, "cached_tokens": 0, "checkpoint_evictions": 0, "kv_block_evictions": 0}}

    def fake_served(arm, engine, units, store, ctx, call, commit, gate=None, record=None, started=None):
        served.append(arm["spec"])
        for u in units:
            if arm["spec"] in fail and u != units[0]:
                raise RuntimeError(f"arm {arm['spec']}: tritonserver exited with code 139")
            store.write(arm["key"], u, call, commit, {"blocks": [block]})
        return {"placement": arm["placement"]}
    monkeypatch.setattr(runner, "served", fake_served)
    monkeypatch.setattr(assemble, "ratios", lambda entry, base: {})
    p = _Parser(prog="matched_hbm")
    matched_hbm.add_arguments(p)
    cells = tmp_path / "cells"
    argv = ["--model", kda_model, "--out", str(tmp_path), "--arms", "dense,nr16:off", "--tp", "4",
            "--dense-slots", "4", "--scale", "0.03", "--blocks-per-phase", "1", "--device", "cpu",
            "--dtype", "float32", "--cells-dir", str(cells), "--keep-going"]
    matched_hbm.run(p.parse_args(argv))              # dense dies after its first unit
    dense_cells = sorted((cells / "cells" / "dense").glob("*.json"))
    arm_cells = sorted(f for d in (cells / "cells").iterdir() if d.name != "dense" for f in d.glob("*.json"))
    assert len(dense_cells) == 1, dense_cells
    # the arm measured that one unit only, beside its baseline in the same call
    assert [f.name for f in arm_cells] == [f.name for f in dense_cells]
    fail.clear()
    served.clear()
    matched_hbm.run(p.parse_args(argv))              # the rest of the units, both arms
    assert served == ["dense", "nr16:off"]
    dense_names = {f.name for f in (cells / "cells" / "dense").glob("*.json")}
    arm_names = {f.name for d in (cells / "cells").iterdir() if d.name != "dense" for f in d.glob("*.json")}
    # every arm cell has the dense cell of its unit and call: nothing left unpaired
    assert arm_names <= dense_names and len({n.split(".")[0] for n in arm_names}) > 1
