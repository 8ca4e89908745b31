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
from clients.kv_sizing import GIB
from trtllm_dasc.model.workspace import step_workspace_bytes

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


def natural_captures_by_hand(flags) -> int:
    """The most checkpoints one step of the engine these flags build can capture (nothing caps it): at
    prompt ends only one a sequence; else a span of c tokens meets (c - 1) // interval + 1 grid points, its
    branch point and its prompt end, and the spans' tokens add up to the step's (4 sequences of up to
    min(chunk, context) tokens here: ARGV's batch, no --max-num-tokens)."""
    seqs = 4
    tokens = seqs * min(int(flags["--prefill-chunk"]), int(flags["--max-context"]))
    if "--prompt-only" in flags:
        return min(seqs, tokens)
    return min(tokens, tokens // int(flags["--interval"]) + 3 * seqs)


def test_the_chosen_kv_passes_the_engines_check_and_one_more_block_does_not(tmp_path, capsys, monkeypatch):
    import clients.matched_hbm as mh
    from test_workspace import tiny_hand_count
    seen = {}
    real_flags = mh.engine_flags
    monkeypatch.setattr(mh, "engine_flags", lambda *a: seen.setdefault("flags", real_flags(*a)))
    fixed, block = _hand_counts(4, 4 * 104960)
    # the engine's largest step (the flags it is built with): 4 x min(chunk 2048, context) tokens, 4 sequences,
    # as many captures as it can take, the context; in the engine's count, so in the fixed bytes
    assert main([*ARGV, "--memory-limit-bytes", str(10 ** 12)]) == 0
    kv = json.loads(capsys.readouterr().out)["kv_cache"]
    flags = dict(zip(seen["flags"][::2], seen["flags"][1::2]))
    ctx, caps = int(flags["--max-context"]), natural_captures_by_hand(flags)
    ws = tiny_hand_count(4 * min(2048, ctx), 4, caps, ctx)
    assert kv["step_workspace_bytes"] == ws and kv["fixed_bytes"] == fixed + ws["total"]
    fixed += ws["total"]
    # room for 37 blocks: fewer than the phases need (the workload's longest prompt alone is several)
    limit = fixed + block * 38
    assert main([*ARGV, "--memory-limit-bytes", str(limit)]) == 0
    plan = json.loads(capsys.readouterr().out)
    kv = plan["kv_cache"]
    assert kv["blocks"] == 37 and kv["fixed_bytes"] == fixed and kv["block_bytes"] == block and kv["not_covered"]
    assert dasc_build([*build_flags(seen["flags"], limit), "--output", str(tmp_path / "a"), "--kv-blocks", "37"]) == 0
    assert dasc_build([*build_flags(seen["flags"], limit), "--output", str(tmp_path / "b"), "--kv-blocks", "38"]) == 2
    assert "does not fit" in capsys.readouterr().err


def build_flags(client_flags, limit):
    """dasc-build's flags as the client builds them, with this limit and no --kv-blocks (the test's own)."""
    assert len(client_flags) % 2 == 0       # name-value pairs only (no --prompt-only, no dummy weights here)
    pairs = dict(zip(client_flags[::2], client_flags[1::2]))
    pairs.pop("--kv-blocks")
    pairs["--memory-limit-bytes"] = str(limit)
    return ["--model", str(MODEL), "--state-budget-bytes", str(4 * 104960), "--force",
            *[x for kv in pairs.items() for x in kv]]


def test_a_roomy_limit_keeps_the_never_evict_default(capsys):
    assert main([*ARGV, "--memory-limit-bytes", str(10 ** 12)]) == 0
    kv = json.loads(capsys.readouterr().out)["kv_cache"]
    assert kv["blocks"] == kv["need"] and kv["not_covered"] == []


@pytest.mark.parametrize("value", ["lots", "0"])
def test_a_bad_limit_is_one_line(value, capsys):
    assert main([*ARGV, "--memory-limit-bytes", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--memory-limit-bytes" in err[0]


KIMI48 = ROOT / "tests" / "data" / "kimi-linear-48b-a3b.config.json"


def _kimi48_schema():
    import types
    from clients.matched_hbm import model_config
    return model_config(types.SimpleNamespace(model_config=str(KIMI48), dummy=True)).schema


def test_step_workspace_of_kimi48_at_8192_tokens_is_a_hand_count():
    # Kimi-Linear-48B-A3B's shapes typed from its model card, not read through the schema: D 2304, vocabulary
    # 163840, 20 KDA layers of 32 heads x 128 x 128, 256 experts top-8 of width 1024 + one shared of 1024,
    # one dense layer of 9216, MLA 32 heads (nope 128, rope 64, v 128, latent 512); bf16; 8192 tokens of 96
    # sequences, 6 capturing, a context of 2816 tokens
    T, N, b, state = 8192, 96, 2, 32 * 128 * 128 * 4
    resident = 2 * T * 2304 * b + 2 * 6 * 20 * state + N * 163840 * (b + 4)
    linear = (10 * T * 4096 * b + 2 * T * 4096 * 4 + 2 * T * 32 * 64 * 4 + (T // 64 + N) * state + N * state)
    moe = T * 256 * 4 + T * 8 * (1024 + 2304) * b + T * 2304 * b + T * (3 * 1024 + 2304) * b
    dense = 3 * T * 9216 * b
    attention = T * 32 * 192 * b + 2 * T * 576 * b + T * 32 * 128 * b + 2816 * 32 * (256 + 2 * 192) * b
    got = step_workspace_bytes(_kimi48_schema(), tokens=T, seqs=N, captures=6, context=2816,
                                         dtype_bytes=b)
    assert got == {"total": resident + linear, "resident": resident, "linear": linear, "moe": moe,
                   "dense_mlp": dense, "attention": attention}
    # the step's own tensors are a small part of the 24-30.5 GiB the H200 run needed outside the engine's count
    assert 2 * GIB < got["total"] < 3 * GIB


def test_the_device_limit_keeps_the_measured_h200_case_safe():
    # the H200 runs of 12-02 (matched_hbm_kimi48_full.json): the device's total as torch reports it, 150,109,880,320 B
    # (that call's limit 117,304,970,444 + its step estimate 2,418,016,256 + its headroom 30,386,893,620); weights,
    # state rows and pool 112,213,262,336 B; with 24.0 GiB beside those and the KV cache (limit 125e9 B) the fill ran
    # out of memory, with 30.5 GiB (118e9 B) it ran, and that call's 39,462 KV blocks ran
    total, rows_pool_weights, block = 150109880320, 112213262336, 129024
    # the engine's count now holds its largest step: 8192 tokens, 96 sequences, 96 prompt-end captures
    ws = step_workspace_bytes(_kimi48_schema(), tokens=8192, seqs=96, captures=96, context=2816,
                                        dtype_bytes=2)["total"]
    limit = kv_sizing.limit_from_total(total, kv_sizing.DEFAULT_HEADROOM_GIB)
    # beside weights, rows, pool and KV: the step's bound and the headroom, at least the 30.5 GiB that ran
    assert total - limit + ws >= 30.5 * GIB and limit - ws <= 118 * 10 ** 9
    # the KV cache of the call that ran, within a few blocks
    assert abs(kv_sizing.blocks_that_fit(limit, rows_pool_weights + ws, block) - 39462) <= 16
    # the old 8 GiB headroom alone is the limit that died in warm-up
    assert kv_sizing.limit_from_total(total, 8.0) > 125 * 10 ** 9


def test_device_limit_counts_the_step_and_records_it(monkeypatch, capsys):
    # no GPU here: the device's total is given, the rest is the client's own path
    total = 10 ** 12
    monkeypatch.setattr(kv_sizing, "device_limit",
                        lambda device, headroom: kv_sizing.limit_from_total(total, headroom))
    assert main([*ARGV, "--memory-limit-bytes", "device", "--memory-headroom-gib", "1.5"]) == 0
    kv = json.loads(capsys.readouterr().out)["kv_cache"]
    ws = kv["step_workspace_bytes"]
    assert ws["total"] == ws["resident"] + max(v for k, v in ws.items() if k not in ("total", "resident")) > 0
    # the engine's count (fixed_bytes) holds the step's tensors: the device limit leaves out the headroom only
    assert kv["headroom_bytes"] == 3 * GIB // 2 and kv["limit_bytes"] == total - 3 * GIB // 2
    fixed, block = _hand_counts(4, 4 * 104960)
    assert kv["fixed_bytes"] == fixed + ws["total"]


def test_the_device_limit_gives_the_block_count_of_before(monkeypatch, capsys):
    """The step's tensors moved from the device limit into the engine's count: subtracted once, so a device of
    the same total gives the blocks of the old formula, (total - step - headroom - weights, rows and pool)
    // block - 1, hand-counted."""
    import clients.matched_hbm as mh
    from test_workspace import tiny_hand_count
    seen = {}
    real_flags = mh.engine_flags
    monkeypatch.setattr(mh, "engine_flags", lambda *a: seen.setdefault("flags", real_flags(*a)))
    assert main([*ARGV, "--memory-limit-bytes", str(10 ** 12)]) == 0
    capsys.readouterr()
    flags = dict(zip(seen["flags"][::2], seen["flags"][1::2]))
    ctx, caps = int(flags["--max-context"]), natural_captures_by_hand(flags)
    step = tiny_hand_count(4 * min(2048, ctx), 4, caps, ctx)["total"]
    old_fixed, block = _hand_counts(4, 4 * 104960)
    headroom = 3 * GIB // 2
    total = old_fixed + step + headroom + block * 38 + 100
    monkeypatch.setattr(kv_sizing, "device_limit",
                        lambda device, headroom: kv_sizing.limit_from_total(total, headroom))
    assert main([*ARGV, "--memory-limit-bytes", "device", "--memory-headroom-gib", "1.5"]) == 0
    kv = json.loads(capsys.readouterr().out)["kv_cache"]
    assert kv["blocks"] == (total - step - headroom - old_fixed) // block - 1 == 37
