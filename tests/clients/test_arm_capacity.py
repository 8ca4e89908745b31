"""The slots the matched-HBM client plans for an arm are the ones its dasc-build engine holds, for every field an
arm can set: the plan options of clients/arms.capacity equal those dasc-build derives from the arm's own build
flags (precision and conv codec included: a horizon arm was planned as plain nr<W>, and its served engine then
failed the runner's slot check), and a served horizon arm passes that check with the engine's own slot count and
its precision in the manifest."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients import arms as armlib
from clients.matched_hbm import main
from trtllm_dasc.engine.arms import ArmSpec, parse_arm
from trtllm_dasc.plan import PlanOptions

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "trtllm_dasc" / "assets" / "tiny-kimi-linear")
ARMS = ["dense", "nr16", "wr32+int8", "nr16+int4", "rand16@5", "nr16+horizon", "nr16+horizon@3",
        "nr16+horizon:storage", "dense:hybrid"]


def _conv8(spec: str) -> ArmSpec:
    a = parse_arm(spec + "+conv-int8" if ":" not in spec else spec.replace(":", "+conv-int8:"))
    assert a.conv_codec == "int8", spec
    return a


def _build_options(arm: ArmSpec, tp: int, placement: str) -> PlanOptions:
    """The PlanOptions dasc-build plans with, from the flags the client gives it (the run's, then the arm's)."""
    from build_scripts.dasc_build import add_arguments, engine_options
    from trtllm_dasc.cli import _Parser
    from trtllm_dasc.spec import build_placement, plan_fields
    p = _Parser(prog="dasc-build")
    add_arguments(p)
    args = p.parse_args(["--model", MODEL, "--output", "unused", "--tp", str(tp), "--placement",
                         build_placement(placement, tp), *arm.build_flags()])
    return PlanOptions(**plan_fields(engine_options(args)))


@pytest.mark.parametrize("tp, placement", [(1, "off"), (4, "hybrid"), (4, "off")])
@pytest.mark.parametrize("arm", [*map(parse_arm, ARMS), _conv8("nr16"), _conv8("nr16+horizon")],
                         ids=[*ARMS, "nr16 conv int8", "nr16+horizon conv int8"])
def test_capacity_plans_what_dasc_build_plans(arm, tp, placement):
    if tp == 1 and arm.placement not in (None, "off"):
        pytest.skip("an arm's placement needs TP > 1 (matched_hbm refuses it)")
    assert PlanOptions(**arm.plan_fields(tp, placement)) == _build_options(arm, tp, placement)


def test_precision_and_conv_codec_change_the_capacity():
    budget = 4 * armlib.dense_checkpoint_bytes(MODEL, "float32")
    cap = {a.label: armlib.capacity(MODEL, a, budget, "float32")["slots"]
           for a in (parse_arm("nr16"), parse_arm("nr16+horizon"), _conv8("nr16"))}
    # the tiny model's kept units all lie under the first band (int4): more slots than native nr16
    assert cap["dasc-nr W=16 + horizon"] > cap["dasc-nr W=16"] < cap["dasc-nr W=16 + conv INT8"]


@pytest.fixture(scope="module")
def horizon_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("horizon-arm")
    argv = ["--model", MODEL, "--arms", "nr16+horizon", "--dense-slots", "3", "--scale", "0.03",
            "--blocks-per-phase", "1", "--seeds", "42", "--concurrency", "1", "--output-tokens", "2",
            "--device", "cpu", "--dtype", "float32", "--max-batch-size", "4", "--torch-threads", "1",
            "--plot", "none", "--out", str(d / "out"), "--cells-dir", str(d / "cells"), "--json", str(d / "r.json"),
            "--max-units", "1"]
    assert main(argv) == 0
    return d, json.loads((d / "r.json").read_text())


def test_a_served_horizon_arm_has_the_slots_its_manifest_planned(horizon_run):
    d, res = horizon_run
    (call,) = [json.loads(p.read_text()) for p in (d / "cells" / "calls").glob("*.json")]
    (checked,) = call["arms"]
    assert "failed" not in checked
    check = checked["plan_check"]
    (arm,) = res["arms"]
    assert check["engine_slots"] == check["plan_slots"] == arm["slots"]
    assert check["engine_worst_rank_bytes"] == arm["checkpoint_bytes"]
    # not nr16's count: the bands were planned
    nr16 = armlib.capacity(MODEL, parse_arm("nr16"), res["budget_bytes"], "float32")["slots"]
    assert arm["slots"] > nr16
    # the arm record says how it stores (bands spelled out), as its engine records it
    engine = json.loads((d / "out" / "engines" / "nr16+horizon" / "config.json").read_text())["engine"]
    assert arm["precision"] == engine["precision"] == "horizon:128,1024:int4,int8,int8"
    assert "conv_codec" not in arm and engine["conv_codec"] == "native"
