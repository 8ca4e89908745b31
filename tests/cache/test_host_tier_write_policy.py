"""Write-back and write-through host tiers: scripted copies, and a content simulation of every slot.

The simulation is the reference: each device and host slot holds the prefix whose state it was last given
(a store writes its capture's prefix, a copy moves what its source holds, in the order queued, before the
step's loads and stores, as the runner does). A hit is correct when its device slot holds exactly the
matched prefix; a write-through tier must never need a copy on a device eviction."""
import random

import pytest

from trtllm_dasc.cache import CacheManager

# one request through admit / extend / store / insert / release, and the tree node ending at a position
from test_host_tier import node_at, run  # noqa: E402


def make(slots=2, host=3, policy="write-through"):
    return CacheManager.create(4, 256, slots, 4, interval=100, prompt_only=True, host_slots=host,
                               write_policy=policy)


A, B, C = ([k * 10 + i for i in range(5)] for k in range(1, 4))


def test_write_through_copies_at_store_time_and_an_eviction_copies_nothing():
    m = make()
    assert run(m, A)[1] == ([], [])
    # A's checkpoint (device slot 1) went to host slot 0 when it was inserted: the next step copies it
    assert run(m, B)[1] == ([(1, 0)], [])
    a = node_at(m, A, 4)
    assert (a.ckpt_slot, a.host_slot) == (1, 0)
    # C evicts A from the device: no copy for it (B's write-through is the only one)
    assert run(m, C)[1] == ([(2, 1)], [])
    assert (a.ckpt_slot, a.host_slot) == (None, 0)
    assert m.tree.tier == {"demotions": 1, "demotion_copies": 0, "promotions": 0, "host_evictions": 0,
                           "write_through_copies": 3}
    # a hit on A promotes it from its host slot
    match, copies = run(m, A + [9])
    assert match.ckpt_len == 4 and copies[1] == [(0, match.ckpt_slot)]
    assert m.hits == {"device": 0, "host": 1} and m.stats()["host_write_policy"] == "write-through"


def test_a_bad_policy_is_refused():
    with pytest.raises(ValueError, match="write_policy must be one of write-back|write-through"):
        make(policy="write-around")


def _workload(seed, n=120):
    rng = random.Random(seed)
    roots = [[rng.randrange(50, 99) for _ in range(rng.randrange(3, 9))] for _ in range(10)]
    return [rng.choice(roots) + [rng.randrange(0, 50) for _ in range(rng.randrange(1, 4))] for _ in range(n)]


def simulate(m, prompts):
    """Every prompt through the manager, with each slot's contents tracked; returns the hits checked."""
    device, host, checked = {}, {}, 0
    for prompt in prompts:
        lease = m.admit(prompt, len(prompt) + 1)
        captures = m.extend(lease, lease.match.ckpt_len, len(prompt))
        demotions, promotions = m.take_copies()
        for d, h in demotions:
            host[h] = device[d]
        for h, d in promotions:
            device[d] = host[h]
        c = lease.match.ckpt_len
        if c:
            assert device[lease.match.ckpt_slot] == tuple(prompt[:c]), "a hit loads another prefix's state"
            checked += 1
        for pos, slot in captures:
            device[slot] = tuple(prompt[:pos])
        m.store(lease, captures, [True] * len(captures))
        m.insert(lease, prompt)
        m.release(lease)
        m.sanity_check([])
    return checked


@pytest.mark.parametrize("policy", ["write-back", "write-through"])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_hit_loads_its_own_prefix(policy, seed):
    m = make(slots=3, host=6, policy=policy)
    assert simulate(m, _workload(seed)) > 20
    assert m.hits["host"] > 0 and m.tree.tier["demotions"] > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_write_through_never_loses_a_checkpoint_on_device_eviction(seed):
    # room on the host for every checkpoint: each device eviction keeps it there, with no copy then
    m = make(slots=3, host=200, policy="write-through")
    simulate(m, _workload(seed))
    ev, tier = m.tree.evictions, m.tree.tier
    assert ev["checkpoints"] > 10 and ev["checkpoints"] == tier["demotions"]
    assert tier["demotion_copies"] == 0 and tier["write_through_copies"] == m.tree.num_host_checkpoints()
    # so a repeat of any prompt hits its prompt-end checkpoint (from either tier)
    for prompt in {tuple(p) for p in _workload(seed)}:
        assert m.tree.match(list(prompt)).ckpt_len == len(prompt) - 1
