"""The id allocators of the engine: ref-counted KV blocks, and plain id pools (checkpoint slots, state rows).

Pure bookkeeping (ints only), one class per kind of resource, used by production and by the tests'
brute-force drivers alike. The tensors these ids index (PagedKVCache, CheckpointPool, RecurrentState)
live in model/ and state/ and never allocate.
"""
from __future__ import annotations

from collections import deque


class AllocatorError(RuntimeError):
    """A bookkeeping bug (double free, foreign id): never a user error, always a broken invariant."""


class BlockPool:
    """KV block ids with reference counts (vLLM's BlockPool without its hash cache: our radix tree is the
    cache). The tree and every in-flight sequence each hold one reference on a block they use; a block
    returns to the free queue when its count reaches zero. The free queue is FIFO: freed blocks go to the
    back, so ids come out 0, 1, 2, ... on a fresh pool and a just-freed block is reused last."""

    def __init__(self, num_blocks: int):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"need at least one KV block, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.refs = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def try_alloc(self) -> int | None:
        """One fresh block (one reference, the caller's), or None when none is free."""
        if not self._free:
            return None
        block = self._free.popleft()
        self.refs[block] = 1
        return block

    def alloc(self, n: int) -> list[int]:
        """n fresh blocks, all or none."""
        if n > len(self._free):
            raise AllocatorError(f"need {n} KV blocks, {len(self._free)} free")
        return [self.try_alloc() for _ in range(n)]

    def incref(self, blocks) -> None:
        for b in _ids(blocks):
            if self.refs[b] <= 0:
                raise AllocatorError(f"incref of free KV block {b}")
            self.refs[b] += 1

    def decref(self, blocks) -> None:
        for b in _ids(blocks):
            if self.refs[b] <= 0:
                raise AllocatorError(f"decref of free KV block {b}")
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self._free.append(b)

    def free_ids(self) -> set[int]:
        return set(self._free)

    def sanity_check(self) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), "a KV block is queued twice"
        for b, r in enumerate(self.refs):
            assert r >= 0 and (r == 0) == (b in free), f"block {b}: {r} refs but free={b in free}"


class IdPool:
    """Plain ids without reference counts: checkpoint slots 1..N (slot 0 is the store's reserved slot and is
    never handed out) or state rows 0..R-1. FIFO like BlockPool: lowest id first on a fresh pool."""

    def __init__(self, ids, what: str):
        self.what = what
        self._free: deque[int] = deque(ids)
        self._used: set[int] = set()
        self.capacity = len(self._free)
        if self.capacity < 1:
            raise ValueError(f"need at least one {what}")

    @classmethod
    def checkpoint_slots(cls, num_slots: int) -> "IdPool":
        return cls(range(1, num_slots + 1), "checkpoint slot")

    @classmethod
    def rows(cls, num_rows: int) -> "IdPool":
        return cls(range(num_rows), "state row")

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def try_alloc(self) -> int | None:
        if not self._free:
            return None
        i = self._free.popleft()
        self._used.add(i)
        return i

    def free(self, i: int) -> None:
        if i not in self._used:
            raise AllocatorError(f"free of {self.what} {i} that is not allocated")
        self._used.remove(i)
        self._free.append(i)

    def used_ids(self) -> set[int]:
        return set(self._used)

    def sanity_check(self) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), f"a {self.what} is queued twice"
        assert not free & self._used, f"a {self.what} is both free and used"
        assert len(free) + len(self._used) == self.capacity, f"{self.what}s leaked"


def _ids(blocks):
    return (blocks,) if isinstance(blocks, int) else blocks


def fresh_blocks(reuse_len: int, end_len: int, block_size: int) -> int:
    """The one KV reservation rule. A sequence that reuses the cached KV of positions [0, reuse_len) and
    will write positions [reuse_len, end_len) shares the floor(reuse_len / bs) full blocks, gets a copy of
    the partly filled block at reuse_len (if any: a sequence writes only into blocks it allocated), and
    fresh blocks up to end_len. Returns how many blocks it allocates."""
    return -(-end_len // block_size) - reuse_len // block_size


def reserve_table(pool: BlockPool, shared: list[int], reuse_len: int, end_len: int, block_size: int):
    """Allocate a sequence's block table by ``fresh_blocks``'s rule (the caller made room first).

    Returns (table, copy): ``copy`` is (source block, destination block) for the partly filled block at
    reuse_len, to be copied before the sequence first writes (None when reuse_len is block-aligned)."""
    full = reuse_len // block_size
    need = fresh_blocks(reuse_len, end_len, block_size)
    if need > pool.num_free:
        raise AllocatorError(f"need {need} KV blocks, {pool.num_free} free (make room first)")
    table = list(shared[:full])
    pool.incref(table)
    copy = None
    if reuse_len % block_size:
        dst = pool.alloc(1)[0]
        copy = (shared[full], dst)
        table.append(dst)
    table.extend(pool.alloc(-(-end_len // block_size) - len(table)))
    return table, copy
