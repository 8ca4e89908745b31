"""Host KV (radix.py invariant 9): a cached prefix's KV blocks demoted to host blocks on KV eviction and
warmed back on a hit, tracked by a content simulation of every device and host block (the reference): each
block row holds the prefix whose KV it was given (a prefill writes its own positions, a copy moves a whole
block, in the order the bookkeeping queued them, before the step's copy-on-write copies, as the runner
does). A hit is correct when every reused position of its table holds exactly its own prefix's row."""
import random

import pytest

from trtllm_dasc.cache import CacheManager

BS = 4


def make(blocks=24, host_kv=64, slots=8, host=16):
    return CacheManager.create(BS, blocks, slots, 4, interval=100, prompt_only=True, host_slots=host,
                               host_kv_blocks=host_kv)


def simulate(m, prompts):
    dev, host = {}, {}                  # block -> {position: prefix}
    device_ck, host_ck = {}, {}
    checked = {"kv": 0, "warm": 0}
    for prompt in prompts:
        lease = m.admit(prompt, len(prompt) + 1)
        assert lease is not None
        captures = m.extend(lease, lease.match.ckpt_len, len(prompt))
        for kind, a, b in m.take_kv_copies():
            if kind == "demote":
                host[b] = dict(dev.get(a, {}))
            else:
                dev[b] = dict(host[a])
                checked["warm"] += 1
        demotions, promotions = m.take_copies()
        for d, h in demotions:
            host_ck[h] = device_ck[d]
        for h, d in promotions:
            device_ck[d] = host_ck[h]
        for src, dst in lease.copies:
            dev[dst] = dict(dev[src])
        c = lease.match.ckpt_len
        if c:
            assert device_ck[lease.match.ckpt_slot] == tuple(prompt[:c])
            for pos in range(c):
                row = dev[lease.table[pos // BS]].get(pos)
                assert row == tuple(prompt[:pos + 1]), f"position {pos} of a hit holds another prefix's KV"
            checked["kv"] += 1
        # the prefill writes its positions into its own blocks
        for pos in range(c, len(prompt)):
            dev.setdefault(lease.table[pos // BS], {})[pos] = tuple(prompt[:pos + 1])
        for pos, slot in captures:
            device_ck[slot] = tuple(prompt[:pos])
        m.store(lease, captures, [True] * len(captures))
        m.insert(lease, prompt)
        m.release(lease)
        m.sanity_check([])
    return checked


def _workload(seed, n=150):
    rng = random.Random(seed)
    roots = [[rng.randrange(50, 99) for _ in range(rng.randrange(5, 11))] for _ in range(12)]
    return [rng.choice(roots) + [rng.randrange(0, 50) for _ in range(rng.randrange(1, 5))] for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_hit_through_host_kv_reads_its_own_prefix(seed):
    m = make()
    checked = simulate(m, _workload(seed))
    kv = m.stats()["kv_tier"]
    assert checked["kv"] > 30 and kv["demoted_nodes"] > 10 and kv["warmed_nodes"] > 5 and checked["warm"] > 0
    # the same workload with no host KV: fewer hits (the tier is what kept the prefixes)
    off = CacheManager.create(BS, 24, 8, 4, interval=100, prompt_only=True, host_slots=16)
    simulate(off, _workload(seed))
    assert m.hits["device"] + m.hits["host"] > off.hits["device"] + off.hits["host"]
    m.evict()
    m.sanity_check([])
    assert m.stats()["host_kv_blocks_free"] == 64 and m.stats()["kv_blocks_free"] == 24


def test_a_small_host_kv_evicts_cold_leaves_and_stays_consistent():
    m = make(host_kv=6)
    simulate(m, _workload(5))
    assert m.stats()["kv_tier"]["host_evictions"] > 0
