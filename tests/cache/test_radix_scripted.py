"""Scripted scenarios with exact slot ids, block ids and eviction order."""

from cache_sim import Sim
from trtllm_dasc.cache import BlockPool, IdPool, RadixCache


def make(bs=4, blocks=8, slots=2, interval=100, prompt_only=False):
    c = RadixCache(bs, BlockPool(blocks), IdPool.checkpoint_slots(slots), interval=interval, prompt_only=prompt_only)
    return c, Sim(c, blocks)


def test_branch_checkpoint_and_lru_slot_eviction():
    c, sim = make()
    a = list(range(1, 11))                          # 10 tokens
    sim.start(a, expect=(0, 0))
    # a fresh FIFO pool hands out its front: 0, 1, 2 (free queue left: 3..7)
    assert sim.inflight[0][1] == [0, 1, 2]
    assert c.root.children[1].ckpt_slot == 1        # prompt end at 9; slots come out 1, 2 likewise
    sim.finish()
    sim.check()
    b = a[:6] + [50, 51]
    sim.start(b, expect=(6, 0))                     # KV to 6, no checkpoint there yet
    # nothing reused (ckpt_len 0): two fresh blocks from the front of the queue, 3 and 4.
    # branch point 6 gets slot 2 (the last free one); prompt end 7 needs a slot: the LRU checkpoint
    # (a's, slot 1) goes to the back of the empty slot queue and comes straight out again
    assert c.evictions["checkpoints"] == 1
    shared = c.root.children[1]
    assert shared.end == 6 and shared.ckpt_slot == 2
    assert shared.children[50].ckpt_slot == 1 and shared.children[50].end == 7
    assert shared.children[7].ckpt_slot is None     # a kept its KV, lost its checkpoint
    assert sim.inflight[0][1] == [3, 4]
    sim.finish()
    # b's block 3 (positions 0-3) duplicates the tree's block 0, so the tree took no reference on it:
    # b's release frees it to the BACK of the queue, behind 5, 6, 7
    assert c.blocks.num_free == 4 and c.blocks.refs[3] == 0
    sim.check()
    # a third request sharing the 6-token prefix hits it in full; 6 is inside block 1, so that block is
    # copied into a fresh one (5, the queue's front), and position 8 (block index 2) takes the next one
    # (6), not the just-freed 3 (LIFO would have handed out 3 first)
    m = sim.start(a[:6] + [60, 61, 62], expect=(6, 6))
    assert m.ckpt_slot == 2 and m.block_table == [0, 1]
    assert sim.inflight[0][1] == [0, 5, 6]
    sim.finish()
    sim.check()


def test_kv_leaf_eviction_order_and_locks():
    c, sim = make(bs=2, blocks=6, slots=4)
    sim.start([1, 2, 3, 4], expect=(0, 0))          # blocks 0, 1
    sim.finish()
    sim.start([7, 8, 9, 10], expect=(0, 0))         # blocks 2, 3
    sim.start([11, 12], expect=(0, 0))              # block 4, held (in flight)
    # [1, 2, 3, 4] was split at its prompt-end checkpoint (3): [1, 2, 3] + [4], sharing block 1.
    # 4 tokens need 2 blocks, 1 free (5): the LRU unlocked leaves go, [4] first (frees nothing: block 1
    # is still held by its parent), then [1, 2, 3] (frees 0 then 1, queued in that order at the back);
    # FIFO hands out 0, the first freed (LIFO gave 1)
    sim.start([20, 21, 22, 23], expect=(0, 0))
    assert c.evictions["kv_nodes"] == 2 and 1 not in c.root.children
    assert c.evictions["checkpoints_with_kv"] == 1
    assert sim.inflight[2][1] == [5, 0]
    assert c.blocks.free_ids() == {1}
    sim.check()
    # every other block is held by an in-flight request: 6 tokens need 3 blocks, 1 is free, and
    # evicting the whole unlocked tree (6 nodes) frees none, so the request gives up and leaves nothing
    # allocated
    assert sim.start([30, 31, 32, 33, 34, 35]) is None
    assert c.blocks.free_ids() == {1} and c.evictions["kv_nodes"] == 8 and not c.root.children
    sim.check()
    for _ in range(3):
        sim.finish()
    c.flush()
    sim.check()
    assert c.blocks.num_free == 6 and c.slots.num_free == 4


def test_node_keeps_kv_after_losing_checkpoint_and_loses_checkpoint_with_kv():
    c, sim = make(bs=4, blocks=3, slots=1)
    sim.start([1, 2, 3, 4, 5], expect=(0, 0))       # checkpoint at 4 in slot 1
    sim.finish()
    sim.start([9, 9, 9, 9], expect=(0, 0))          # needs slot: evicts [1..5]'s checkpoint, keeps KV
    sim.finish()
    assert c.evictions["checkpoints"] == 1
    # the prompt-end checkpoint split [1..5] at 4: [1, 2, 3, 4] (block 0) -> [5] (block 1)
    head = c.root.children[1]
    assert head.ckpt_slot is None and head.blocks == [0] and head.children[5].blocks == [1]
    sim.check()
    # 9 tokens need all 3 blocks and none is free, so each allocation evicts LRU leaves until one block
    # is queued and takes it straight back (FIFO or LIFO alike on an empty queue): [5] frees 1,
    # [1, 2, 3, 4] frees 0, then [9] (its block is shared) and [9, 9, 9] with its checkpoint free 2
    sim.start([7, 7, 7, 7, 7, 7, 7, 7, 7], expect=(0, 0))
    assert c.evictions["kv_nodes"] == 4 and c.evictions["checkpoints_with_kv"] == 1
    assert sim.inflight[0][1] == [1, 0, 2]
    sim.finish()
    sim.check()


def test_split_inside_a_block_shares_it_and_copy_on_write_keeps_it_intact():
    c, sim = make(bs=4, blocks=10, slots=4)
    sim.start(list(range(10)), expect=(0, 0))
    sim.finish()
    # diverge at 5 (inside block 1): the branch checkpoint lands at 5
    sim.start(list(range(5)) + [99, 98, 97], expect=(5, 0))
    sim.finish()
    top = c.root.children[0]
    assert top.end == 5 and top.ckpt_slot is not None
    assert c.blocks.refs[top.blocks[-1]] == 2       # shared by both halves of the split
    # reuse from 5: the partial block is copied before writing position 5
    m = sim.start(list(range(5)) + [42, 43], expect=(5, 5))
    assert m.block_table == top.blocks
    sim.finish()
    sim.check()


def test_prompt_only_mode_and_positions():
    c, sim = make(bs=4, blocks=32, slots=8, interval=4, prompt_only=True)
    m = c.match(list(range(13)))
    assert c.checkpoint_positions(13, m) == [12]
    c2, _ = make(bs=4, blocks=32, slots=8, interval=4)
    assert c2.checkpoint_positions(13, c2.match(list(range(13)))) == [4, 8, 12]


def test_identical_prompt_repeat_hits_all_but_last_token():
    c, sim = make(bs=4, blocks=8, slots=4)
    p = [5, 6, 7, 8, 9, 10, 11]
    sim.start(p, expect=(0, 0))
    sim.finish()
    m = sim.start(p, expect=(7, 6))
    assert sim.cache.checkpoint_positions(7, m) == []
    sim.finish()
    sim.check()


def test_shared_few_shot_prefix_hits_in_full_from_the_third_request():
    # prefix of 37 tokens, interval 16: a fixed grid alone would only ever offer 32
    c, sim = make(bs=4, blocks=200, slots=64, interval=16)
    prefix = list(range(100, 137))
    for i in range(10):
        question = [1000 + i, 7, 8, 9 + i]
        m = sim.start(prefix + question)
        if i >= 2:
            assert m.ckpt_len == len(prefix), i
        sim.finish()
        sim.check()
    # prompts shorter than the interval hit too (prompt-end and branch checkpoints)
    short = [5, 6, 7]
    sim.start(short + [1])
    sim.finish()
    sim.start(short + [2])
    sim.finish()
    m = sim.start(short + [3])
    assert m.ckpt_len == 3
    sim.finish()
    sim.check()
