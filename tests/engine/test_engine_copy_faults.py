"""A copy between the tiers that fails (raises when the runner queues it) fails only the requests that read
what it was to write, never the rest of the step; the cache drops what it left undefined and stays whole
(CPU: plain host memory, the deferred reference stream). Dense (--wmax 0), so every completed request must
give transformers' own greedy tokens, what the same run without the fault gives."""
import pytest

from engine_helpers import greedy, reference_greedy
from test_engine_host_tier import HIT, N, PROMPTS, engine

from trtllm_dasc.engine.engine import RequestFailed

# a request that decodes beside the faulty step (test_engine_host_tier's joining test runs it fault-free)
OTHER = [3, 1, 4, 1, 5, 9, 2]


def fault(monkeypatch, tier, to_host: bool, times: int | None = None) -> list:
    """The tier's copies in one direction raise when queued (the first ``times``, or all); returns the
    (device, host) ids of those that failed."""
    real, failed = tier._copy, []

    def copy(up, d, h):
        if up == to_host and (times is None or len(failed) < times):
            failed.append((d, h))
            raise RuntimeError("copy fault")
        return real(up, d, h)
    monkeypatch.setattr(tier, "_copy", copy)
    return failed


def node(e, prompt, end):
    """The tree node ending at ``end`` on ``prompt``'s path (None when the prefix is gone)."""
    n, pos = e.scheduler.cache.root, 0
    while pos < end:
        n = n.children.get(prompt[pos])
        if n is None:
            return None
        pos = n.end
    return n if n.end == end else None


def served(e, n=1):
    for i, p in enumerate(PROMPTS[:n]):
        e.generate([greedy(i, p, 1)])


def hit_beside_a_decode(e, tier, monkeypatch):
    """A request starts decoding, then ``tier``'s copies to the device start failing and the hit arrives: its
    copies land in steps the decoding request shares. Returns (the two requests' outputs, the failed copies)."""
    outs = []
    e.submit(greedy("dec", OTHER, 6), callback=outs.append)
    e.step()
    failed = fault(monkeypatch, tier, to_host=False)
    e.submit(greedy("hit", HIT, N), callback=outs.append)
    return outs, failed


def test_a_failing_promotion_fails_the_held_back_hit_alone(tiny_models, monkeypatch):
    """The hit is held back (a request decodes): its promotion is queued in a step where it has no span.
    That copy fails: the hit fails, the decoding request runs on with its fault-free tokens."""
    path, hf = tiny_models["gdn"]
    e = engine(path, 2, host_slots=8)
    served(e, 4)
    outs, failed = hit_beside_a_decode(e, e.runner.host_tier, monkeypatch)
    e.step()
    e.sanity_check()
    assert failed and [s.rid for s in e.scheduler.running] == ["dec"]
    (end,) = [o for o in outs if o.finished]
    assert end.request_id == "hit" and end.finish_reason == "error"
    assert "host tier copy failed (checkpoint promotion, host slot" in end.error and "copy fault" in end.error
    # no device slot claims the checkpoint; its host copy (the intact source) stays
    ck = node(e, HIT, 12)
    assert ck.ckpt_slot is None and ck.host_slot is not None
    e.run_until_idle()
    e.sanity_check()
    assert [o.request_id for o in outs if o.error] == ["hit"]
    assert [t for o in outs if o.request_id == "dec" for t in o.token_ids] == reference_greedy(hf, OTHER, 6)
    # counted by kind (the metric dasc_tier_copy_failures_total reads it)
    assert e.stats()["tier_copy_failures"] == {"checkpoint_demotion": 0, "checkpoint_promotion": 1,
                                               "kv_demotion": 0, "kv_warm_back": 0}
    monkeypatch.undo()
    # the same prompt again hits the host copy, promoted this time, and gives the uncached run's tokens
    again, uncached = greedy("again", HIT, N), greedy("uncached", HIT, N, use_cache=False)
    assert e.generate([again]) == e.generate([uncached]) == [reference_greedy(hf, HIT, N)]
    assert again.stats.cached_tokens == 12 and uncached.stats.cached_tokens == 0
    e.sanity_check()
    # nothing leaked: a flush empties both tiers
    e.flush()
    st = e.stats()
    assert st["checkpoints_cached"] == st["host_checkpoints_cached"] == 0
    assert st["host_checkpoint_slots_free"] == st["host_checkpoint_slots"]
    assert st["checkpoint_slots_free"] == st["checkpoint_slots"]


def test_a_failing_promotion_fails_its_request_and_leaks_nothing(tiny_models, monkeypatch):
    """Nothing decodes, so the hit loads in the step of its promotion: it fails, the retry hits the host again."""
    path, hf = tiny_models["gdn"]
    e = engine(path, 2, host_slots=8)
    served(e, 4)
    fault(monkeypatch, e.runner.host_tier, to_host=False)
    with pytest.raises(RequestFailed, match="host tier copy failed .*copy fault"):
        e.generate([greedy("hit", HIT, N)])
    e.sanity_check()
    monkeypatch.undo()
    req = greedy("again", HIT, N)
    assert e.generate([req]) == [reference_greedy(hf, HIT, N)]
    e.sanity_check()
    assert req.stats.cached_tokens == 12 and e.stats()["checkpoint_hits"]["host"] == 2


def test_a_failing_demotion_fails_no_request_and_leaves_no_host_copy(tiny_models, monkeypatch):
    """Two device slots: the third prompt's capture evicts PROMPTS[0]'s checkpoint (and the decoding
    request's, PROMPTS[1]'s), whose write-backs fail. No request reads a demotion's bytes (only a later
    promotion would), so both requests of that step complete; the host holds no copy it never got."""
    path, hf = tiny_models["gdn"]
    e = engine(path, 2, host_slots=8)
    served(e, 2)
    failed = fault(monkeypatch, e.runner.host_tier, to_host=True)
    assert e.generate([greedy(2, PROMPTS[2], 3), greedy("dec", OTHER, 4)]) == [
        reference_greedy(hf, PROMPTS[2], 3), reference_greedy(hf, OTHER, 4)]
    e.sanity_check()
    assert len(failed) == 2 and e.stats()["host_checkpoints_cached"] == 0
    assert e.stats()["tier_copy_failures"]["checkpoint_demotion"] == 2
    assert all((node(e, p, 12).ckpt_slot, node(e, p, 12).host_slot) == (None, None) for p in PROMPTS[:2])
    monkeypatch.undo()
    # the prefix's checkpoint is gone from both tiers: a miss, computed right
    req = greedy("hit", HIT, N)
    assert e.generate([req]) == [reference_greedy(hf, HIT, N)] and req.stats.cached_tokens == 0
    e.sanity_check()


def test_a_failing_write_through_keeps_the_device_checkpoint(tiny_models, monkeypatch):
    """Write-through copies PROMPTS[0]'s checkpoint in the step after its insert (the next request's): that
    copy fails. The request that stored it had finished (its tokens never depend on the host copy) and the
    next one completes; the host copy is dropped, the device one stays, and its eviction later writes it
    back like write-back would, so the hit comes from the host, exact."""
    path, hf = tiny_models["gdn"]
    e = engine(path, 2, host_slots=8, host_write_policy="write-through")
    served(e, 1)
    failed = fault(monkeypatch, e.runner.host_tier, to_host=True, times=1)
    assert e.generate([greedy(1, PROMPTS[1], 3)]) == [reference_greedy(hf, PROMPTS[1], 3)]
    e.sanity_check()
    ck = node(e, PROMPTS[0], 12)
    assert failed and ck.ckpt_slot is not None and ck.host_slot is None
    assert node(e, PROMPTS[1], 12).host_slot is not None           # its own write-through, after the fault
    monkeypatch.undo()
    for i, p in enumerate(PROMPTS[2:], 2):
        e.generate([greedy(i, p, 1)])
    assert e.stats()["checkpoint_demotion_copies"] == 1            # PROMPTS[0]'s, at its eviction
    req = greedy("hit", HIT, N)
    assert e.generate([req]) == [reference_greedy(hf, HIT, N)]
    assert req.stats.cached_tokens == 12 and e.stats()["checkpoint_hits"]["host"] == 1
    e.sanity_check()


def test_a_failing_kv_warm_back_fails_its_hit_alone(tiny_models, monkeypatch):
    """Ten KV blocks: PROMPTS[0]'s KV went to host KV; a hit warms it back beside a decoding request, and
    those copies fail. The hit fails, the decoding request completes; the warmed prefix is dropped."""
    path, hf = tiny_models["gdn"]
    e = engine(path, 8, num_kv_blocks=10, host_kv_blocks=64)
    served(e, 4)
    assert node(e, PROMPTS[0], 12).cold
    outs, failed = hit_beside_a_decode(e, e.runner.kv_tier, monkeypatch)
    e.run_until_idle()
    e.sanity_check()
    assert failed and [(o.request_id, o.error[:40]) for o in outs if o.error] == [
        ("hit", "host tier copy failed (KV warm-back, hos")]
    assert [t for o in outs if o.request_id == "dec" for t in o.token_ids] == reference_greedy(hf, OTHER, 6)
    assert node(e, PROMPTS[0], 12) is None
    kinds = e.stats()["tier_copy_failures"]
    assert kinds["kv_warm_back"] == len(failed) and kinds["checkpoint_promotion"] == kinds["kv_demotion"] == 0
    monkeypatch.undo()
    # the prefix is recomputed, correctly
    req = greedy("again", HIT, N)
    assert e.generate([req]) == [reference_greedy(hf, HIT, N)] and req.stats.cached_tokens == 0
    e.sanity_check()


def test_a_failing_kv_demotion_fails_no_request_and_drops_the_prefix(tiny_models, monkeypatch):
    """The third and fourth prompts evict the first two's KV to host KV, and those copies fail: they
    complete; the cold prefixes (host blocks never written) are dropped, so the hit is a miss."""
    path, hf = tiny_models["gdn"]
    e = engine(path, 8, num_kv_blocks=10, host_kv_blocks=64)
    served(e, 2)
    failed = fault(monkeypatch, e.runner.kv_tier, to_host=True)
    assert e.generate([greedy(i, p, 2) for i, p in enumerate(PROMPTS[2:], 2)]) == [
        reference_greedy(hf, p, 2) for p in PROMPTS[2:]]
    e.sanity_check()
    assert failed and node(e, PROMPTS[0], 12) is None and e.stats()["host_kv_blocks_free"] == 64
    assert e.stats()["tier_copy_failures"]["kv_demotion"] == len(failed)
    monkeypatch.undo()
    req = greedy("hit", HIT, N)
    assert e.generate([req]) == [reference_greedy(hf, HIT, N)] and req.stats.cached_tokens == 0
    e.sanity_check()
