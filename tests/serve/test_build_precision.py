"""dasc-build --precision (issue 35): bad band specs are one line (exit 2); a horizon build records its
normalised thresholds and codecs in the engine and its plan; an engine refuses a plan of another precision."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from serve_helpers import build, build_engine
from trtllm_dasc.errors import UserError


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prec")
    build(tmp / "ckpt", "kda", seed=3)
    return tmp / "ckpt"


def dasc_build(*args):
    return subprocess.run([sys.executable, "-m", "build_scripts.dasc_build", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("spec,needle", [
    ("horizon:64;512", "comma list of integers"), ("horizon:512,64", "increase strictly"),
    ("horizon:8,512", "must exceed --wmax"), ("horizon:64,512:int4,int8,fp4", "unknown codec"),
    ("mixed", "'uniform' or 'horizon"),
], ids=["unparsable", "order", "below-wmax", "codec", "kind"])
def test_bad_precision_is_one_line(ckpt, tmp_path, spec, needle):
    proc = dasc_build("--model", ckpt, "--output", tmp_path / "e", "--device", "cpu", "--precision", spec)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and needle in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "e").exists()


def test_codec_the_device_cannot_run_is_refused(monkeypatch):
    import torch
    from trtllm_dasc.plan.precision import check_device_runs, parse_precision
    monkeypatch.delattr(torch, "float8_e4m3fn")
    with pytest.raises(UserError, match="fp8 needs torch.float8_e4m3fn"):
        check_device_runs(parse_precision("horizon:64:int4,fp8", 16))
    check_device_runs(parse_precision("horizon:64:int4,int8", 16))


def test_horizon_engine_records_bands_and_refuses_other_precision(ckpt, tmp_path):
    from trtllm_dasc.engine.config import EngineConfig
    from trtllm_dasc.engine.runner import engine_plan
    out = build_engine(ckpt, tmp_path / "e", "--wmax", "4", "--precision", "horizon:64,512")
    meta = json.loads((out / "config.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    spec = "horizon:64,512:int4,int8,native"
    assert meta["engine"]["precision"] == spec and plan["options"]["precision"] == spec
    assert [b["codec"] for b in plan["bands"]] == ["int4", "int8", "native"]
    assert sum(b["units"] for b in plan["bands"]) == sum(plan["retained_per_layer"])
    opts = dict(meta["engine"], model=str(out / "model"), plan_path=str(out / "plan.json"),
                kernel_cache_dir=str(out / "kernels"))
    assert engine_plan(EngineConfig(**opts)).options.precision == spec
    for other in ("uniform", "horizon:64,1024"):
        with pytest.raises(UserError, match="precision"):
            engine_plan(EngineConfig(**dict(opts, precision=other)))


def test_conv8_engine_records_its_conv_codec_and_refuses_a_native_conv_plan(ckpt, tmp_path):
    from trtllm_dasc.engine.config import EngineConfig
    from trtllm_dasc.engine.runner import engine_plan
    out = build_engine(ckpt, tmp_path / "e", "--wmax", "4", "--precision", "horizon:64,512", "--conv-codec", "int8")
    meta = json.loads((out / "config.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    assert meta["engine"]["conv_codec"] == "int8" and plan["options"]["conv_codec"] == "int8"
    # 8-bit conv: one int8 row per layer, codes padded to 4 bytes plus an fp32 scale (state/conv8_naive.py)
    assert plan["conv_codec"] == "int8"
    opts = dict(meta["engine"], model=str(out / "model"), plan_path=str(out / "plan.json"),
                kernel_cache_dir=str(out / "kernels"))
    assert engine_plan(EngineConfig(**opts)).options.conv_codec == "int8"
    with pytest.raises(UserError, match="conv_codec"):
        engine_plan(EngineConfig(**dict(opts, conv_codec="native")))
    proc = dasc_build("--model", ckpt, "--output", tmp_path / "bad", "--device", "cpu", "--conv-codec", "int4")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and not (tmp_path / "bad").exists()
