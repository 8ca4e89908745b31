"""Id allocators the radix cache draws on: ref-counted KV blocks and checkpoint slots.

Pure bookkeeping (ints only): the KV tensors and the checkpoint pool that these ids index live in
model/ and state/.
"""
from __future__ import annotations


class BlockAllocator:
    """KV block ids with reference counts: the tree and every in-flight request each hold one ref on a
    block they use; a block returns to the free list when its count reaches zero."""

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"need at least one KV block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.refs = [0] * num_blocks
        # pop() takes from the end: reversed so that ids come out 0, 1, 2, ... (readable tests)
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def try_alloc(self) -> int | None:
        if not self._free:
            return None
        block = self._free.pop()
        self.refs[block] = 1
        return block

    def incref(self, block: int) -> None:
        if self.refs[block] <= 0:
            raise RuntimeError(f"incref of free KV block {block}")
        self.refs[block] += 1

    def decref(self, block: int) -> None:
        if self.refs[block] <= 0:
            raise RuntimeError(f"decref of free KV block {block}")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self._free.append(block)

    def free_ids(self) -> set[int]:
        return set(self._free)


class SlotFreeList:
    """Checkpoint slot ids 1..num_slots (slot 0 is the allocator's reserved slot, never handed out).

    The state pool offers the same three members (try_alloc, free, num_free), so the cache can run on
    either."""

    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise ValueError(f"need at least one checkpoint slot, got {num_slots}")
        self.num_slots = num_slots
        self._free = list(range(num_slots, 0, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def try_alloc(self) -> int | None:
        if not self._free:
            return None
        slot = self._free.pop()
        self._used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        if slot not in self._used:
            raise RuntimeError(f"free of checkpoint slot {slot} that is not allocated")
        self._used.remove(slot)
        self._free.append(slot)

    def used_ids(self) -> set[int]:
        return set(self._used)
