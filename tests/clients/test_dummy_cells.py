"""clients.matched_hbm with dummy weights (--load-format dummy): a released model's config.json alone (no
safetensors, as the full-size Kimi-Linear-48B is run on a GPU whose disk cannot hold its weights) builds
dasc-build dummy engines, serves the protocol's cells through tritonserver and says so in its result; the
slots it plans are those of the dummy weights' decay profile (what the engine itself plans); a directory with
only a config.json needs --load-format dummy, in one line."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clients.matched_hbm import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "trtllm_dasc" / "assets" / "tiny-kimi-linear"
ARGV = ["--arms", "dense,nr16", "--dense-slots", "3", "--scale", "0.03", "--blocks-per-phase", "1", "--seeds", "42",
        "--concurrency", "1", "--output-tokens", "2", "--device", "cpu", "--dtype", "float32", "--max-batch-size", "4",
        "--torch-threads", "1", "--plot", "none"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("dummy")
    (d / "cfg").mkdir()
    shutil.copy(TINY / "config.json", d / "cfg" / "config.json")
    argv = [*ARGV, "--model", str(d / "cfg" / "config.json"), "--load-format", "dummy", "--seed", "3",
            "--out", str(d / "out"), "--cells-dir", str(d / "cells"), "--json", str(d / "r.json"), "--max-units", "1"]
    assert main(argv) == 0
    return d, json.loads((d / "r.json").read_text())


def test_a_bare_config_builds_dummy_engines_and_serves_cells(run):
    d, res = run
    assert res["load_format"] == "dummy" and res["weights_seed"] == 3 and "DUMMY WEIGHTS" in res["weights"]
    for spec in ("dense", "nr16"):
        model = d / "out" / "engines" / spec / "model"
        # nothing of the weights' size was written: the engine remakes them from the seed at load time
        assert not list(model.glob("*.safetensors"))
        assert json.loads((model / "dummy_weights.json").read_text())["seed"] == 3
    assert [(a["key"], a["cells"]) for a in res["arms"]] == [("dense", 1), ("nr16", 1)]
    for a in res["arms"]:
        for b in a["blocks"]:
            rp = b["replay"]
            # every request of the replay was served: two tokens each, the engine's own token count agrees
            assert rp["output_tokens"] == 2 * rp["requests"] > 0
            assert rp["prompt_tokens"] == b["server"]["prompt_tokens"]
    cells = sorted(p.parent.name for p in (d / "cells" / "cells").glob("*/*.json"))
    assert cells == ["dense", "nr16"]


def test_slots_are_those_the_dummy_engine_holds(run):
    d, res = run
    # the engine's own count at serve time (its stats), against the slots the manifest planned: dasc-build
    # planned the decay profile of seed 3, and so must the client (the tiny checkpoint's weights plan others)
    (call,) = [json.loads(p.read_text()) for p in (d / "cells" / "calls").glob("*.json")]
    engine = {a["key"]: a["plan_check"]["engine_slots"] for a in call["arms"]}
    assert engine == {a["key"]: a["slots"] for a in res["arms"]}
    assert engine["nr16"] > engine["dense"] == 3


def test_a_config_only_directory_needs_dummy(tmp_path, capsys):
    (tmp_path / "cfg").mkdir()
    shutil.copy(TINY / "config.json", tmp_path / "cfg" / "config.json")
    assert main([*ARGV, "--model", str(tmp_path / "cfg"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no safetensors weights" in err[0] and "--load-format dummy" in err[0]
    assert not (tmp_path / "o").exists()
