"""Two dasc-wr replays in one step, listed in the other order than the spans they merge into: each request
must continue from its own replay's scratch row (Span.replay_into), never from the replay at the same list
position. StepPlans built by hand and executed by ModelRunner; the reference is transformers' own cache
(test_engine_wr_reference.hf_wr_logits: the true state's retained units, the replay's omitted ones)."""
import random

import pytest

from engine_helpers import VOCAB, split_wmax
from test_engine_wr_reference import hf_wr_logits, rel_err
from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.engine.runner import ModelRunner
from trtllm_dasc.engine.step import Span, StepPlan

K, T, W, BS = 21, 27, 8, 4
NB = -(-T // BS)                       # blocks of one request's table


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_each_request_merges_its_own_replay_row(tiny_models, arch):
    path, hf = tiny_models[arch]
    runner = ModelRunner(EngineConfig(model=str(path), wmax=split_wmax(path), policy="wr", replay_window=W,
                                      max_batch=4, block_size=BS, num_kv_blocks=64, max_context=64))
    rng = random.Random(31)
    ids = {r: [rng.randrange(VOCAB) for _ in range(T)] for r in "ab"}
    # rows, slots and KV blocks per request; the row numbers do not follow the list order either
    row, scratch, slot = {"a": 5, "b": 1}, {"a": 2, "b": 6}, {"a": 0, "b": 1}
    table = {"a": list(range(0, NB)), "b": list(range(NB, 2 * NB))}
    rtable = {"a": list(range(2 * NB, 3 * NB)), "b": list(range(3 * NB, 4 * NB))}
    # step 1: prefill [0, K) of both, storing the checkpoint at K (the pool keeps the retained units only)
    first = runner.execute(StepPlan(0, [Span(ids[r][:K], row[r], 0, table[r], captures=[(K, slot[r])]) for r in "ab"],
                                    resets=[row[r] for r in "ab"]))
    assert first.stored == [True, True]
    # step 2: the hits. Replays b then a, the requests' spans a then b; each replay's table holds a copy of its
    # request's cached KV (it rewrites [K - W, K) with its own)
    replays = [Span(ids[r][K - W:K], scratch[r], K - W, rtable[r], replay_into=row[r]) for r in "ba"]
    spans = [Span(ids[r][K:], row[r], K, table[r], logits="all") for r in "ab"]
    plan = StepPlan(1, replays + spans, resets=[scratch[r] for r in "ba"],
                    kv_copies=[(table[r][i], rtable[r][i]) for r in "ab" for i in range(-(-K // BS))],
                    loads=[(slot[r], row[r]) for r in "ab"])
    out = runner.execute(plan, sample_tokens=False)
    assert out.errors == [None] * 4 and out.stored == []
    retained = runner.plan.retained
    assert 0 < sum(map(len, retained)) < runner.plan.config.units_per_layer * len(retained)
    for i, r in enumerate("ab"):
        ours = out.logits[2 + i]
        ref = hf_wr_logits(hf, ids[r], K, W, retained, arch)
        assert rel_err(ours, ref) <= 1e-5
