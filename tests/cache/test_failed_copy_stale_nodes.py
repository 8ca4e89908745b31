"""A host KV copy that fails leaves its destination block undefined. The node that owns it must be matched by
no request from then on, even while a running request (one that does not read that block) still locks it,
and a split of that node must not leave a matchable half holding the block. Found by a randomised
content-tracking harness (session 36's review): a later request's block table held the undefined block in
about 40 of 1,150 seeds, and sanity_check passed. The reference here is the failed copy's own destination
block: no later match may contain it."""
from trtllm_dasc.cache import CacheManager


def _put(m, tokens, ckpts):
    """A prefix inserted as a finished request leaves it: its blocks, a checkpoint at each position."""
    table = m.blocks.alloc(-(-len(tokens) // m.bs))
    m.tree.insert(tokens, table, {p: m.tree.alloc_slot() for p in ckpts})
    m.blocks.decref(table)


def _serve(m, prompt):
    lease = m.admit(prompt, len(prompt))
    captures = m.extend(lease, lease.match.ckpt_len, len(prompt))
    m.store(lease, captures, [True] * len(captures))
    m.insert(lease, prompt)
    return lease


def test_a_locked_node_whose_warm_copy_failed_is_matched_by_no_one():
    m = CacheManager.create(2, 8, 4, 4, interval=100, host_kv_blocks=8)
    _put(m, [1, 5, 7], [1])              # X = [1], checkpoint at 1
    _put(m, [1, 6, 8], [2])              # Y = [6] under X, with its own copy of block 0
    m.tree.make_room(8)
    m.take_kv_copies()                   # X and Y demoted to the host
    lease = m.admit([1, 6, 4, 4], 5)     # a hit on Y warms X and Y
    copies = m.take_kv_copies()
    assert [kind for kind, _, _ in copies] == ["promote", "promote"]
    undefined = copies[0][2]             # X's warm copy fails: its device block is undefined
    # the lease reads Y's copy of block 0, not X's: it is not hurt and keeps running, locking X
    assert undefined not in lease.match.block_table
    assert m.copies_failed([], [], copies, failed=[True, False], leases=[lease]) == {}
    other = m.admit([1, 3, 3], 4)        # would hit X's checkpoint at 1, reading X's block
    assert undefined not in other.match.block_table, "a new request reads the failed copy's block"
    m.sanity_check([lease, other])
    m.release(lease)
    m.release(other)
    m.sanity_check([])
    assert not m.tree.stale              # dropped once unlocked


def test_a_split_of_a_stale_node_leaves_no_matchable_half():
    # interval 2: the next request's grid puts a checkpoint at 2, inside X, where its insert splits X (its
    # match stops before X, so the split comes from the insert, not the match)
    m = CacheManager.create(4, 8, 6, 4, interval=2, host_kv_blocks=8)
    _put(m, [1, 2, 3, 7], [3])           # X = [1, 2, 3]
    _put(m, [1, 2, 3, 8], [4])           # Y = [8] under X, with its own copy of block 0
    m.tree.make_room(8)
    m.take_kv_copies()
    lease = m.admit([1, 2, 3, 8, 5], 6)
    copies = m.take_kv_copies()
    undefined = copies[0][2]
    assert m.copies_failed([], [], copies, failed=[True, False], leases=[lease]) == {}
    served = _serve(m, [1, 2, 9, 9])
    assert 2 in served.positions         # the checkpoint that lands on the split's top half
    m.release(served)
    m.release(lease)                     # X unlocked: dropped, and the split's top half with it
    m.sanity_check([])
    late = m.admit([1, 2, 5, 5], 5)
    assert undefined not in late.match.block_table, "the split's top half kept the undefined block"
    m.release(late)
    assert not m.tree.stale
