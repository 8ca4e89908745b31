"""Eviction accounting across the tiers: every host copy the host tier drops is a host eviction (a flush's too),
and every checkpoint that leaves the cache for good (its last copy in either tier goes) is counted exactly once
in ``checkpoints_dropped``, however many tiers it visited."""
import random

from trtllm_dasc.cache import CacheManager
from trtllm_dasc.serve.metrics import FAMILIES, LABELLED

READ = {name: read for name, _, _, read in FAMILIES} | {name: read for name, _, _, _, read in LABELLED}


def make(slots=2, host=2, **kw):
    return CacheManager.create(4, 64, slots, 4, interval=100, prompt_only=True, host_slots=host, **kw)


def run(m: CacheManager, prompt) -> int:
    """One request through the manager (one chunk, every capture stored); returns the checkpoints it kept."""
    lease = m.admit(prompt, len(prompt))
    assert lease is not None
    caps = m.extend(lease, lease.match.ckpt_len, len(prompt))
    m.take_copies()
    m.store(lease, caps, [True] * len(caps))
    kept = m.insert(lease, prompt)
    m.release(lease)
    m.sanity_check([])
    return kept


def cached(m: CacheManager) -> int:
    """Checkpoints the cache holds in either tier (a node in both tiers is one checkpoint)."""
    return sum(n.ckpt_slot is not None or n.host_slot is not None for n in m.tree._nodes())


A, B, C, D = ([k * 10 + i for i in range(5)] for k in range(1, 5))


def test_a_flush_counts_the_host_copies_it_drops():
    m = make()
    for p in (A, B, C, D):
        run(m, p)                       # A, B on the host alone; C, D on the device
    # A's hit promotes it: in both tiers now (C demoted for its device slot, B's host copy dropped for C's)
    run(m, A[:4] + [9])
    s = m.stats()
    host_before, host_cached = s["checkpoint_host_evictions"], s["host_checkpoints_cached"]
    assert host_before == 1 and host_cached == 2 and cached(m) == 3
    m.evict()
    s = m.stats()
    # the flush dropped both host copies: the host tier evicted them (dasc_host_evictions_total)
    assert s["host_checkpoints_cached"] == 0 and s["checkpoints_cached"] == 0
    assert s["checkpoint_host_evictions"] == host_before + host_cached
    assert READ["dasc_host_evictions_total"](s)["checkpoints"] == host_before + host_cached


def test_each_checkpoint_that_leaves_for_good_counts_once():
    m = make()
    kept = sum(run(m, p) for p in (A, B, C, D))
    run(m, A[:4] + [9])
    assert m.stats()["checkpoints_dropped"] == 1          # B: demoted, then its host copy dropped for C's
    assert cached(m) == 3 and kept == 4
    m.evict()
    # A in both tiers is one checkpoint: 3 more gone, not 4
    assert m.stats()["checkpoints_dropped"] == 4 == kept
    assert READ["dasc_checkpoints_dropped_total"](m.stats()) == 4


def test_a_node_in_both_tiers_lost_with_its_kv_counts_once():
    m = CacheManager.create(4, 8, 2, 4, interval=100, prompt_only=True, host_slots=2, write_policy="write-through")
    run(m, A)                           # device and host (write-through)
    assert cached(m) == 1 and m.stats()["host_checkpoints_cached"] == 1
    run(m, [90 + i for i in range(29)])  # needs every KV block: A's node goes, both copies with it
    assert m.stats()["checkpoints_dropped"] == 1 and m.stats()["evictions"]["checkpoints_with_kv"] == 1


def test_a_failed_demotion_loses_the_checkpoint_once():
    m = make()
    run(m, A)
    run(m, B)
    lease = m.admit(C, len(C))           # C's capture evicts A: its write-back is queued
    caps = m.extend(lease, 0, len(C))
    demotions, promotions = m.take_copies()
    assert demotions and not promotions
    m.copies_failed(demotions, promotions)
    m.store(lease, caps, [True] * len(caps))
    m.insert(lease, C)
    m.release(lease)
    m.sanity_check([])
    # A's device copy went on its eviction, its host copy was never written: gone, once
    assert m.stats()["checkpoints_dropped"] == 1 and cached(m) == 2


def test_random_traffic_conserves_checkpoints():
    """Kept checkpoints = cached + dropped, and every tier's copies balance, through evictions in both tiers,
    promotions, losses with KV, flushes and failed copies."""
    rng = random.Random(3)
    for policy in ("write-back", "write-through"):
        m = CacheManager.create(4, 40, 3, 4, interval=8, host_slots=4, write_policy=policy)
        prefixes = [[rng.randrange(30) for _ in range(rng.randrange(3, 20))] for _ in range(5)]
        kept = 0
        for i in range(400):
            op = rng.random()
            if op < 0.03:
                m.evict()
            elif op < 0.1:
                # one request whose tier copies all fail (the step failed)
                p = rng.choice(prefixes)[:rng.randrange(1, 20)] + [rng.randrange(30)]
                lease = m.admit(p, len(p))
                if lease is not None:
                    m.copies_failed(*m.take_copies())
                    m.release(lease)
            else:
                base = rng.choice(prefixes)
                kept += run(m, base[:rng.randrange(0, len(base) + 1)] + [rng.randrange(30) for _ in range(3)])
            m.sanity_check([])
            assert kept == cached(m) + m.stats()["checkpoints_dropped"], (policy, i)
        assert m.stats()["checkpoints_dropped"] > 20


def test_a_capture_where_the_host_tier_holds_the_checkpoint_is_no_new_one():
    """Two requests of one prompt run together (both miss): the first's checkpoint is demoted to make room for
    the second's capture at the same position, so that capture lands on a node the host tier already holds.
    It becomes the node's device copy (a free promotion), not a second checkpoint: kept once, counted once."""
    m = make(slots=1, host=2)
    first, second = m.admit(A, len(A)), m.admit(A, len(A))
    caps = m.extend(first, 0, len(A))
    m.store(first, caps, [True] * len(caps))
    assert m.insert(first, A) == 1
    m.release(first)
    # the second's capture takes the only device slot: the first's checkpoint goes to the host
    caps = m.extend(second, 0, len(A))
    m.take_copies()
    m.store(second, caps, [True] * len(caps))
    assert m.insert(second, A) == 0
    m.release(second)
    m.sanity_check([])
    (node,) = [n for n in m.tree._nodes() if n.host_slot is not None]
    assert node.ckpt_slot is not None            # in both tiers: the capture kept as its device copy
    assert cached(m) == 1 and m.stats()["checkpoints_dropped"] == 0
    m.evict()
    assert m.stats()["checkpoints_dropped"] == 1
