"""The radix cache's invariant, asserted (``RadixCache.sanity_check``; the invariant is in radix.py's
docstring). O(tree): for tests and debugging, never on the serving path."""
from __future__ import annotations


def check_tree(cache, request_block_refs=None, request_locks=None) -> None:
    root = cache.root
    nodes = list(cache._nodes())
    slots, host = set(), set()
    assert root.lock_ref >= sum(c.lock_ref for c in root.children.values()), "root lock refs"
    assert 0 <= root.ckpt_lock <= root.lock_ref, "root checkpoint lock"
    for n in nodes:
        assert n.tokens, "empty edge"
        assert n.parent.children.get(n.tokens[0]) is n, "child keyed by the wrong token"
        assert n.start == n.parent.end, "child does not start where its parent ends"
        assert len(n.blocks) == (n.end - 1) // cache.bs - n.start // cache.bs + 1, "block count"
        assert n.lock_ref >= sum(c.lock_ref for c in n.children.values()) >= 0, "lock refs"
        assert 0 <= n.ckpt_lock <= n.lock_ref, "a checkpoint lock without its path lock"
        if n.cold:
            assert cache.host_blocks is not None, "a cold node without host KV"
            assert all(c.cold for c in n.children.values()), "a warm node under a cold one"
        if n.ckpt_slot is not None:
            assert n.ckpt_slot != 0 and n.ckpt_slot not in slots, "checkpoint slot reused"
            slots.add(n.ckpt_slot)
        if n.host_slot is not None:
            assert cache.host_slots is not None, "a host checkpoint without a host tier"
            assert n.host_slot not in host, "host checkpoint slot reused"
            host.add(n.host_slot)
    assert slots <= cache.slots.used_ids(), "tree checkpoint in a free slot"
    if cache.host_slots is not None:
        # the tree is the host tier's only owner: every used host slot is exactly one node's
        cache.host_slots.sanity_check()
        assert host == cache.host_slots.used_ids(), "host checkpoint slots leaked or free while held"
    else:
        assert not len(cache._host_lru), "host LRU list without a host tier"
    if request_locks is not None:
        _check_locks(root, nodes, request_locks)
    _check_lru(cache, nodes)
    tree = cache.tree_block_refs()
    free = cache.blocks.free_ids()
    for b, count in enumerate(cache.blocks.refs):
        held = tree.get(b, 0) + (request_block_refs or {}).get(b, 0)
        if request_block_refs is None:
            assert count >= held, f"block {b}: {count} refs < {held} held by the tree"
        else:
            assert count == held, f"block {b}: {count} refs != {held} held"
        assert (count == 0) == (b in free), f"block {b}: free list disagrees with refs"
    if cache.host_blocks is not None:
        # the tree is the host KV's only owner
        host_refs = cache.host_block_refs()
        cache.host_blocks.sanity_check()
        for b, count in enumerate(cache.host_blocks.refs):
            assert count == host_refs.get(b, 0), f"host block {b}: {count} refs != {host_refs.get(b, 0)} held"


def _check_locks(root, nodes, request_locks) -> None:
    """A request's lock(node) counts on the node and every ancestor, so each lock_ref is the sum of the
    locks taken on the node and below it; its checkpoint lock counts on the node alone."""
    known = set(nodes) | {root}
    assert all(n in known for n, k in request_locks.items() if k), "a request holds a lock on an evicted node"
    below = {}
    # nodes lists parents before children: reversed, children come first
    for n in [*reversed(nodes), root]:
        below[n] = request_locks.get(n, 0) + sum(below[c] for c in n.children.values())
        assert n.lock_ref == below[n], f"lock_ref {n.lock_ref} != {below[n]} locks taken at or below it"
        assert n.ckpt_lock == request_locks.get(n, 0), f"ckpt_lock {n.ckpt_lock} != locks taken on the node"


def _check_lru(cache, nodes) -> None:
    for lru, members in ((cache._kv_lru, {n for n in nodes if not n.cold}), (cache._cold_lru, {n for n in nodes if n.cold})):
        kv = lru.sanity_check(members)
        rank = {n: i for i, n in enumerate(kv)}
        for n in kv:
            if n.parent is not cache.root and n.parent.cold == n.cold:
                assert rank[n] < rank[n.parent], "a node is more recent than its parent in the KV LRU list"
        # a split copies the stamp to the new parent: ties only there, so non-decreasing
        assert all(a.last_access <= b.last_access for a, b in zip(kv, kv[1:])), "KV LRU list out of order"
    ck = cache._ckpt_lru.sanity_check({n for n in nodes if n.ckpt_slot is not None})
    assert all(a.ckpt_access < b.ckpt_access for a, b in zip(ck, ck[1:])), "checkpoint LRU list out of order"
    hs = cache._host_lru.sanity_check({n for n in nodes if n.host_slot is not None})
    assert all(a.host_access < b.host_access for a, b in zip(hs, hs[1:])), "host LRU list out of order"
