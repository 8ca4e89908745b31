"""The id allocators (exact ids, FIFO reuse, misuse detected) and the one KV reservation rule."""
import pytest

from trtllm_dasc.cache import AllocatorError, BlockPool, IdPool, fresh_blocks, reserve_table


def test_checkpoint_slots_fifo_and_misuse():
    slots = IdPool.checkpoint_slots(5)
    assert [slots.try_alloc() for _ in range(3)] == [1, 2, 3]
    slots.free(2)
    # FIFO: 4 and 5 were never used and come before the freed 2
    assert [slots.try_alloc() for _ in range(3)] == [4, 5, 2]
    assert slots.try_alloc() is None and slots.num_free == 0
    for bad in (2 + 10, 0):
        with pytest.raises(AllocatorError, match="not allocated"):
            slots.free(bad)
    slots.free(3)
    with pytest.raises(AllocatorError, match="checkpoint slot 3"):
        slots.free(3)
    slots.sanity_check()
    assert slots.used_ids() == {1, 2, 4, 5}


def test_rows_start_at_zero():
    rows = IdPool.rows(2)
    assert (rows.try_alloc(), rows.try_alloc(), rows.try_alloc()) == (0, 1, None)


def test_block_pool_refcounts_and_fifo():
    pool = BlockPool(4)
    assert pool.alloc(3) == [0, 1, 2]
    pool.incref([1, 1])
    pool.decref([0, 1])
    assert pool.refs == [0, 2, 1, 0] and pool.num_free == 2
    # 3 was never used: it comes before the freed 0
    assert pool.try_alloc() == 3 and pool.try_alloc() == 0 and pool.try_alloc() is None
    with pytest.raises(AllocatorError, match="need 1 KV blocks, 0 free"):
        pool.alloc(1)
    pool.decref(2)
    with pytest.raises(AllocatorError, match="decref of free KV block 2"):
        pool.decref(2)
    with pytest.raises(AllocatorError, match="incref of free KV block 2"):
        pool.incref([2])
    pool.sanity_check()


@pytest.mark.parametrize("reuse,end,bs,expect", [
    (0, 1, 4, 1), (0, 4, 4, 1), (0, 5, 4, 2),
    (8, 9, 4, 1),       # aligned reuse: blocks 0, 1 shared, one fresh
    (6, 7, 4, 1),       # partial block at 6 copied, covers 7 too
    (6, 9, 4, 2),       # copy of block 1 + one fresh
    (3, 17, 16, 2),     # copy of block 0 (positions 0-2) + block 1
])
def test_fresh_blocks_rule(reuse, end, bs, expect):
    assert fresh_blocks(reuse, end, bs) == expect


def test_reserve_table_shares_copies_and_allocates():
    pool = BlockPool(10)
    cached = pool.alloc(3)                                  # [0, 1, 2]: positions 0..11 of a prefix
    table, copy = reserve_table(pool, cached, 6, 13, 4)
    # shares block 0 (positions 0-3), copies block 1 (positions 4-5 valid) into 3, fresh 4, 5 up to 13
    assert table == [0, 3, 4, 5] and copy == (1, 3)
    assert pool.refs[:6] == [2, 1, 1, 1, 1, 1]
    table, copy = reserve_table(pool, cached, 8, 9, 4)
    assert table == [0, 1, 6] and copy is None and pool.refs[:2] == [3, 2]
    # all or nothing: not enough blocks leaves every count as it was
    before = list(pool.refs)
    with pytest.raises(AllocatorError):
        reserve_table(pool, cached, 0, 100, 4)
    assert pool.refs == before
