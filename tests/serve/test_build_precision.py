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


@pytest.mark.parametrize("fields,exact", [
    ((0, "nr", "native"), True), ((0, "nr", "native", "uniform", "native"), True),
    # bands that are all native store every unit exactly
    ((0, "nr", "native", "horizon:64,512:native,native,native"), True),
    ((16, "nr", "native"), False), ((0, "nr", "int8"), False),
    ((0, "nr", "native", "horizon:1024,8192:int4,int8,native"), False),
    ((0, "nr", "native", "uniform", "int8"), False),
], ids=["defaults", "explicit", "native-bands", "wmax", "codec", "horizon", "conv8"])
def test_cache_policy_is_exact_only_when_every_unit_is_stored_exactly(fields, exact):
    from trtllm_dasc.serve.repository import cache_policy
    said = cache_policy(*fields)
    assert said.endswith("cached prefixes are exact") == exact, said
    assert ("cached prefixes are approximate" in said) != exact, said
    if not exact:
        # the way back to an exact cache names each flag that made this one lossy
        hint = said.rsplit("; ", 1)[1]
        assert ("--precision uniform" in hint) == (len(fields) > 3 and fields[3] != "uniform")
        assert ("--conv-codec native" in hint) == (len(fields) > 4)


def test_cache_policy_wording_of_the_paper_arms_is_unchanged():
    from trtllm_dasc.serve.repository import cache_policy
    assert cache_policy(0, "nr", "native") == "dasc-nr W_max=0: cached prefixes are exact"
    assert cache_policy(16, "wr", "int8") == ("dasc-wr W_max=16 int8: cached prefixes are approximate (a greedy "
                                             "output may change once its prefix is cached); --wmax 0 --codec native "
                                             "for an exact cache")


@pytest.mark.parametrize("flags,exact", [(["--precision", "horizon:64,512"], False), (["--conv-codec", "int8"], False),
                                         ([], True)], ids=["horizon", "conv8", "dense"])
def test_a_quantised_dense_engine_says_its_cache_is_approximate(ckpt, tmp_path, flags, exact):
    out = build_engine(ckpt, tmp_path / "e", "--wmax", "0", *flags)
    pbtxt = (out / "model_repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    policy = pbtxt[pbtxt.index('key: "dasc_policy"'):].split("string_value:", 1)[1].split("\n", 1)[0]
    assert ("cached prefixes are exact" in policy) == exact, policy
    assert ("cached prefixes are approximate" in policy) != exact, policy


def test_a_plan_json_edited_after_the_build_is_refused_at_load(ckpt, tmp_path):
    """plan.json's retained units replaced by every unit (valid ids, the build's options): the engine served it
    silently (an nr hit became lossless, capacity changed). The build records the plan's digest, so the edit is
    refused in one line; the plan as built loads. From a review helper; fails on the old code."""
    from trtllm_dasc.engine.config import EngineConfig
    from trtllm_dasc.engine.runner import engine_plan
    out = build_engine(ckpt, tmp_path / "e", "--wmax", "16")
    meta = json.loads((out / "config.json").read_text())
    opts = dict(meta["engine"], model=str(out / "model"), plan_path=str(out / "plan.json"),
                kernel_cache_dir=str(out / "kernels"))
    built = engine_plan(EngineConfig(**opts))
    plan = json.loads((out / "plan.json").read_text())
    n = built.config.units_per_layer
    assert any(len(row) < n for row in plan["retained_units"])          # the build omits some units
    plan["retained_units"] = [list(range(n)) for _ in plan["retained_units"]]
    plan.pop("retained_bands", None)
    (out / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(UserError, match="not the plan this engine was built with") as e:
        engine_plan(EngineConfig(**opts))
    assert "\n" not in str(e.value)
