"""Checkpoint locks sit on their own node (SGLang's mamba radix cache): a running request pins the KV of its
whole path but only the checkpoint it loaded, so its ancestors' checkpoints stay evictable.

Expected trees are written by hand as sets of prefixes (which prefixes have KV, which a checkpoint) and
compared with what the simulator reads back from the tree; the simulator checks every cell and slot."""
from cache_sim import Sim
from trtllm_dasc.cache import BlockPool, IdPool, RadixCache

A = list(range(1, 10))                  # 9 tokens: checkpoints at 4 (grid) and 8 (prompt end)


def prefixes(tokens, upto=None):
    return {tuple(tokens[:p]) for p in range(1, (upto or len(tokens)) + 1)}


def test_a_running_request_pins_its_own_checkpoint_not_its_ancestors():
    c = RadixCache(4, BlockPool(16), IdPool.checkpoint_slots(2), interval=4)
    sim = Sim(c, 16)
    sim.start(A, expect=(0, 0))
    sim.finish()
    assert sim.flat_sets() == (prefixes(A), {tuple(A[:4]), tuple(A[:8])})
    # B hits A's checkpoint at 8 and runs on. Its prompt end (9) needs a slot and both are in the tree: the
    # LRU one is at 4 (B's match made 8 the most recent), an ancestor of B's node, path-locked by B for its
    # KV. With every checkpoint of the path pinned, B's own checkpoint would go uncached; now 4's goes.
    b = A[:8] + [20, 21]
    m = sim.start(b, expect=(8, 8))
    head = m.ckpt_node.parent
    assert head.end == 4 and head.lock_ref == 1 and head.ckpt_slot is None
    kv, ck = sim.flat_sets()
    assert ck == {tuple(A[:8]), tuple(b[:9])}
    # the evicted checkpoint's KV stays: every prefix of A and of B still has its KV in the tree
    assert kv == prefixes(A) | prefixes(b)
    assert c.evictions == {"kv_nodes": 0, "kv_blocks": 0, "checkpoints": 1, "checkpoints_with_kv": 0}
    sim.check()
    # D needs a slot too: the LRU checkpoint is now B's loaded one (8), pinned on its own node, so B's new
    # one (9) goes instead
    d = [40, 41, 42]
    sim.start(d, expect=(0, 0))
    assert sim.flat_sets()[1] == {tuple(A[:8]), tuple(d[:2])}
    assert c.evictions["checkpoints"] == 2 and c.evictions["kv_nodes"] == 0
    sim.check()
    # the pinned checkpoint still serves a hit while B runs, and the KV before it is all there
    assert sim.start(A[:8] + [30], expect=(8, 8)).ckpt_len == 8
    sim.check()
    while sim.inflight:
        sim.finish()
    sim.check()
    assert m.ckpt_node.ckpt_lock == 0 and m.ckpt_node.lock_ref == 0 and c.root.lock_ref == 0
