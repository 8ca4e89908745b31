"""dasc-build --load-format dummy: an engine from a bare config.json whose plan is the planner's for the
synthetic checkpoint of the same seed, that writes no weights, says it is dummy everywhere, serves tokens,
and is refused in one line when it does not fit memory or its experts do not fit together or split evenly."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from build_scripts.dasc_build import main as dasc_build
from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.engine.engine import Engine
from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.sampling import SamplingParams
from trtllm_dasc.errors import UserError
from trtllm_dasc.plan import PlanOptions, plan_from_path
from trtllm_dasc.plan.synthetic import tiny_moe_config, write_checkpoint
from trtllm_dasc.serve.host import dummy_notice, engine_config

DATA = Path(__file__).resolve().parents[1] / "data"
REFERENCE = {"kda": DATA / "kimi-linear-48b-a3b.config.json", "gdn": DATA / "qwen3-next-80b-a3b.config.json"}
SMALL = ["--device", "cpu", "--dtype", "float32", "--max-batch-size", "2", "--kv-blocks", "64", "--block-size", "4",
         "--max-context", "128", "--interval", "8"]


def tiny_checkpoint(tmp_path, arch="kda", **over) -> Path:
    """A directory holding only a config.json (no weights)."""
    d = tmp_path / f"cfg-{arch}"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(tiny_moe_config(arch, **over)))
    return d


def build(model, out, *flags) -> int:
    return dasc_build(["--model", str(model), "--output", str(out), "--load-format", "dummy", *SMALL, *map(str, flags)])


@pytest.mark.parametrize("arch", ["kda", "gdn"])
def test_reference_config_plans_like_the_synthetic_checkpoint(arch, tmp_path):
    assert build(REFERENCE[arch], tmp_path / "engine", "--seed", 4, "--wmax", 16) == 0
    engine = tmp_path / "engine"
    # nothing of the weights' size is written: the biggest file is the plan (a few hundred kB)
    sizes = {str(p.relative_to(engine)): p.stat().st_size for p in engine.rglob("*") if p.is_file()}
    assert max(sizes.values()) < 2 << 20 and not any(n.endswith(".safetensors") for n in sizes), sizes
    meta = json.loads((engine / "config.json").read_text())
    assert meta["weights"]["load_format"] == "dummy" and meta["weights"]["seed"] == 4
    assert meta["engine"]["load_format"] == "dummy"
    experts = meta["model_config"].get("num_experts")
    assert experts == (256 if arch == "kda" else 512)
    assert ("num_experts" in meta["weights"]["completed_fields"]) == (arch == "kda")
    assert "DUMMY WEIGHTS" in (engine / "model_repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "DUMMY WEIGHTS" in dummy_notice(str(engine))
    # the planner's capacities for the synthetic checkpoint of that seed, read from safetensors on disk
    synthetic = write_checkpoint(str(tmp_path / "synthetic"), arch, seed=4, shards=1)
    options = PlanOptions(wmax=16, tp=8)
    want = plan_from_path(synthetic, options)[0].report(694_681_600)
    got = plan_from_path(str(engine), options)[0].report(694_681_600)
    for key in ("slots", "dense_slots", "bottleneck_slot_bytes", "retained_per_layer", "slot_bytes_per_rank",
                "wr_window"):
        assert got[key] == want[key], key
    built = json.loads((engine / "plan.json").read_text())
    assert built["retained_units"] == plan_from_path(synthetic, PlanOptions(wmax=16, tp=1))[0].retained


def generate(engine_dir, prompt, n=4):
    engine = Engine(engine_config(str(engine_dir)))
    assert engine.runner.dummy_weights
    return engine.generate([GenerationRequest(0, prompt, n, SamplingParams())])[0]


def test_dummy_engine_serves_the_same_tokens_for_the_same_seed(tmp_path):
    model = tiny_checkpoint(tmp_path)
    for name, seed in (("a", 3), ("b", 3), ("c", 9)):
        assert build(model, tmp_path / name, "--seed", seed) == 0
    assert sorted(os.listdir(tmp_path / "a" / "model")) == ["config.json", "dummy_weights.json"]
    prompt = [5, 17, 29, 41, 53, 65, 77, 89, 101]
    a, b, c = (generate(tmp_path / name, prompt) for name in "abc")
    assert a == b and a != c and len(a) == 4


def test_a_dummy_record_edited_or_deleted_after_the_build_is_refused(tmp_path):
    """The loader makes the weights from model/dummy_weights.json's seed; the plan was made for the build's
    seed. Edited (another seed) or deleted (the loader's seed 0), the engine served other decay weights than its
    plan's, silently; it is refused in one line, naming the file."""
    model = tiny_checkpoint(tmp_path)
    assert build(model, tmp_path / "e", "--seed", 3, "--wmax", 4) == 0
    record = tmp_path / "e" / "model" / "dummy_weights.json"
    whole = json.loads(record.read_text())
    record.write_text(json.dumps({**whole, "seed": 9}))
    with pytest.raises(UserError, match=r"dummy_weights.json differs .*\(in seed\)"):
        engine_config(str(tmp_path / "e"))
    record.unlink()
    with pytest.raises(UserError, match="dummy_weights.json is missing.*seed 3"):
        engine_config(str(tmp_path / "e"))
    record.write_text(json.dumps(whole, indent=4))          # the same record, written another way: accepted
    assert engine_config(str(tmp_path / "e")).load_format == "dummy"


def test_a_model_that_does_not_fit_is_refused_with_what_it_needs_and_has(tmp_path, capsys):
    model = tiny_checkpoint(tmp_path)
    assert build(model, tmp_path / "e") == 0
    cfg = engine_config(str(tmp_path / "e"))
    fits = Engine(EngineConfig(**{**cfg.to_dict(), "memory_limit_bytes": 1 << 40}))
    need = fits.runner.footprint.total
    assert need > fits.runner.footprint.weights > 0
    with pytest.raises(UserError) as e:
        Engine(EngineConfig(**{**cfg.to_dict(), "memory_limit_bytes": need - 1}))
    msg = str(e.value)
    assert f"needs {need:,} B" in msg and f"has {need - 1:,} B" in msg and "\n" not in msg
    assert Engine(EngineConfig(**{**cfg.to_dict(), "memory_limit_bytes": need})).runner.footprint.total == need
    # and dasc-build refuses it too, in one line, writing nothing
    capsys.readouterr()
    assert build(model, tmp_path / "f", "--memory-limit-bytes", 1000) == 2
    err = capsys.readouterr().err.strip()
    assert "does not fit" in err and "has 1,000 B" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("arch,over,flags,needle", [
    ("kda", dict(num_experts_per_token=9), (), "experts per token (9) must be in 1..num_experts (8)"),
    ("gdn", dict(num_experts_per_tok=9), (), "experts per token (9) must be in 1..num_experts (8)"),
    ("kda", dict(num_expert_group=3), (), "8 experts, n_group 3, topk_group 1 do not fit"),
    ("kda", dict(topk_group=3), (), "8 experts, n_group 2, topk_group 3 do not fit"),
    ("kda", dict(num_expert_group=4, num_experts_per_token=3), (), "hold 2 experts, fewer than the 3"),
    ("kda", dict(moe_intermediate_size=33), ("--tp", 2), "splits each routed expert's 33 intermediate channels"),
    ("gdn", dict(shared_expert_intermediate_size=31), ("--tp", 2), "splits each shared expert's 31 intermediate"),
], ids=["kda-topk", "gdn-topk", "groups-divide", "topk-group", "group-capacity", "tp-experts", "tp-shared"])
def test_experts_that_do_not_fit_are_refused_in_one_line(tmp_path, capsys, arch, over, flags, needle):
    model = tiny_checkpoint(tmp_path, arch, **over)
    capsys.readouterr()
    assert build(model, tmp_path / "e", *flags) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "e").exists()


def test_dummy_needs_the_network_and_safetensors_needs_weights(tmp_path, capsys):
    raw = tiny_moe_config("kda")
    del raw["num_experts"]              # a state-only config: nothing to make the experts from
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert build(tmp_path / "config.json", tmp_path / "e") == 2
    assert "lacks required field 'num_local_experts'" in capsys.readouterr().err
    model = tiny_checkpoint(tmp_path)
    assert dasc_build(["--model", str(model), "--output", str(tmp_path / "f"), "--load-format", "safetensors",
                       *SMALL]) == 2
    assert "--load-format dummy" in capsys.readouterr().err


def test_prefill_computes_logits_for_the_sampled_positions_only(tmp_path, monkeypatch):
    from trtllm_dasc.model.model import HybridModel
    assert build(tiny_checkpoint(tmp_path), tmp_path / "e", "--prefill-chunk", 16) == 0
    engine = Engine(engine_config(str(tmp_path / "e")))
    rows, head = [], HybridModel._head
    monkeypatch.setattr(HybridModel, "_head", lambda self, x: rows.append(x.shape[0]) or head(self, x))
    # a 40-token prompt in chunks of 16, then 3 decode steps: one LM-head row per step, none for the first chunks
    engine.generate([GenerationRequest(0, list(range(7, 47)), 4, SamplingParams(temperature=1.0, seed=2))])
    assert rows == [1, 1, 1, 1]


def test_a_dummy_engines_model_rebuilds_as_dummy_by_default(tmp_path):
    """What the benchmark drivers do: one dummy model directory (config + seed), then an engine per arm
    with the default --load-format auto; no weights check may ask for safetensors there."""
    assert build(tiny_checkpoint(tmp_path), tmp_path / "first", "--seed", 5) == 0
    model = tmp_path / "first" / "model"
    assert dasc_build(["--model", str(model), "--output", str(tmp_path / "arm"), *SMALL]) == 0
    meta = json.loads((tmp_path / "arm" / "config.json").read_text())
    assert meta["weights"]["load_format"] == "dummy" and meta["weights"]["seed"] == 5


def test_a_limit_without_room_for_the_step_is_refused_naming_the_workspace(tmp_path, capsys):
    """A limit that holds weights, KV, state rows and pool but not the largest step's tensors (the H200 engine
    that passed the old check and died of CUDA out-of-memory in warm-up) is refused; one holding both loads."""
    model = tiny_checkpoint(tmp_path)
    assert build(model, tmp_path / "e") == 0
    cfg = engine_config(str(tmp_path / "e"))
    fp = Engine(EngineConfig(**{**cfg.to_dict(), "memory_limit_bytes": 1 << 40})).runner.footprint
    old_total = fp.weights + fp.kv + fp.state + fp.pool
    assert fp.workspace > 0 and fp.total == old_total + fp.workspace
    for limit in (old_total, old_total + fp.workspace - 1):
        with pytest.raises(UserError) as e:
            Engine(EngineConfig(**{**cfg.to_dict(), "memory_limit_bytes": limit}))
        assert "step workspace" in str(e.value) and "\n" not in str(e.value)
    assert Engine(EngineConfig(**{**cfg.to_dict(), "memory_limit_bytes": old_total + fp.workspace})) is not None
    # dasc-build too, at build time
    capsys.readouterr()
    assert build(model, tmp_path / "f", "--memory-limit-bytes", old_total) == 2
    err = capsys.readouterr().err.strip()
    assert "step workspace" in err and len(err.splitlines()) == 1 and not (tmp_path / "f").exists()
    assert build(model, tmp_path / "g", "--memory-limit-bytes", old_total + fp.workspace) == 0
