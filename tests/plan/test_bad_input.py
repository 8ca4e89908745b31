"""Bad input gets one clear line on stderr and exit code 2, never a traceback."""
import json

import pytest

from plan_helpers import KIMI_REF, tiny_config, write_decay_checkpoint, run_dasc


def assert_clean_error(code, err, *needles):
    assert code == 2, err
    assert "Traceback" not in err
    assert err.startswith("dasc plan: error:")
    for n in needles:
        assert n in err, err


def test_unknown_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    assert_clean_error(*run_dasc("plan", "--model", tmp_path, "--wmax", "0")[::2], "unsupported model_type",
                       "llama")


def test_missing_decay_tensors_when_wmax_positive(tmp_path):
    raw = tiny_config("gdn")
    ck = write_decay_checkpoint(tmp_path / "m", raw, {0: ([0.0] * 4, [0.0] * 4)})   # layer 2 lacks them
    assert_clean_error(*run_dasc("plan", "--model", ck, "--wmax", "16")[::2], "linear layer 2", "A_log")
    # W = 0 keeps everything and needs no decay weights
    code, out, err = run_dasc("plan", "--model", tmp_path / "m" / "config.json", "--wmax", "0", "--json")
    assert code == 0, err


def test_bare_config_with_positive_wmax():
    assert_clean_error(*run_dasc("plan", "--model", KIMI_REF, "--wmax", "16")[::2], "decay weights")


def test_negative_and_non_integer_wmax():
    assert_clean_error(*run_dasc("plan", "--model", KIMI_REF, "--wmax", "-1")[::2], "--wmax must be >= 0")
    assert_clean_error(*run_dasc("plan", "--model", KIMI_REF, "--wmax", "ten")[::2], "--wmax must be an integer")


@pytest.mark.parametrize("tp", [3, 5, 64])
def test_tp_that_does_not_divide_heads(tp):
    assert_clean_error(*run_dasc("plan", "--model", KIMI_REF, "--wmax", "0", "--tp", tp)[::2],
                       f"TP degree {tp} does not divide the 32")


def test_budget_smaller_than_one_slot():
    assert_clean_error(*run_dasc("plan", "--model", KIMI_REF, "--wmax", "0", "--tp", "8", "--budget-bytes",
                                 "5427200")[::2], "holds no deployable slot", "10854400")


def test_shape_mismatch_and_missing_dir(tmp_path):
    raw = tiny_config("kda", heads=2, dk=4, dv=4)
    ck = write_decay_checkpoint(tmp_path / "m", raw, {0: ([0.0, 0.0], [0.0] * 5), 2: ([0.0, 0.0], [0.0] * 8)})
    assert_clean_error(*run_dasc("plan", "--model", ck, "--wmax", "4")[::2], "dt_bias has 5 values")
    assert_clean_error(*run_dasc("plan", "--model", tmp_path / "nope", "--wmax", "0")[::2], "no config.json")


def test_kimi_layer_lists_are_one_indexed_and_checked(tmp_path):
    raw = tiny_config("kda")
    raw["linear_attn_config"]["kda_layers"] = [0, 1]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert_clean_error(*run_dasc("plan", "--model", tmp_path, "--wmax", "0")[::2], "1-indexed")


@pytest.mark.parametrize("arm", [("--codec", "int8"), ("--codec", "fp8"), ("--precision", "horizon")])
def test_float16_state_with_a_scaled_codec(arm):
    """A checkpoint keeps int8 / fp8 / int4 scales in the temporal dtype, and float16 cannot hold them
    (tests/state/test_state_layout.py shows the inf a large row would load as); native float16 still plans."""
    assert_clean_error(*run_dasc("plan", "--model", KIMI_REF, "--wmax", "0", "--temporal-dtype", "float16",
                                 *arm)[::2], "--temporal-dtype float16", "scales",
                       "--precision uniform" if arm[0] == "--precision" else "--codec native")
    code, out, err = run_dasc("plan", "--model", KIMI_REF, "--wmax", "0", "--temporal-dtype", "float16", "--json")
    assert code == 0, err
