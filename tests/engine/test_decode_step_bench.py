"""benchmarks/decode_step.py on CPU: the smoke run writes its JSON where it is told, with per-batch rows
whose weight bytes match a count made here with the safetensors library (every tensor but the embedding
table, plus one table row per sequence), and whose bound, ratio and target verdict follow from them."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
from benchmarks import decode_step as bench

BATCHES = (1, 3)


def independent_weight_bytes(model_dir: Path, batch: int) -> int:
    """What a decode step reads, counted from the file by the safetensors library (untied LM head)."""
    from safetensors import safe_open
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    assert "lm_head.weight" in tensors
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    embed = tensors["model.embed_tokens.weight"]
    return total - embed.numel() * embed.element_size() + batch * embed.shape[1] * embed.element_size()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("decode_step") / "result.json"
    argv = ["--smoke", "--out", str(out), "--batches", ",".join(map(str, BATCHES)), "--context", "20",
            "--reps", "3", "--warmup", "1", "--commit", "c0ffee"]
    # the suite runs on one OpenMP thread (tests/conftest.py): from 2, the smoke's own 1 is its doing, and
    # main() gives the caller's count back
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert bench.main(argv) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    return json.loads(out.read_text())


def test_smoke_records_the_run(smoke):
    assert "python -m benchmarks decode_step --smoke" in smoke["command"] and smoke["commit"] == "c0ffee"
    assert smoke["device"] == "cpu" and smoke["torch_device"] == "cpu" and smoke["dtype"] == "float32"
    assert smoke["context"] == 20 and smoke["torch_threads"] == 1
    assert smoke["copy_bandwidth_Bps"] > 0 and smoke["copy_bytes"] > 0
    assert [r["batch"] for r in smoke["rows"]] == list(BATCHES)
    for r in smoke["rows"]:
        assert 0 < r["step_ms_min"] <= r["step_ms"] <= r["step_ms_max"]
        assert 0 < r["execute_ms"]


def test_weight_bytes_match_an_independent_count(smoke):
    model = Path(smoke["model"])
    for r in smoke["rows"]:
        assert r["weight_bytes"] == independent_weight_bytes(model, r["batch"])
    # one more sequence reads exactly one more embedding row (64 fp32 values of the tiny model)
    assert smoke["rows"][1]["weight_bytes"] - smoke["rows"][0]["weight_bytes"] == (BATCHES[1] - BATCHES[0]) * 64 * 4


def test_bound_ratio_and_target_follow_from_the_measurements(smoke):
    bw = smoke["copy_bandwidth_Bps"]
    for r in smoke["rows"]:
        assert r["bound_ms"] == pytest.approx(1e3 * r["weight_bytes"] / bw)
        assert r["ratio"] == pytest.approx(r["step_ms"] / r["bound_ms"])
        assert r["tokens_per_s"] == pytest.approx(r["batch"] * 1e3 / r["step_ms"])
    one = smoke["rows"][0]
    assert smoke["target_met"] is (one["ratio"] <= 2.0)
    assert math.isfinite(one["ratio"])


@pytest.mark.parametrize("argv,words", [
    (["--batches", "0"], "--batches: every batch size must be >= 1"),
    (["--batches", "1,x"], "--batches must be comma-separated integers"),
    (["--reps", "0"], "--reps must be >= 1"),
    (["--device", "tpu"], "--device must be cpu, cuda or cuda:N"),
    (["--model", "/nonexistent"], "--smoke writes its own tiny checkpoint"),
])
def test_bad_input_is_one_line(tmp_path, capsys, argv, words):
    assert bench.main(["--smoke", "--out", str(tmp_path / "r.json"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("decode_step: error: ") and words in err and "\n" not in err
    assert not (tmp_path / "r.json").exists()


def test_routed_experts_are_refused():
    # the embedded default model routes its MLPs through experts: "every weight" would overstate the bound
    with pytest.raises(bench.UserError, match="routed experts"):
        bench.weight_bytes(str(ROOT / "trtllm_dasc" / "assets" / "tiny-kimi-linear"))
