"""The step's transient tensors (model/workspace.py) against hand counts: the shapes of the docstring typed
from the tiny Kimi-Linear config's numbers (not read through the schema), the engine's largest step from its
caps, and the footprint that carries it into the engine's memory check."""
from __future__ import annotations

import types
from pathlib import Path

from trtllm_dasc.config import HybridConfig
from trtllm_dasc.model.workspace import StepShape, largest_step, step_workspace_bytes

MODEL = Path(__file__).resolve().parents[2] / "trtllm_dasc" / "assets" / "tiny-kimi-linear"


def tiny_hand_count(T, N, C, ctx, R=0):
    """tiny-kimi-linear in fp32: D 128, vocabulary 3072, 5 KDA layers of 4 heads x 32 x 32, 4 experts top-2 of
    width 64 + one shared of 64, a dense MLP of 256, MLA 4 heads (nope 32, rope 16, v 32, latent 64). R replay
    spans: sequences of fla's forward (their chunk-start and final states), no logits row."""
    b, state = 4, 4 * 32 * 32 * 4
    resident = 2 * T * 128 * b + 2 * C * 5 * state + N * 3072 * (b + 4)
    linear = 10 * T * 128 * b + 2 * T * 128 * 4 + 2 * T * 4 * 64 * 4 + (-(-T // 64) + N + R) * state + (N + R) * state
    moe = T * 4 * 4 + T * 2 * (64 + 128) * b + T * 128 * b + T * (3 * 64 + 128) * b
    dense = 3 * T * 256 * b
    attention = T * 4 * 48 * b + 2 * T * 80 * b + T * 4 * 32 * b + ctx * 4 * (64 + 2 * 48) * b
    parts = {"resident": resident, "linear": linear, "moe": moe, "dense_mlp": dense, "attention": attention}
    return {"total": resident + max(linear, moe, dense, attention), **parts}


def test_tiny_workspace_is_a_hand_count():
    schema = HybridConfig.from_path(str(MODEL)).schema
    # 100 tokens: not a multiple of fla's 64-token chunk (the chunk-start states round up)
    for T, N, C, ctx in ((100, 3, 5, 200), (4096, 8, 0, 4096)):
        assert step_workspace_bytes(schema, tokens=T, seqs=N, captures=C, context=ctx, dtype_bytes=4) \
            == tiny_hand_count(T, N, C, ctx)
    assert step_workspace_bytes(schema, tokens=100, seqs=3, captures=5, context=200, dtype_bytes=4, replay_spans=3) \
        == tiny_hand_count(100, 3, 5, 200, R=3)


def test_the_footprint_counts_the_workspace_of_its_step():
    from trtllm_dasc.model import DummyWeights
    from trtllm_dasc.model.footprint import model_footprint
    cfg = HybridConfig.from_path(str(MODEL), conv_dtype="float32")
    kw = dict(dtype="float32", tp_rank=0, tp_size=1, bundle_order=None, state_rows=3, kv_blocks=5, block_size=16,
              pool_bytes=777)
    bare = model_footprint(cfg, DummyWeights(cfg), **kw)
    step = model_footprint(cfg, DummyWeights(cfg), **kw, step=StepShape(tokens=100, seqs=3, captures=5, context=200))
    assert bare.workspace == 0 and step.workspace == tiny_hand_count(100, 3, 5, 200)["total"]
    assert step.total == bare.total + step.workspace and "step workspace" in step.describe()


def cfg(**kw):
    base = dict(max_num_tokens=None, max_batch=8, prefill_chunk=2048, max_context=4096, interval=256,
                prompt_only=False, max_step_captures=None)
    return types.SimpleNamespace(**{**base, **kw})


def test_the_largest_step_of_an_engine_config():
    # uncapped: 8 requests x min(chunk 2048, context 4096) = 16384 tokens; a span of c tokens meets at most
    # (c - 1) // 256 + 1 grid points, a branch point and its end: 8 spans of 2048 -> 8 x (7 + 3) = 80 <=
    # 16384 // 256 + 3 x 8 = 88 (the bound over any split of the tokens)
    assert largest_step(cfg()) == StepShape(tokens=16384, seqs=8, captures=88, context=4096)
    # prompt ends only: one a span; a token cap of 5 allows 5 one-token spans at most
    assert largest_step(cfg(prompt_only=True)).captures == 8
    assert largest_step(cfg(prompt_only=True, max_num_tokens=5)) == StepShape(5, 8, 5, 4096)
    # the scheduler's cap
    assert largest_step(cfg(max_step_captures=6)).captures == 6
    assert largest_step(cfg(prompt_only=True, max_step_captures=50)).captures == 8
    # dasc-wr's replays (engine/scheduler.py _admit): uncapped, a span of W more tokens beside each request's
    # chunk; capped, within the cap, but a window past it is admitted alone with one prefill token
    assert largest_step(cfg(), replay_window=6) == StepShape(tokens=16384 + 8 * 6, seqs=8, captures=88, context=4096,
                                                             replay_spans=8)
    assert largest_step(cfg(max_num_tokens=5), replay_window=9).tokens == 10
    assert largest_step(cfg(max_num_tokens=50), replay_window=9).tokens == 50
