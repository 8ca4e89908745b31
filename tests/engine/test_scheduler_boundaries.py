"""The scheduler at its exact boundaries (each test kills a mutant that survived the rest of the suite):
a checkpoint position that is a chunk's end, captured slots of a request aborted mid-prefill, the wr
worst-case block count, and the step token budget with decoding requests in the step. Expected values
are brute-force counts and hand-derived spans, never the scheduler's own output."""
import pytest

from engine_helpers import greedy, make_engine
from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.engine.scheduler import Scheduler


def spy_plans(engine) -> list:
    plans = []
    inner = engine.runner.execute

    def spy(plan, *a, **kw):
        plans.append(plan)
        return inner(plan, *a, **kw)
    engine.runner.execute = spy
    return plans


def test_a_checkpoint_at_a_chunk_end_is_stored(tiny_models):
    """interval == prefill_chunk: every grid position is the last token of a chunk (done < p <= end)."""
    path, _ = tiny_models["gdn"]
    engine = make_engine(path, interval=4, prefill_chunk=4)
    plans = spy_plans(engine)
    prompt = [(7 * i + 3) % 50 for i in range(18)]
    req = greedy("a", prompt, 2)
    engine.generate([req])
    engine.sanity_check()
    # brute force: the grid 4, 8, 12, 16 (below the prompt end) and the prompt end at len - 1 = 17
    expected = [p for p in range(4, len(prompt) - 1, 4)] + [len(prompt) - 1]
    captured = [p for plan in plans for s in plan.spans for p, _ in s.captures]
    assert captured == expected == [4, 8, 12, 16, 17]
    assert req.stats.checkpoints_stored == len(expected)
    # every grid checkpoint serves a later prompt that shares just that much
    for c in (4, 8, 12, 16):
        hit = greedy(("hit", c), prompt[:c] + [49, 48], 1)
        engine.generate([hit])
        assert hit.stats.cached_tokens == c, c
    engine.sanity_check()


def test_abort_mid_prefill_frees_the_captured_slots(tiny_models):
    path, _ = tiny_models["gdn"]
    engine = make_engine(path, interval=4, prefill_chunk=4)
    slots, rows, blocks = (engine.scheduler.slots.num_free, engine.scheduler.rows.num_free,
                           engine.scheduler.blocks.num_free)
    engine.submit(greedy("x", list(range(1, 23)), 3))
    engine.step()
    engine.step()
    (s,) = engine.scheduler.running
    # two chunks ran: the checkpoints at 4 and 8 are captured, held by the request, not yet in the tree
    assert s.in_prefill and sorted(s.captured) == [4, 8]
    assert engine.scheduler.slots.num_free == slots - 2
    engine.sanity_check()
    assert engine.abort("x")
    engine.run_until_idle()
    engine.sanity_check()
    assert not engine.scheduler.running and engine.cache.checkpoint_slots() == set()
    assert engine.scheduler.slots.num_free == slots
    assert engine.scheduler.rows.num_free == rows
    assert engine.scheduler.blocks.num_free == blocks


def brute_force_blocks(prompt_len: int, max_new: int, window: int, bs: int) -> int:
    """Distinct blocks of the positions a request may write with nothing reused ([0, prompt + max_new - 1):
    the last output token is never fed back), plus those of its longest replay: the last min(W, len - 1)
    tokens before a checkpoint, which sits at len - 1 at most, recomputed into blocks of its own."""
    written = {p // bs for p in range(prompt_len + max_new - 1)}
    replay = min(window, prompt_len - 1)
    return len(written) + len({p // bs for p in range(replay)})


@pytest.mark.parametrize("window", [0, 3, 4, 5, 8, 9])
@pytest.mark.parametrize("prompt_len", [1, 2, 4, 5, 6, 9, 10])
@pytest.mark.parametrize("max_new", [1, 2, 4])
def test_wr_worst_case_blocks_equals_a_brute_force_count(window, prompt_len, max_new):
    # block size 4: windows and prompt ends one token either side of a block boundary (5, 9: one over)
    cfg = EngineConfig(model="unused", block_size=4, num_kv_blocks=64, policy="wr")
    sched = Scheduler(cfg, num_slots=4, num_rows=4, replay_window=window)
    assert sched.worst_case_blocks(prompt_len, max_new) == brute_force_blocks(prompt_len, max_new, window, 4)


def test_wr_worst_case_at_the_cache_size_is_admitted_one_more_is_refused(tiny_models):
    """A wr engine whose replay window crosses a block boundary by one token (W = 5, blocks of 4): a prompt
    that needs exactly the cache is served, one token more is refused at submit."""
    from trtllm_dasc.errors import UserError
    path, _ = tiny_models["gdn"]
    engine = make_engine(path, wmax=10**6, policy="wr", replay_window=5, num_kv_blocks=6)
    assert engine.scheduler.replay_window == 5
    # 17 + 3 - 1 = 19 positions: 5 blocks, the replay's 5 tokens: 2 blocks -> 7 > 6
    with pytest.raises(UserError, match="needs 7 KV blocks"):
        engine.submit(greedy("big", list(range(1, 18)), 3))
    # 13 + 4 - 1 = 16 positions: 4 blocks, + 2 = 6
    req = greedy("fits", list(range(1, 14)), 4)
    (out,) = engine.generate([req])
    assert len(out) == 4
    engine.sanity_check()


def test_the_step_budget_counts_decode_tokens(tiny_models):
    """max_num_tokens N with d decoding requests: a prefill chunk in the same step gets at most N - d."""
    engine = make_engine(tiny_models["gdn"][0], max_batch=4, max_num_tokens=8, prefill_chunk=16)
    plans = spy_plans(engine)
    engine.submit(greedy("a", [1, 2, 3], 4))
    engine.submit(greedy("b", [4, 5, 6], 4))
    engine.submit(greedy("c", list(range(7, 19)), 2))
    engine.run_until_idle()
    engine.sanity_check()
    seen = [[len(s.token_ids) for s in plan.spans] for plan in plans]
    # by hand: step 1: a and b whole, c gets the 2 left; step 2: two decode tokens, c gets 8 - 2 = 6
    assert seen[0] == [3, 3, 2]
    assert seen[1] == [1, 1, 6]
    assert all(sum(step) <= 8 for step in seen), seen


def test_the_step_capture_cap_defers_a_capture_to_the_next_step(tiny_models):
    """max_step_captures 1 with two prompts ending in one step: the second prompt's chunk stops the token
    before its capture (the memory check counted one captured state), the next step takes it; both stored."""
    engine = make_engine(tiny_models["gdn"][0], max_batch=2, prefill_chunk=16, prompt_only=True,
                         max_step_captures=1)
    plans = spy_plans(engine)
    a, b = greedy("a", list(range(1, 11)), 2), greedy("b", list(range(20, 30)), 2)
    engine.generate([a, b])
    engine.sanity_check()
    # hand-derived: step 1 runs a's 10 tokens (its end at 9 captured) and b's first 8 (its end is at 9);
    # step 2 runs a's decode and b's last 2 tokens, capturing b's end
    first, second = ([(len(s.token_ids), [p for p, _ in s.captures]) for s in plan.spans] for plan in plans[:2])
    assert first == [(10, [9]), (8, [])] and second == [(1, []), (2, [9])]
    assert a.stats.checkpoints_stored == b.stats.checkpoints_stored == 1
    assert max(sum(len(s.captures) for s in plan.spans) for plan in plans) == 1


def test_hits_whose_replays_pass_the_step_budget_wait(tiny_models):
    """A wr replay runs whole in its admission step, and three hits admitted at once ran 24 replay tokens (and
    a prefill token) in a step capped at 20: max_num_tokens, the step size the memory check and warm-up count.
    From a review helper; fails on the old code. Prompt ends only: each 10-token base's checkpoint is at 9, so
    each hit (12 tokens) replays [1, 9) and prefills 3 tokens."""
    from engine_helpers import split_wmax
    path = tiny_models["gdn"][0]
    engine = make_engine(path, wmax=split_wmax(path), policy="wr", replay_window=8, max_num_tokens=20,
                         prefill_chunk=16, prompt_only=True)
    bases = [[10 * i + j for j in range(1, 11)] for i in range(3)]
    engine.generate([greedy(i, b, 1) for i, b in enumerate(bases)])
    plans = spy_plans(engine)
    hits = [greedy(("hit", i), b + [90, 91], 2) for i, b in enumerate(bases)]
    outs = engine.generate(hits)
    engine.sanity_check()
    assert [len(o) for o in outs] == [2, 2, 2] and all(h.stats.replayed_tokens == 8 for h in hits)
    seen = [[(len(s.token_ids), s.replay_into is not None) for s in plan.spans] for plan in plans]
    # by hand: step 1 admits two hits (16 replay tokens; the third's 8 would pass 20), the 4 tokens left go to
    # the first's 3-token prefill and 1 of the second's; step 2: the third's replay, a decode, the rest
    assert seen[0] == [(8, True), (8, True), (3, False), (1, False)]
    assert seen[1] == [(8, True), (1, False), (2, False), (3, False)]
    assert all(sum(n for n, _ in step) <= 20 for step in seen), seen


def test_a_host_hit_that_joins_a_step_later_stays_within_the_step_bound(tiny_models):
    """A host-tier hit beside a decode is admitted in one step (its promotion's copy runs there) and replays in
    the next (`joining`); its replay was fitted to the budget of the admission step, but the next step also
    decodes the requests whose prefill ended in the admission step. Capped at W + 1 = 9 (largest_step: 9): step
    k decodes d and prefills p (5 tokens, its end), admitting the hit; step k+1 replays the hit's 8 and decodes
    d and p: 10 tokens, past the bound the memory check and the MoE warm-up count."""
    from engine_helpers import split_wmax
    from trtllm_dasc.model.workspace import largest_step
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    path = tiny_models["gdn"][0]
    w = split_wmax(path)
    plan, _ = plan_from_path(str(path), PlanOptions(wmax=w, tp=1, placement="off"), conv_dtype="float32")
    sb = plan.bottleneck_slot_bytes()
    engine = make_engine(path, wmax=w, policy="wr", replay_window=8, max_num_tokens=9, prefill_chunk=16,
                         prompt_only=True, state_budget_bytes=3 * sb, host_cache_bytes=8 * sb)
    bases = [[(7 * k + 3 * i + 1) % 50 for i in range(13)] for k in range(4)]
    for i, b in enumerate(bases):
        engine.generate([greedy(i, b, 1)])             # two device slots: bases[0]'s checkpoint goes to the host
    bound = largest_step(engine.cfg, engine.runner.replay_window)
    assert bound.tokens == 9
    d = greedy("d", [60, 61, 62], 12)
    engine.submit(d)
    while not (engine.scheduler.running and not engine.scheduler.running[0].in_prefill):
        engine.step()
    plans = spy_plans(engine)
    hit = greedy("hit", bases[0] + [5, 9], 2)
    engine.submit(greedy("p", [70, 71, 72, 73, 74], 4))
    outs = []
    engine.submit(hit, callback=outs.append)
    engine.run_until_idle()
    engine.sanity_check()
    assert engine.stats()["checkpoint_hits"]["host"] == 1 and hit.stats.replayed_tokens == 8
    sizes = [sum(len(s.token_ids) for s in p.spans) for p in plans]
    assert max(sizes) <= bound.tokens, sizes
    # held back a step longer, the hit gives what the same hit gives alone
    alone = make_engine(path, wmax=w, policy="wr", replay_window=8, prefill_chunk=16, prompt_only=True)
    for i, b in enumerate(bases):
        alone.generate([greedy(i, b, 1)])
    assert [t for o in outs for t in o.token_ids] == alone.generate([greedy("hit", bases[0] + [5, 9], 2)])[0]
