"""The host tier through the whole engine (CPU: plain host memory, synchronous copies): a hit served from
the host gives what the same hit from the device gives, and (dense) what no cache gives."""
import pytest
import torch

from engine_helpers import VOCAB, greedy, make_engine, reference_greedy, split_wmax

from trtllm_dasc.errors import UserError
from trtllm_dasc.plan import PlanOptions, plan_from_path

N = 3
# four prompts of distinct first tokens (prompt_only: one checkpoint each, at len - 1)
PROMPTS = [[(7 * k + 3 * i + 1) % VOCAB for i in range(13)] for k in range(4)]
HIT = PROMPTS[0] + [5, 9]                         # reuses PROMPTS[0]'s checkpoint at 12


def engine(path, slots, host_slots=0, **over):
    # budgets in the arm's own slots (a dasc slot is smaller than a dense one)
    plan, _ = plan_from_path(str(path), PlanOptions(wmax=over.get("wmax", 0), tp=1, placement="off"), conv_dtype="float32")
    sb = plan.bottleneck_slot_bytes()
    kw = dict(prompt_only=True, state_budget_bytes=(slots + 1) * sb, host_cache_bytes=host_slots * sb)
    kw.update(over)
    return make_engine(path, **kw)


def serve(e, use_cache=True):
    """Every prompt, then the hit, one at a time; returns the hit's tokens, context logits and stats."""
    for i, p in enumerate(PROMPTS):
        e.generate([greedy(i, p, 1)])
        e.sanity_check()
    req = greedy("hit", HIT, N, return_context_logits=True, use_cache=use_cache)
    outs = []
    e.submit(req, callback=outs.append)
    e.run_until_idle()
    e.sanity_check()
    assert not any(o.error for o in outs)
    logits = next(o.context_logits for o in outs if o.context_logits is not None)
    return [t for o in outs for t in o.token_ids], req.stats, e.stats(), logits


@pytest.mark.parametrize("wmax,policy", [(0, "write-back"), ("split", "write-back"), (0, "write-through")])
def test_a_host_hit_equals_a_device_hit_and_no_cache(tiny_models, wmax, policy):
    path, hf = tiny_models["gdn"]
    w = split_wmax(path) if wmax == "split" else 0
    # two device slots: PROMPTS[0]'s checkpoint is demoted by the third and fourth prompts
    host_out, host_req, st, host_logits = serve(engine(path, 2, host_slots=8, wmax=w, host_write_policy=policy))
    assert st["checkpoint_hits"] == {"device": 0, "host": 1} and st["checkpoint_promotions"] == 1
    assert st["checkpoint_demotions"] >= 2 and st["host_checkpoints_cached"] >= 2
    # write-back copies on eviction; write-through copied every checkpoint when stored, never on eviction
    copies = st["checkpoint_demotion_copies"], st["checkpoint_write_through_copies"]
    assert copies[policy == "write-back"] == 0 and copies[policy != "write-back"] >= 2
    assert host_req.cached_tokens == 12
    # the same hit from the device tier (slots for everything, no host tier)
    dev_out, dev_req, st, dev_logits = serve(engine(path, 8, wmax=w))
    assert st["checkpoint_hits"] == {"device": 1, "host": 0} and dev_req.cached_tokens == 12
    assert host_out == dev_out
    assert host_logits.shape[0] == len(HIT) - 12
    # the same encoded bytes loaded into the same computation
    torch.testing.assert_close(host_logits, dev_logits, rtol=0, atol=1e-6)
    if w == 0 and policy == "write-back":
        # with the tier off and too few slots, the checkpoint is gone: a miss
        _, miss_req, st, _ = serve(engine(path, 2))
        assert miss_req.cached_tokens == 0 and st["checkpoint_hits"]["host"] == 0
        # dense: a hit is exact, so it gives what transformers' own greedy decoding gives, and the uncached
        # run's logits at the positions the hit computes
        assert host_out == reference_greedy(hf, HIT, N)
        _, ref_req, _, ref = serve(engine(path, 8), use_cache=False)
        assert ref_req.cached_tokens == 0
        torch.testing.assert_close(host_logits, ref[12:], rtol=1e-4, atol=1e-4)


def test_a_host_budget_below_one_checkpoint_is_a_one_line_error(tiny_models):
    path, _ = tiny_models["gdn"]
    with pytest.raises(UserError, match=r"host cache of 1 B holds no checkpoint: one takes \d+ B"):
        make_engine(path, prompt_only=True, host_cache_bytes=1)
    with pytest.raises(UserError, match="host_write_policy must be one of write-back|write-through"):
        make_engine(path, host_write_policy="write-around")


def test_an_abort_after_the_promotion_leaks_nothing(tiny_models):
    path, _ = tiny_models["gdn"]
    e = engine(path, 2, host_slots=8, prefill_chunk=1)
    for i, p in enumerate(PROMPTS):
        e.generate([greedy(i, p, 1)])
    e.submit(greedy("hit", HIT + list(range(6)), N))
    assert e.step()                               # admitted: promoted, loaded, one token prefilled
    assert e.stats()["checkpoint_promotions"] == 1 and e.scheduler.running
    e.sanity_check()
    e.abort("hit")
    while e.step():
        pass
    e.sanity_check()
    assert not e.scheduler.running
    # nothing locked: a flush empties both tiers
    e.flush()
    st = e.stats()
    assert st["checkpoints_cached"] == st["host_checkpoints_cached"] == 0
    assert st["host_checkpoint_slots_free"] == st["host_checkpoint_slots"] == 8


def test_a_host_hit_joins_the_batch_after_its_copy_overlapped_a_step(tiny_models):
    """A host hit admitted while another request decodes: the step that admits it queues the promotion
    and runs the decode without waiting for the copy (the CPU reference stream still holds it); the next
    step loads (waiting for the copy) and prefills it. Both get transformers' own greedy tokens."""
    path, hf = tiny_models["gdn"]
    e = engine(path, 2, host_slots=8)
    for i, p in enumerate(PROMPTS):
        e.generate([greedy(i, p, 1)])
    tier = e.runner.host_tier
    other = [3, 1, 4, 1, 5, 9, 2]
    outs = {"dec": [], "hit": []}
    e.submit(greedy("dec", other, 6), callback=outs["dec"].append)
    e.step()                                         # dec: prefilled, first token
    e.submit(greedy("hit", HIT, N), callback=outs["hit"].append)
    e.step()
    hit = next(s for s in e.scheduler.running if s.rid == "hit")
    assert e.stats()["checkpoint_promotions"] == 1 and hit.joining is not None
    assert hit.done_tokens == 12 and tier.stream.queue          # no span yet, the copy not yet run
    e.sanity_check()
    e.step()
    assert hit.joining is None and hit.done_tokens == len(HIT) and not tier.stream.queue
    e.run_until_idle()
    e.sanity_check()
    got = {k: [t for o in v for t in o.token_ids] for k, v in outs.items()}
    assert got["hit"] == reference_greedy(hf, HIT, N) and got["dec"] == reference_greedy(hf, other, 6)
    assert hit.req.stats.cached_tokens == 12


@pytest.mark.parametrize("device_ckpt", [True, False])
def test_a_hit_on_a_prefix_whose_kv_went_to_the_host_is_exact(tiny_models, device_ckpt):
    """Ten KV blocks: the third and fourth prompts evict PROMPTS[0]'s KV. With host KV its blocks (and
    checkpoint: on the device, or demoted too) wait on the host; the hit warms them back and gives
    transformers' greedy tokens and the uncached run's logits (dense, --wmax 0)."""
    path, hf = tiny_models["gdn"]
    slots, host = (8, 0) if device_ckpt else (2, 8)
    out, req, st, logits = serve(engine(path, slots, host_slots=host, num_kv_blocks=10, host_kv_blocks=64))
    assert st["kv_tier"]["demoted_nodes"] >= 2 and st["kv_tier"]["warmed_nodes"] >= 1
    assert req.cached_tokens == 12 and st["checkpoint_hits"]["host" if host else "device"] == 1
    assert out == reference_greedy(hf, HIT, N)
    _, ref_req, _, ref = serve(engine(path, 8), use_cache=False)
    torch.testing.assert_close(logits, ref[12:], rtol=1e-4, atol=1e-4)
    if device_ckpt:
        # without host KV the prefix is gone: a miss
        _, miss_req, _, _ = serve(engine(path, 8, num_kv_blocks=10))
        assert miss_req.cached_tokens == 0


def test_reset_stats_zeroes_the_tier_copy_bytes_with_the_copy_counts(tiny_models):
    """reset_stats (warm-up ends with it) zeroed the cache's copy counters but not the host tier's copy bytes and
    seconds: after warm-up the engine said 0 demotions and 324,864 B copied to the host. Now both start from zero,
    and bytes stay copies x slot bytes. From a review helper; fails on the old code."""
    path, _ = tiny_models["gdn"]
    plan, _ = plan_from_path(str(path), PlanOptions(wmax=0, tp=1, placement="off"), conv_dtype="float32")
    sb = plan.bottleneck_slot_bytes()
    e = engine(path, 2, host_slots=8)

    def copies(st):
        return st["checkpoint_demotion_copies"] + st["checkpoint_write_through_copies"]
    for i, p in enumerate(PROMPTS):
        e.generate([greedy(i, p, 1)])
    st = e.stats()
    assert copies(st) > 0 and st["host_tier"]["copy_bytes"]["to_host"] == copies(st) * sb
    e.reset_stats()
    st = e.stats()
    assert copies(st) == 0 and st["host_tier"]["copy_bytes"] == {"to_host": 0, "to_device": 0}
    assert st["host_tier"]["copy_seconds"] == 0.0
    e.generate([greedy(9, [(11 * 9 + k) % VOCAB for k in range(13)], 1)])
    st = e.stats()
    assert copies(st) > 0 and st["host_tier"]["copy_bytes"]["to_host"] == copies(st) * sb
