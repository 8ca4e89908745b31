"""The matched-HBM KV cache sized beside the weights (clients/kv_sizing.py): the engine footprint's fixed part
and block bytes against a hand count of the embedded model, the floor arithmetic against hand numbers, the
phases it covers, and the client's choice against dasc-build's own memory check (fits at the chosen count,
refused one block above)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from build_scripts.dasc_build import main as dasc_build
from clients import kv_sizing
from clients.matched_hbm import main

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "trtllm_dasc" / "assets" / "tiny-kimi-linear"


class _P:
    def __init__(self, name, q, arms=("x",)):
        self.name, self.q, self.arms = name, q, list(arms)


def _hand_counts(max_batch, budget):
    """weights (float32: 4 B an element of the checkpoint), state rows, pool; a KV block: the one full-attention
    layer's latent (kv_lora_rank + qk_rope_head_dim) per token, 16 tokens, 4 B."""
    from safetensors import safe_open
    from trtllm_dasc.config import HybridConfig
    cfg = json.loads((MODEL / "config.json").read_text())
    with safe_open(str(MODEL / "model.safetensors"), "pt") as f:
        weights = 4 * sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys())
    row = HybridConfig.from_path(str(MODEL), conv_dtype="float32").dense_checkpoint_bytes_per_rank(1)
    layers = cfg["layer_types"].count("full_attention")
    block = layers * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 4 * 16
    return weights + (2 * max_batch + 1) * row + budget, block


def test_footprint_parts_match_a_hand_count():
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.model.weights import CheckpointReader
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    cfg = HybridConfig.from_path(str(MODEL), conv_dtype="float32")
    plan, _ = plan_from_path(str(MODEL), PlanOptions(wmax=0))
    got = kv_sizing.engine_fixed_and_block_bytes(cfg, CheckpointReader(str(MODEL)), dtype="float32", tp=1,
                                                  bundle_order=plan.bundle_order, max_batch=4, block_size=16,
                                                  budget=12345)
    assert got == _hand_counts(4, 12345) and got[1] == 5120


def test_fit_and_coverage_arithmetic():
    # fixed 1000, blocks of 10: a limit of 1000 + 10 x (k + 1) holds k blocks (+1 the padding block)
    assert kv_sizing.blocks_that_fit(1000 + 10 * 51, 1000, 10) == 50
    assert kv_sizing.blocks_that_fit(1000 + 10 * 51 - 1, 1000, 10) == 49
    assert kv_sizing.blocks_that_fit(900, 1000, 10) == 0
    phases = [_P("a", 10), _P("b", 30), _P("full", 500, ["full dataset"])]
    # need (30 + 4) x 3 = 102 blocks; a limit fitting 60: (10 + 4) x 3 = 42 <= 60 covers a, not b
    kv = kv_sizing.plan_kv(phases, max_batch=4, blocks_per_request=3, limit=1000 + 10 * 61, fixed=1000, per_block=10)
    assert (kv["blocks"], kv["need"], kv["fit"], kv["covered"], kv["not_covered"]) == (60, 102, 60, ["a"], ["b"])
    assert kv["total_bytes"] == 1000 + 61 * 10
    roomy = kv_sizing.plan_kv(phases, max_batch=4, blocks_per_request=3, limit=10 ** 9, fixed=1000, per_block=10)
    assert roomy["blocks"] == 102 and roomy["not_covered"] == []
    assert kv_sizing.plan_kv(phases, max_batch=4, blocks_per_request=3, limit=None, fixed=None,
                             per_block=None)["blocks"] == 102


ARGV = ["--model", str(MODEL), "--arms", "dense,nr16", "--dense-slots", "3", "--scale", "0.03", "--seeds", "42",
        "--device", "cpu", "--dtype", "float32", "--max-batch-size", "4", "--plan-only"]


def test_the_chosen_kv_passes_the_engines_check_and_one_more_block_does_not(tmp_path, capsys):
    fixed, block = _hand_counts(4, 4 * 104960)
    # room for 37 blocks: fewer than the phases need (the workload's longest prompt alone is several)
    limit = fixed + block * 38
    assert main([*ARGV, "--memory-limit-bytes", str(limit)]) == 0
    plan = json.loads(capsys.readouterr().out)
    kv = plan["kv_cache"]
    assert kv["blocks"] == 37 and kv["fixed_bytes"] == fixed and kv["block_bytes"] == block and kv["not_covered"]
    flags = ["--model", str(MODEL), "--device", "cpu", "--dtype", "float32", "--max-batch-size", "4",
             "--state-budget-bytes", str(4 * 104960), "--memory-limit-bytes", str(limit), "--force"]
    assert dasc_build([*flags, "--output", str(tmp_path / "a"), "--kv-blocks", "37"]) == 0
    assert dasc_build([*flags, "--output", str(tmp_path / "b"), "--kv-blocks", "38"]) == 2
    assert "does not fit" in capsys.readouterr().err


def test_a_roomy_limit_keeps_the_never_evict_default(capsys):
    assert main([*ARGV, "--memory-limit-bytes", str(10 ** 12)]) == 0
    kv = json.loads(capsys.readouterr().out)["kv_cache"]
    assert kv["blocks"] == kv["need"] and kv["not_covered"] == []


@pytest.mark.parametrize("value", ["lots", "0"])
def test_a_bad_limit_is_one_line(value, capsys):
    assert main([*ARGV, "--memory-limit-bytes", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--memory-limit-bytes" in err[0]
