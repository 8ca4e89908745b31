"""The arm spec (trtllm_dasc/spec.py) and the engine directory format (trtllm_dasc/engine_dir.py).

Every CLI's arm flags carry the spec's choices and the defaults DESIGN.md and the CLIs have always had
(written out here, not read from the spec); an engine directory written by dasc-build before the format
module existed (tests/data/engine_dir_v1, made by commit 2b42721's dasc-build) still reads; a newer
format version is refused in one line. No model is loaded: seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil

import pytest

from trtllm_dasc import engine_dir, spec
from trtllm_dasc.engine.config import EngineConfig, engine_config
from trtllm_dasc.errors import UserError
from trtllm_dasc.plan import PlanOptions

OLD_ENGINE = os.path.join(os.path.dirname(__file__), "data", "engine_dir_v1")

# the contract (DESIGN.md, the CLIs' flags before the spec): flag -> allowed values
CHOICES = {"codec": ["native", "int8", "fp8", "int4"], "conv_codec": ["native", "int8"], "layout": ["ragged", "padded"], "placement": ["off", "storage", "hybrid"],
           "policy": ["nr", "wr", "wr-warm"], "selection": ["decay", "random"]}
PLANNING = {"wmax": 16, "tp": 1, "placement": "hybrid", "codec": "native", "layout": "ragged", "selection": "decay",
            "mask_seed": None, "policy": "nr", "precision": "uniform", "conv_codec": "native"}
ENGINE = {**PLANNING, "wmax": 0, "placement": "off"}
# CLI module -> (the arm flags it has, the defaults they take)
CLIS = {"trtllm_dasc.plan.cli": (("tp", "placement", "codec", "precision", "conv_codec", "layout", "selection",
                                  "mask_seed"), PLANNING),
        "build_scripts.dasc_build": (("wmax", "selection", "mask_seed", "policy", "codec", "precision", "conv_codec",
                                      "layout", "tp", "placement"), PLANNING),
        "trtllm_dasc.cli_serve": (("wmax", "selection", "mask_seed", "policy", "codec", "layout", "tp",
                                   "placement"), PLANNING),
        "trtllm_dasc.cli_logits": (("wmax", "policy", "codec", "tp", "placement"), ENGINE),
        "clients.matched_hbm": (("tp", "placement"), PLANNING)}


def _actions(module: str) -> dict:
    import importlib
    p = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(p)
    return {a.dest: a for a in p._actions}


@pytest.mark.parametrize("module", list(CLIS))
def test_cli_arm_flags_have_the_contract_choices_and_defaults(module):
    names, defaults = CLIS[module]
    actions = _actions(module)
    for name in names:
        a = actions[name]
        assert a.option_strings == ["--" + name.replace("_", "-")], (module, name)
        assert a.default == defaults[name], (module, name)
        if name in CHOICES:
            assert list(a.choices) == CHOICES[name], (module, name)
    # dasc plan's --wmax takes a comma list: its default is the same number, as text
    if module == "trtllm_dasc.plan.cli":
        assert actions["wmax"].default == "16"


def test_dataclass_defaults_are_the_documented_ones():
    opts, eng = PlanOptions(), EngineConfig(model="m")
    for name in ("wmax", "tp", "placement", "codec", "layout", "selection", "mask_seed"):
        assert getattr(opts, name) == PLANNING[name], name
    for plan_name, eng_name in spec.PLAN_TO_ENGINE.items():
        assert getattr(eng, eng_name) == ENGINE[plan_name], eng_name


def test_selection_is_checked_the_same_way_everywhere():
    for bad, needle in (({"selection": "random"}, "needs --mask-seed"), ({"mask_seed": 3}, "needs --selection"),
                        ({"selection": "random", "mask_seed": 2**63}, "--mask-seed must be"),
                        ({"selection": "best"}, "--selection must be")):
        for make in (lambda kw: PlanOptions(**kw), lambda kw: EngineConfig(model="m", **kw)):
            with pytest.raises(UserError, match=needle):
                make(bad)
    assert EngineConfig(model="m", selection="random", mask_seed=2**63 - 1).mask_seed == 2**63 - 1


def test_int8_bytes_follow_the_paper():
    from trtllm_dasc.config import unit_byte_parts
    # paper Eq. 10: one byte per element, one scale per row of d_v in the source dtype (fp32: 4 B)
    assert unit_byte_parts(128 * 64, 128, 4, "int8") == (128 * 64, 128 * 4)
    assert unit_byte_parts(128 * 64, 128, 4, "native") == (128 * 64 * 4, 0)
    with pytest.raises(UserError, match="codec"):
        unit_byte_parts(8, 1, 4, "fp4")


def _write(tmp, **over):
    fields = dict(engine={"model": "model", "plan_path": "plan.json", "kernel_cache_dir": "kernels", "wmax": 16,
                          "tp_size": 2, "placement": "storage", "rank_weights": "weights"},
                  serving={"decoupled": False, "max_batch_size": 4}, source="/ckpt", weights={"load_format": "dummy"},
                  model_config={"model_type": "kimi_linear"}, checkpoint_check={"skipped": "dummy weights"},
                  memory_per_rank=None)
    fields.update(over)
    engine_dir.write(str(tmp), **fields)
    return fields


def test_engine_dir_round_trip(tmp_path):
    fields = _write(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    # the JSON keys readers outside this package (scripts, old dasc) rely on
    assert raw["dasc_engine_version"] == 1 and raw["engine"] == fields["engine"]
    assert engine_dir.is_engine_dir(str(tmp_path))
    found = engine_dir.read(str(tmp_path))
    assert found.version == 1 and found.source == "/ckpt" and found.weights == {"load_format": "dummy"}
    assert found.serving == {"decoupled": False, "max_batch_size": 4}
    for key, rel in (("model", "model"), ("plan_path", "plan.json"), ("kernel_cache_dir", "kernels"),
                     ("rank_weights", "weights")):
        assert found.engine[key] == os.path.join(str(tmp_path), rel)
    assert found.engine["placement"] == "storage" and found.engine["tp_size"] == 2


def test_newer_engine_format_is_refused_in_one_line(tmp_path):
    _write(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "dasc_engine_version": 2}))
    with pytest.raises(UserError) as e:
        engine_dir.read(str(tmp_path))
    assert "version 2" in str(e.value) and "\n" not in str(e.value)
    for bad in ("1", 0, True):
        (tmp_path / "config.json").write_text(json.dumps({**raw, "dasc_engine_version": bad}))
        with pytest.raises(UserError, match="dasc_engine_version"):
            engine_dir.read(str(tmp_path))


def test_engine_written_before_the_format_module_reads(tmp_path):
    shutil.copytree(OLD_ENGINE, tmp_path / "e")
    (tmp_path / "e" / "model").mkdir()
    cfg = engine_config(str(tmp_path / "e"))
    # what 2b42721's dasc-build wrote for the tiny kimi checkpoint at --wmax 16 on one rank
    assert (cfg.wmax, cfg.policy, cfg.codec, cfg.layout, cfg.tp_size, cfg.placement) == (16, "nr", "native",
                                                                                         "ragged", 1, "off")
    assert cfg.model == str(tmp_path / "e" / "model") and cfg.plan_path == str(tmp_path / "e" / "plan.json")
    found = engine_dir.read(str(tmp_path / "e"))
    assert found.version == 1 and found.serving["decoupled"] is True
    assert found.weights == {"load_format": "safetensors"}
    assert engine_dir.model_dir_of(str(tmp_path / "e")) == str(tmp_path / "e" / "model")
    # an engine config without the version key (the OpenAI frontend's test fixture) reads as version 1
    raw = json.loads((tmp_path / "e" / "config.json").read_text())
    del raw["dasc_engine_version"], raw["weights"], raw["serving"]
    (tmp_path / "e" / "config.json").write_text(json.dumps(raw))
    found = engine_dir.read(str(tmp_path / "e"))
    assert found.version == 1 and found.serving == {"decoupled": True}
    assert found.weights == {"load_format": "safetensors"}


def test_unknown_missing_or_mistyped_engine_fields_are_one_line(tmp_path):
    """An engine of a newer dasc that added a field without a new format version, one that lacks `model`, and
    a `model` that is not a path: each was a TypeError traceback in `dasc serve` (EngineConfig(**engine),
    os.path.isabs). From a review helper; fails on the old code."""
    shutil.copytree(OLD_ENGINE, tmp_path / "e")
    (tmp_path / "e" / "model").mkdir()
    path = tmp_path / "e" / "config.json"
    raw = json.loads(path.read_text())
    engine = raw["engine"]
    for bad, needle in (({**engine, "future_field": 1}, "future_field"),
                        ({k: v for k, v in engine.items() if k != "model"}, "lacks engine field(s) model"),
                        ({**engine, "model": 5}, "model must be a path")):
        path.write_text(json.dumps({**raw, "engine": bad}))
        with pytest.raises(UserError, match=re.escape(needle)) as e:
            engine_config(str(tmp_path / "e"))
        assert "\n" not in str(e.value)
