"""LRU eviction order of both resources (KV leaves, checkpoints): exact, and equal to a brute-force min()."""
import random
from collections import Counter

import pytest

from cache_sim import Sim, prompt_stream
from trtllm_dasc.cache import BlockPool, IdPool, RadixCache


def put(c, tokens, ckpts):
    """A finished prefill with bs 1: fresh blocks for every token, a slot per checkpoint position."""
    table = c.blocks.alloc(len(tokens))
    c.insert(tokens, table, {p: c.slots.try_alloc() for p in sorted(ckpts)})
    c.blocks.decref(table)


NAMES = {(1, 2, 3): "X", (1, 2, 3, 4, 5, 6): "A", (1, 2, 3, 7, 8): "B", (9, 9, 9, 9): "C", (9, 9): "Y",
         (1, 2, 3, 4, 5): "Z", (9, 9, 9): "W"}


def lists(c):
    """Both LRU lists, LRU first, as node names (a node is named by its whole prefix, which a split keeps)."""
    name = lambda node: NAMES[tuple(t for n in node.path() for t in n.tokens)]  # noqa: E731
    return " ".join(map(name, c._kv_lru)), " ".join(map(name, c._ckpt_lru))


def scenario(steps=None):
    """Six steps interleaving inserts, matches and splits; returns the cache with X = [1, 2, 3] locked.
    ``steps`` collects both lists after each step.

    Nodes (tokens @ start, blocks, slot), and both LRU lists after each step, LRU first:
      t1 insert [1..6], ckpts 3, 6: one node, split at 3 into X=[1,2,3] (blocks 0-2, slot 1) over
         A=[4,5,6]@3 (blocks 3-5, slot 2); the new parent goes just MRU-side of A. Checkpoints are
         touched deepest first, so X's is the more recent.
         KV: A X.  CK: A X
      t2 insert [1,2,3,7,8], ckpt 5: X matched in full, new leaf B=[7,8]@3 (blocks 9, 10: the
         request's 6, 7, 8 duplicate X's and go back to the pool), slot 3. Path touched leaf first.
         KV: A B X.  CK: A X B
      t3 insert [9,9,9,9], ckpts 2, 4: split at 2 into Y=[9,9] (blocks 11, 12, slot 4) over C=[9,9]@2
         (blocks 13, 14, slot 5).  KV: A B X C Y.  CK: A X B C Y
      t4 match [1,2,3,4,5,9]: X, then A split at 5 into Z=[4,5]@3 (blocks 3, 4) over A=[6]@5 (block 5,
         slot 2); Z lands just after A, then the path is touched Z, X. Hit: X's checkpoint (3); locked.
         KV: A B C Y Z X.  CK: A B C Y X
      t5 match [9,9,9]: Y, then C split at 3 into W=[9]@2 (block 13) over C=[9]@3 (block 14, slot 5);
         path touched W, Y. Hit: Y's checkpoint (limit 2).
         KV: A B C Z X W Y.  CK: A B C X Y
      t6 match [9,9,9,9,5]: Y, W, C in full; hit C's checkpoint (4); path touched C, W, Y.
         KV: A B Z X C W Y.  CK: A B X Y C   (Y's checkpoint is now older than its descendant C's)
    """
    steps = [] if steps is None else steps
    c = RadixCache(1, BlockPool(16), IdPool.checkpoint_slots(5), interval=100)
    put(c, [1, 2, 3, 4, 5, 6], {3, 6})
    steps.append(lists(c))
    put(c, [1, 2, 3, 7, 8], {5})
    steps.append(lists(c))
    put(c, [9, 9, 9, 9], {2, 4})
    steps.append(lists(c))
    m = c.match([1, 2, 3, 4, 5, 9])
    assert (m.kv_len, m.ckpt_len, m.ckpt_slot, m.block_table) == (5, 3, 1, [0, 1, 2])
    c.lock(m.ckpt_node)
    steps.append(lists(c))
    assert c.match([9, 9, 9]).ckpt_slot == 4
    steps.append(lists(c))
    assert c.match([9, 9, 9, 9, 5]).ckpt_slot == 5
    steps.append(lists(c))
    c.sanity_check({}, {m.ckpt_node: 1})
    return c, m.ckpt_node


def test_lru_lists_step_by_step():
    steps = []
    c, x = scenario(steps)
    assert steps == [("A X", "A X"), ("A B X", "A X B"), ("A B X C Y", "A X B C Y"),
                     ("A B C Y Z X", "A B C Y X"), ("A B C Z X W Y", "A B C X Y"),
                     ("A B Z X C W Y", "A B X Y C")]
    assert c.num_checkpoints() == 5 and x.lock_ref == 1 and c.root.lock_ref == 1


def test_kv_eviction_order_is_lru_and_skips_the_locked_node():
    c, x = scenario()
    held = c.blocks.alloc(c.blocks.num_free)        # an empty pool: every block must come from eviction
    freed = []
    for _ in range(7):
        before = c.blocks.free_ids()
        # bs 1 and no request references: each eviction frees its leaf's blocks, so one leaf per call
        if not c.make_room(c.blocks.num_free + 1):
            break
        freed.append(sorted(c.blocks.free_ids() - before))
        c.sanity_check({b: 1 for b in held}, {x: 1})
    # KV order A B Z, then X is locked and skipped: C W Y (Z became a leaf when A went)
    assert freed == [[5], [9, 10], [3, 4], [14], [13], [11, 12]]
    assert c.evictions == {"kv_nodes": 6, "kv_blocks": 9, "checkpoints": 0, "checkpoints_with_kv": 4}
    assert list(c.root.children.values()) == [x] and not x.children
    c.unlock(x)
    assert c.make_room(c.blocks.num_free + 1) and not c.root.children
    # the FIFO pool hands the blocks back in the order they were freed (X's 0, 1, 2 last)
    assert c.blocks.alloc(12) == [5, 9, 10, 3, 4, 14, 13, 11, 12, 0, 1, 2]


def test_checkpoint_eviction_order_is_by_checkpoint_access():
    c, x = scenario()
    # all 5 slots are in the tree: each alloc_slot evicts the LRU unlocked checkpoint and hands back its
    # slot: A (2), B (3), X skipped (locked), Y (4) before its descendant C (5)
    assert [c.alloc_slot() for _ in range(5)] == [2, 3, 4, 5, None]
    assert c.evictions["checkpoints"] == 4 and c.num_checkpoints() == 1
    c.sanity_check(None, {x: 1})
    # the nodes kept their KV: the KV order is untouched by checkpoint traffic
    assert lists(c) == ("A B Z X C W Y", "X")
    c.unlock(x)
    assert c.alloc_slot() == 1 and c.num_checkpoints() == 0
    c.flush()
    assert not c.root.children and c.evictions["checkpoints_with_kv"] == 0


class BruteForceChecked(RadixCache):
    """Asserts each O(1) eviction choice equals the old rule: a min() over every candidate. A checkpoint is
    a candidate unless a request loaded it or a pin holds its node: ``locked()`` lists those nodes from the
    simulator's own record (the running requests' matches and its pins), not from the tree's counters."""

    checked = Counter()
    locked = staticmethod(lambda: set())

    def _kv_victim(self):
        got = super()._kv_victim()
        leaves = [n for n in self._nodes() if not n.children and n.lock_ref == 0]
        assert got is min(leaves, key=lambda n: n.last_access, default=None)
        self.checked["kv"] += 1
        return got

    def _ckpt_victim(self):
        got = super()._ckpt_victim()
        locked = self.locked()
        held = [n for n in self._nodes() if n.ckpt_slot is not None and n not in locked]
        assert got is min(held, key=lambda n: n.ckpt_access, default=None)
        self.checked["ckpt"] += 1
        return got


@pytest.mark.parametrize("seed,bs,blocks,slots", [(10, 1, 40, 4), (11, 4, 30, 8), (12, 2, 45, 3)],
                         ids=["bs1", "bs4", "bs2-few-slots"])
def test_eviction_choice_equals_brute_force_min(seed, bs, blocks, slots):
    rng = random.Random(seed)
    BruteForceChecked.checked = Counter()
    cache = BruteForceChecked(bs, BlockPool(blocks), IdPool.checkpoint_slots(slots), interval=6)
    sim = Sim(cache, blocks)
    BruteForceChecked.locked = staticmethod(sim.locked_nodes)
    for i, tokens in enumerate(prompt_stream(rng, 600)):
        # pin a random cached node now and then (a lock below the root, as a hit takes)
        if rng.random() < 0.2 and cache.root.children:
            nodes = list(cache._nodes())
            sim.pin(rng.choice(nodes))
        if sim.start(tokens, expect=sim.expected_match(tokens)) is None:
            sim.unpin_all()
            while sim.inflight:
                sim.finish()
            assert sim.start(tokens) is not None
        while len(sim.inflight) > rng.randrange(0, 4):
            sim.finish(rng.randrange(len(sim.inflight)))
        if len(sim.pins) > rng.randrange(0, 3):
            sim.unpin(rng.randrange(len(sim.pins)))
        if i % 5 == 0:
            sim.check()
    sim.unpin_all()
    while sim.inflight:
        sim.finish()
    cache.flush()
    sim.check()
    assert not cache.root.children
    assert BruteForceChecked.checked["kv"] > 300 and BruteForceChecked.checked["ckpt"] > 100
