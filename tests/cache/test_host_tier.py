"""The host tier of checkpoints and cost-aware eviction, scripted with exact slot ids and eviction order."""
import pytest

from trtllm_dasc.cache import BlockPool, CacheManager, IdPool, RadixCache
from trtllm_dasc.cache.manager import undefined


def make(slots=2, host=2, eviction="lru", **kw):
    return CacheManager.create(4, 64, slots, 4, interval=100, prompt_only=True, host_slots=host, eviction=eviction, **kw)


def run(m: CacheManager, prompt, expect_cached=None):
    """One request through the manager's API (prefill in one chunk, every capture stored); returns the
    lease's match and the copies its admission and prefill queued."""
    lease = m.admit(prompt, len(prompt))
    assert lease is not None
    captures = m.extend(lease, lease.match.ckpt_len, len(prompt))
    copies = m.take_copies()
    m.store(lease, captures, [True] * len(captures))
    m.insert(lease, prompt)
    if expect_cached is not None:
        assert lease.match.ckpt_len == expect_cached
    match = lease.match
    m.release(lease)
    m.sanity_check([])
    return match, copies


def node_at(m, prompt, end):
    node, pos = m.tree.root, 0
    while pos < end:
        node = node.children[prompt[pos]]
        pos = node.end
    assert node.end == end
    return node


A, B, C, D, E = ([k * 10 + i for i in range(5)] for k in range(1, 6))


def test_device_eviction_demotes_host_eviction_drops_and_a_host_hit_promotes():
    m = make()
    assert run(m, A)[1] == ([], [])
    assert run(m, B)[1] == ([], [])                  # A in device slot 1, B in slot 2
    # C needs a slot: A (LRU) is written back to host slot 0 and its device slot 1 goes to C
    assert run(m, C)[1] == ([(1, 0)], [])
    a = node_at(m, A, 4)
    assert (a.ckpt_slot, a.host_slot) == (None, 0)
    assert run(m, D)[1] == ([(2, 1)], [])            # B -> host 1, D in slot 2
    # E: C (device 1) must go to the host, which is full: its LRU copy (A's) is dropped for it
    assert run(m, E)[1] == ([(1, 0)], [])
    assert m.tree.tier == {"demotions": 3, "demotion_copies": 3, "promotions": 0, "host_evictions": 1,
                           "write_through_copies": 0}
    assert m.stats()["host_checkpoints_cached"] == 2 and m.stats()["checkpoints_cached"] == 2
    # C lives on the host alone; a hit on it locks it, then promotes it: a device slot is made by evicting
    # D (LRU, slot 2), whose write-back takes the host's LRU unlocked copy's slot (B's, 1; C's is locked)
    c = node_at(m, C, 4)
    assert (c.ckpt_slot, c.host_slot) == (None, 0)
    match, copies = run(m, C + [98], expect_cached=4)
    # then the prefill's checkpoint at 5 evicts E (slot 1) into host slot 1 again, dropping D's copy
    # queued the line before: the copies run in order, so host slot 1 ends up holding E's bytes
    assert copies == ([(2, 1), (1, 1)], [(0, 2)]) and match.ckpt_slot == 2
    assert (c.ckpt_slot, c.host_slot) == (2, 0)                  # in both tiers now
    assert node_at(m, E, 4).host_slot == 1 and node_at(m, C + [98], 5).ckpt_slot == 1
    assert m.hits == {"device": 0, "host": 1} and m.hit_tokens == {"device": 0, "host": 4}
    assert m.tree.tier == {"demotions": 5, "demotion_copies": 5, "promotions": 1, "host_evictions": 3,
                           "write_through_copies": 0}
    # a checkpoint in both tiers leaves the device without a copy: its host copy is already there
    assert run(m, [70, 71, 72])[1] == ([], [])
    assert (c.ckpt_slot, c.host_slot) == (None, 0)
    assert m.tree.tier["demotions"] == 6 and m.tree.tier["demotion_copies"] == 5
    assert m.stats()["checkpoint_bytes"] == {"device": 2, "host": 2}


def test_flush_empties_both_tiers_but_keeps_what_a_request_locked():
    m = make()
    for p in (A, B, C, D):
        run(m, p)
    lease = m.admit(A[:4] + [7, 8], 6)            # A is host-only: promoted and locked
    assert lease.match.ckpt_len == 4 and m.hits["host"] == 1
    m.evict()
    m.sanity_check([lease])
    a = node_at(m, A, 4)
    assert a.ckpt_slot is not None and m.stats()["checkpoints_cached"] == 1
    m.take_copies()
    m.release(lease)
    m.evict()
    m.sanity_check([])
    assert m.stats()["host_checkpoints_cached"] == 0 and m.stats()["checkpoints_cached"] == 0
    assert m.tree.host_slots.num_free == 2


def test_a_failed_steps_copies_drop_what_they_were_to_write():
    m = make()
    for p in (A, B, C):
        run(m, p)                                 # A on the host only
    lease = m.admit(A + [5], 6)
    demotions, promotions = m.take_copies()
    assert promotions and demotions               # B demoted to make room for A's promotion
    m.copies_failed(demotions, promotions)
    m.release(lease)
    m.sanity_check([])
    a, b = node_at(m, A, 4), node_at(m, B, 4)
    # A keeps its host copy (the source), loses the device copy the failed promotion was to write;
    # B's host copy was never written: dropped
    assert (a.ckpt_slot, a.host_slot) == (None, 0) and (b.ckpt_slot, b.host_slot) == (None, None)


def test_promotion_without_a_free_device_slot_is_a_miss():
    m = make(slots=1)
    run(m, A)
    run(m, B)                                     # A on the host, B in the only device slot
    hold = m.admit(B + [1], 6)                    # locks B's device checkpoint
    lease = m.admit(A + [2], 6)
    assert lease.match.ckpt_len == 0 and m.take_copies() == ([], [])
    m.release(lease)
    m.release(hold)
    m.sanity_check([])


def test_cost_eviction_order_by_hand():
    # three checkpoints at positions 8, 3 and 2; stamps set to 0, 5 and 10 (recency 0, 0.5, 1)
    c = RadixCache(4, BlockPool(32), IdPool.checkpoint_slots(3), interval=100, prompt_only=True, eviction="cost",
                   flops_per_token=7.0, slot_bytes=3)
    prompts = {8: list(range(100, 109)), 3: list(range(200, 204)), 2: list(range(300, 303))}
    nodes = {}
    for stamp, end in zip((0, 5, 10), (8, 3, 2)):
        p = prompts[end]
        slot = c.alloc_slot()
        table = c.blocks.alloc(-(-len(p) // 4))
        c.insert(p, table, {end: slot})
        c.blocks.decref(table)
        nodes[end] = next(n for n in c._nodes() if n.end == end and n.ckpt_slot is not None)
        nodes[end].ckpt_access = stamp
    c.sanity_check()
    # value = end * 7 / 3: efficiency normalised by the largest (end 8): 1, 3/8, 2/8
    # scores (recency + efficiency): end 8: 0 + 1 = 1; end 3: 0.5 + 0.375 = 0.875; end 2: 1 + 0.25 = 1.25
    # first victim: end 3. Then {8: 0 + 1 = 1, 2: 1 + 0.25 = 1.25}: end 8. LRU would take 8, 3, 2.
    order = []
    for _ in range(3):
        before = {e: n.ckpt_slot for e, n in nodes.items()}
        assert c._evict_checkpoint()
        order += [e for e, n in nodes.items() if before[e] is not None and n.ckpt_slot is None]
    assert order == [3, 8, 2]
    assert c.value(nodes[8]) == pytest.approx(8 * 7 / 3)


def test_cost_eviction_without_host_keeps_lru_behaviour_off_by_default():
    m = CacheManager.create(4, 64, 2, 4, interval=100, prompt_only=True)
    assert m.tree.eviction == "lru" and m.tree.host_slots is None
    for p in (A, B, C):
        run(m, p)
    assert m.take_copies() == ([], []) and node_at(m, A, 4).ckpt_slot is None
    assert m.stats()["host_checkpoint_slots"] == 0 and m.tree.tier["demotions"] == 0


def _marconi_order(ends, stamps, per_token, per_pair):
    """Marconi's eviction order recomputed by brute force: min of recency + efficiency, each normalised over
    the candidates left, efficiency = prefill FLOPs of the prefix (linear + attention pairs) per slot."""
    left, out = list(zip(ends, stamps)), []
    while left:
        lo, hi = min(s for _, s in left), max(s for _, s in left)
        values = [e * per_token + per_pair * e * (e + 1) / 2 for e, _ in left]
        scores = [((s - lo) / (hi - lo) if hi > lo else 0.0) + v / max(values) for (_, s), v in zip(left, values)]
        out.append(left.pop(scores.index(min(scores)))[0])
    return out


@pytest.mark.parametrize("per_pair", [0.0, 7.0])
def test_cost_eviction_weighs_the_attention_a_long_prefix_saves(per_pair):
    # the attention term (model/prefill_flops.py) makes a long prefix worth more than its length: with it the
    # 6-token checkpoint goes before the older 10-token one; by length alone the order is LRU's here
    ends, stamps = (10, 6, 2), (0, 5, 10)
    c = RadixCache(4, BlockPool(32), IdPool.checkpoint_slots(3), interval=100, prompt_only=True, eviction="cost",
                   flops_per_token=7.0, flops_per_pair=per_pair, slot_bytes=3)
    nodes = {}
    for stamp, end in zip(stamps, ends):
        p = list(range(100 * end, 100 * end + end + 1))
        slot, table = c.alloc_slot(), c.blocks.alloc(-(-len(p) // 4))
        c.insert(p, table, {end: slot})
        c.blocks.decref(table)
        nodes[end] = next(n for n in c._nodes() if n.end == end and n.ckpt_slot is not None)
        nodes[end].ckpt_access = stamp
    order = []
    for _ in range(3):
        before = {e: n.ckpt_slot for e, n in nodes.items()}
        assert c._evict_checkpoint()
        order += [e for e, n in nodes.items() if before[e] is not None and n.ckpt_slot is None]
    assert order == _marconi_order(ends, stamps, 7.0, per_pair)
    assert order == ([6, 10, 2] if per_pair else [10, 6, 2])


def test_a_failed_demotion_fails_the_promotion_that_reads_it():
    """One step promotes A (evicting B: its write-back to host slot 1) and then B from host slot 1. The
    write-back fails: B's promotion read nothing, so B's lease is named and both of B's copies dropped; A's
    promotion read an intact host copy and stays."""
    m = make()
    for p in (A, B, C):
        run(m, p)                                 # A on the host (slot 0), B in device slot 2, C in slot 1
    la, lb = m.admit(A + [5], 6), m.admit(B + [6], 6)
    demotions, promotions = m.take_copies()
    assert (demotions, promotions) == ([(2, 1)], [(0, 2), (1, 1)])
    assert m.copies_failed(demotions, promotions, failed=[True, False, False], leases=[la, lb]) == {lb: 0}
    a, b = node_at(m, A, 4), node_at(m, B, 4)
    assert (a.ckpt_slot, a.host_slot) == (2, 0) and (b.ckpt_slot, b.host_slot) == (None, None)
    m.release(la)
    m.release(lb)
    m.sanity_check([])


def test_a_later_copy_into_a_failed_copys_destination_defines_it_again():
    assert undefined([("demote", 1, 0), ("demote", 2, 0)], [True, False]) == {}
    assert undefined([("demote", 1, 0), ("promote", 0, 3), ("demote", 4, 0)], [True, False, False], offset=5) == {
        ("device", 3): 5}
    assert undefined([("promote", 0, 3), ("promote", 1, 3)], [False, True]) == {("device", 3): 1}
