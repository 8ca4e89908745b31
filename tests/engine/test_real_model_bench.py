"""benchmarks/real_model.py --smoke on the CPU: a tiny Kimi-shaped MoE built with --load-format dummy runs every
phase and writes its JSON; the decode bound counts the router's real choices (one token picks exactly top-k
distinct experts per MoE layer) and the weight bytes by role add up to what the loaded engine holds."""
from __future__ import annotations

import json

import pytest

from benchmarks import real_model as bench


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("real_model") / "result.json"
    assert bench.main(["--smoke", "--out", str(out), "--tokens", "32", "--commit", "c0ffee"]) == 0
    return json.loads(out.read_text())


def test_smoke_runs_every_phase(smoke):
    assert smoke["complete"] and smoke["commit"] == "c0ffee" and "python -m benchmarks real_model --smoke" in smoke["command"]
    assert smoke["weights"].startswith("dummy") and smoke["targets"] == bench.TARGETS
    assert smoke["ready"]["ready_s"] == pytest.approx(smoke["ready"]["load_s"] + smoke["ready"]["warmup_s"])
    assert [r["tokens"] for r in smoke["prefill"]] == [32] and [r["batch"] for r in smoke["decode"]] == [1, 2]
    assert smoke["passes"]["first_s"] > 0 and set(smoke["verdict"]) == {"decode_batch1", "prefill_longest",
                                                                       "first_pass"}


def test_decode_bound_counts_the_routers_choices(smoke):
    top_k, moe_layers = 2, smoke["weight_bytes"]["moe_layers"]
    one, two = smoke["decode"]
    # one token: exactly top-k distinct experts in each MoE layer (the tiny model's first layer is dense)
    assert one["distinct_experts_per_layer"] == [top_k] * moe_layers == [2, 2]
    assert all(top_k <= d <= 2 * top_k for d in two["distinct_experts_per_layer"])
    for row in (one, two):
        parts = row["bytes"]
        assert parts["routed_experts"] == sum(row["distinct_experts_per_layer"]) * smoke["weight_bytes"]["expert_bytes"]
        assert row["bound_bytes"] == sum(parts.values())
        assert row["ratio"] == pytest.approx(row["step_ms"] / row["bound_ms"])


def test_weight_bytes_by_role_add_up_to_the_loaded_model(smoke):
    w = smoke["weight_bytes"]
    # fp32 smoke run: the loaded model's tensors (counted by walking them) = other + every expert + the table
    embed_table = 320 * w["embed_row_bytes"]
    assert w["other_bytes"] + w["all_experts_bytes"] + embed_table == smoke["ready"]["footprint"]["weights"]
    assert w["all_experts_bytes"] == w["moe_layers"] * 8 * w["expert_bytes"]
