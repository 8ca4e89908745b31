"""Arm specs name any horizon bands (engine/arms.py: +horizon/H1/H2[/C1/C2/C3][@seed]), as --precision
horizon:H1,H2[:C1,C2,C3][@seed] spells them: the spec turns into that flag, the planner reads the same bands
as from the flag itself, and a spec whose bands do not parse is refused when planned, in one line."""
from __future__ import annotations

import pytest

from trtllm_dasc.engine.arms import parse_arm, parse_arms
from trtllm_dasc.errors import UserError
from trtllm_dasc.plan.precision import parse_precision


@pytest.mark.parametrize("spec, flag", [
    ("nr16+horizon", "horizon"),
    ("nr16+horizon@1234", "horizon@1234"),
    ("nr16+horizon/64/1024", "horizon:64,1024"),
    ("nr16+horizon/64/1024/int4/int8/int8", "horizon:64,1024:int4,int8,int8"),
    ("wr64+horizon/128/1024/int4/int8/int8@7:hybrid", "horizon:128,1024:int4,int8,int8@7"),
])
def test_a_spec_is_the_precision_flag(spec, flag):
    arm = parse_arm(spec)
    assert arm.precision == flag and arm.codec == "native"
    flags = arm.build_flags()
    assert flags[flags.index("--precision") + 1] == flag
    # the planner's bands from the spec equal those from the flag written out by hand
    assert parse_precision(arm.precision, arm.wmax) == parse_precision(flag, arm.wmax)


def test_custom_bands_are_their_own_arm_beside_the_default_ones():
    arms = parse_arms("dense,nr16+horizon,nr16+horizon/64/1024/int4/int8/int8,nr16+horizon/64/1024/int4/int8/int8@1")
    assert [a.precision_kind for a in arms] == [None, "horizon", "horizon", "shuffled"]
    assert arms[2].label == "dasc-nr W=16 + horizon 64,1024:int4,int8,int8"
    assert len({a.label for a in arms}) == 4


@pytest.mark.parametrize("spec", ["nr16+horizon/1024/64", "nr16+horizon/64/1024/int4/int9/int8"])
def test_bands_that_do_not_parse_are_refused_in_one_line(spec):
    arm = parse_arm(spec)
    with pytest.raises(UserError) as e:
        parse_precision(arm.precision, arm.wmax)
    assert "\n" not in str(e.value)


def test_a_quality_run_takes_one_band_set_per_window(capsys):
    # the report pairs one horizon arm per W with dense, INT8 and that arm's shuffled controls
    from trtllm_dasc.evals import run
    rc = run.main(["--model", "unused", "--out", "/tmp/unused.json",
                   "--arms", "dense,nr16+horizon,nr16+horizon/64/1024/int4/int8/int8@1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "2 band sets" in err[0]
    run._one_band_set_per_window(["nr16+horizon/64/1024", "nr16+horizon/64/1024@5", "nr64+horizon"])   # fine


@pytest.mark.parametrize("spec, codec, precision, placement", [
    ("nr16+conv-int8", "native", "uniform", None),
    ("dense+conv-int8", "native", "uniform", None),
    ("nr16+int8+conv-int8:hybrid", "int8", "uniform", "hybrid"),
    ("nr16+horizon/128/1024/int4/int8/int8+conv-int8", "native", "horizon:128,1024:int4,int8,int8", None),
])
def test_a_conv_suffix_sets_the_conv_codec_beside_the_temporal_one(spec, codec, precision, placement):
    # +conv-int8 is --conv-codec int8; the temporal codec, bands and placement parse as without it
    arm = parse_arm(spec)
    assert (arm.conv_codec, arm.codec, arm.precision, arm.placement) == ("int8", codec, precision, placement)
    flags = arm.build_flags()
    assert flags[flags.index("--conv-codec") + 1] == "int8"
    assert arm.label.endswith("+ conv INT8" + (f" [{placement}]" if placement else ""))
    without = parse_arm(spec.replace("+conv-int8", ""))
    assert without.conv_codec == "native" and "--conv-codec" not in without.build_flags()


@pytest.mark.parametrize("spec", ["nr16+conv-fp8", "nr16+conv-int8+int8", "nr16+conv-native"])
def test_a_conv_suffix_out_of_place_or_unknown_is_refused_in_one_line(spec):
    with pytest.raises(UserError) as e:
        parse_arm(spec)
    assert "\n" not in str(e.value) and "+conv-int8" in str(e.value)
