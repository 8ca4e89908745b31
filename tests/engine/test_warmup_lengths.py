"""Warm-up's prompt lengths (engine/warmup.py): the longest reaches two prefill chunks whatever the checkpoint
interval (the H200's first pass of 2.3-3k-token prompts ran 21x slower than its second while warm-up
stopped at 2 x interval + 5 = 517 tokens), within the context and the KV cache; and a real warm-up sends
two such prompts in one batch and one alone, alone both on and off the 16-token grid."""
from __future__ import annotations

import pytest

from engine_helpers import make_engine

from trtllm_dasc.engine import warmup as wu
from trtllm_dasc.engine.config import EngineConfig


def _blocks(bs: int):
    """A request's KV blocks counted anew (no replay window): ceil((prompt + new) / block size)."""
    return lambda prompt, new: -(-(prompt + new) // bs)


def test_longest_reaches_two_chunks_at_the_default_interval():
    # real_model.py's engines: interval 256, chunks of 2048 (and 4096), a context of several chunks
    for chunk in (2048, 4096):
        cfg = EngineConfig(model="unused", interval=256, prefill_chunk=chunk, max_context=4 * chunk,
                           num_kv_blocks=4096, block_size=16)
        longest, short = wu.prompt_lengths(cfg, _blocks(16))
        assert longest >= 2 * chunk
        # the batch's other prompts keep to the interval's scale
        assert short <= 2 * 256 + 5


@pytest.mark.parametrize("max_context, kv_blocks", [(3032, 4096), (100000, 300)], ids=["context", "kv"])
def test_longest_stays_within_the_context_and_the_cache(max_context, kv_blocks):
    cfg = EngineConfig(model="unused", interval=256, prefill_chunk=4096, max_context=max_context,
                       num_kv_blocks=kv_blocks, block_size=16)
    longest, _ = wu.prompt_lengths(cfg, _blocks(16))
    # the hit prompt (longest + 1 + the longest tail) and its decode fit the context and the cache
    end = longest + 1 + max(wu.TAILS)
    assert end + wu.DECODE <= max_context and -(-(end + wu.DECODE) // 16) <= kv_blocks
    # and it is not needlessly short: the context's room (real_model.py's pass: 3000-token prompts) or half
    # of what would overflow the cache
    if max_context < 8000:
        assert longest == max_context - max(wu.TAILS) - 1 - wu.DECODE
    else:
        assert -(-(2 * longest + 1 + max(wu.TAILS) + wu.DECODE) // 16) > kv_blocks


def test_warmup_sends_two_long_prompts_together_and_one_alone(tiny_models, monkeypatch):
    # interval 8, chunks of 16: the old cap (2 x 8 + 5 = 21) fell short of two chunks (32)
    engine = make_engine(tiny_models["gdn"][0], max_batch=4, interval=8, prefill_chunk=16, max_context=128)
    batches = []
    real = engine.generate
    monkeypatch.setattr(engine, "generate", lambda reqs, **kw: batches.append([len(r.prompt) for r in reqs])
                        or real(reqs, **kw))
    report = engine.warmup()
    assert report["longest_prompt"] >= 2 * 16
    # the last batches are the one-token capture round's (test_warmup_one_token_captures.py), one a size
    captures = sum(n <= engine.cfg.max_batch for n in wu.ONE_TOKEN_CAPTURES)
    assert [len(b) for b in batches[-captures:]] == [1, 3]
    batches = batches[:-captures]
    cold = batches[::2]
    # one round a lone length: on the grid, off it (the low-bucket prompt is the longest here, a repeat), short
    assert [len(b) for b in cold] == [4, 2, 1, 1, 1]
    # the largest batch holds two prompts of two chunks, the lone request too, in its first two rounds
    assert sum(n >= 2 * 16 for n in cold[0]) == wu.LONG_PER_ROUND and min(cold[-3][0], cold[-2][0]) >= 2 * 16
    # and a lone short prompt, whose decode reads a single split of the paged kernel (SPLITS = 1: the H200
    # compiled that variant inside a lone 1-token request when warm-up had decoded only long contexts)
    assert cold[-1] == [wu.SHORT_LONE]
    # Triton compiles a kernel variant per class of an integer argument (divisible by 16 or not): every batch
    # size, a lone request included, meets prompt lengths of both classes among its rounds (a lone request
    # has one length a step, so it needs one round of each)
    by_size = {}
    for lengths in batches:
        by_size.setdefault(len(lengths), set()).update(n % 16 == 0 for n in lengths)
    assert by_size == {4: {True, False}, 2: {True, False}, 1: {True, False}}
    assert engine.ready and engine.stats()["kv_blocks_free"] == engine.cfg.num_kv_blocks


def test_moe_warmup_reaches_the_largest_uncapped_step(tiny_models, monkeypatch):
    """Without max_num_tokens a step runs every running request's prefill chunk: 4 prompts of 12 tokens ran
    48 tokens in one step, while the fused MoE kernels were warmed for steps up to max_context (16) only; on a
    GPU a default-built Qwen-80B engine (8 x 2048-token chunks, a 4,096 context) compiled the 128-row tiles
    inside its first big batch. warm_moe is a no-op on a CPU: its argument is what is checked, against the
    steps the engine ran. From a review helper; fails on the old code."""
    from trtllm_dasc.model.model import HybridModel
    from engine_helpers import greedy
    warmed = []
    real = HybridModel.warm_moe
    monkeypatch.setattr(HybridModel, "warm_moe", lambda self, n: warmed.append(n) or real(self, n))
    engine = make_engine(tiny_models["gdn"][0], max_batch=4, prefill_chunk=16, max_context=16)
    steps = []
    inner = engine.runner.execute
    monkeypatch.setattr(engine.runner, "execute",
                        lambda plan, *a, **kw: steps.append(sum(len(s.token_ids) for s in plan.spans))
                        or inner(plan, *a, **kw))
    engine.generate([greedy(i, [i + 1] * 12, 4) for i in range(4)])
    assert max(steps) == 48 and warmed == [64]   # largest_step: 4 requests x a 16-token chunk


def test_the_step_bound_holds_the_replays_of_an_uncapped_wr_engine(tiny_models, monkeypatch):
    """dasc-wr, no max_num_tokens: four hits admitted together each replay a window as a span of its own beside
    their first chunk. The steps the engine runs (counted from its plans, the independent reference) stay within
    model/workspace.py's largest step, which the memory check and the MoE warm-up size for; the bound of
    prefill chunks alone (before 12-07) is below them. From the closing list of session 40; fails on the old code."""
    from trtllm_dasc.model.model import HybridModel
    from trtllm_dasc.model.workspace import largest_step
    from engine_helpers import greedy
    warmed = []
    real = HybridModel.warm_moe
    monkeypatch.setattr(HybridModel, "warm_moe", lambda self, n: warmed.append(n) or real(self, n))
    # every unit omitted: a hit replays a window of 6 tokens (the replay_window override)
    engine = make_engine(tiny_models["gdn"][0], max_batch=4, prefill_chunk=16, max_context=64, wmax=10 ** 6,
                         policy="wr", replay_window=6)
    prefixes = [[3 + i] * 20 for i in range(4)]
    engine.generate([greedy(i, p, 1) for i, p in enumerate(prefixes)])     # the checkpoints the hits load
    steps = []
    inner = engine.runner.execute
    monkeypatch.setattr(engine.runner, "execute",
                        lambda plan, *a, **kw: steps.append((sum(len(s.token_ids) for s in plan.spans),
                                                             len(plan.spans))) or inner(plan, *a, **kw))
    engine.generate([greedy(10 + i, p + [50 + i] * 14, 1) for i, p in enumerate(prefixes)])
    bound = largest_step(engine.cfg, engine.runner.replay_window)
    tokens, spans = max(steps)
    assert engine.runner.replay_window == 6 and tokens > 4 * 16          # past the chunks-only bound
    assert tokens <= bound.tokens and max(n for _, n in steps) <= bound.seqs + bound.replay_spans
    assert warmed == [bound.tokens]
