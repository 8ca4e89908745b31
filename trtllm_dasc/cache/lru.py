"""An intrusive doubly linked LRU list (SGLang's LRUList idea): O(1) touch, insert and removal.

The links live on the items themselves, under attribute names given per list, so one node can sit in
several lists at once (the radix tree keeps one list per resource: KV and checkpoints). An item is in
the list iff its prev link is not None.
"""
from __future__ import annotations


class _End:
    """The sentinel closing the ring: its next is the LRU item, its prev the MRU item."""


class LRUList:
    def __init__(self, prev: str, next: str):
        self._prev, self._next = prev, next
        self._end = _End()
        setattr(self._end, prev, self._end)
        setattr(self._end, next, self._end)
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __contains__(self, item) -> bool:
        return getattr(item, self._prev) is not None

    def __iter__(self):
        """LRU first. The current item may be removed while iterating (its next link is read first)."""
        end, nxt = self._end, self._next
        item = getattr(end, nxt)
        while item is not end:
            following = getattr(item, nxt)
            yield item
            item = following

    def push_mru(self, item) -> None:
        self._link(getattr(self._end, self._prev), item)

    def touch(self, item) -> None:
        """Make ``item`` the MRU one, linking it if it is not in the list yet."""
        if getattr(item, self._prev) is not None:
            self.remove(item)
        self.push_mru(item)

    def insert_after(self, anchor, item) -> None:
        """Link ``item`` just MRU-side of ``anchor`` (which must be in the list)."""
        self._link(anchor, item)

    def remove(self, item) -> None:
        prev, nxt = self._prev, self._next
        before, after = getattr(item, prev), getattr(item, nxt)
        setattr(before, nxt, after)
        setattr(after, prev, before)
        setattr(item, prev, None)
        setattr(item, nxt, None)
        self._len -= 1

    def _link(self, before, item) -> None:
        prev, nxt = self._prev, self._next
        after = getattr(before, nxt)
        setattr(item, prev, before)
        setattr(item, nxt, after)
        setattr(before, nxt, item)
        setattr(after, prev, item)
        self._len += 1

    def sanity_check(self, members: set) -> list:
        """Assert the ring is consistent and holds exactly ``members``; returns the items LRU first."""
        prev, nxt, end = self._prev, self._next, self._end
        order, item = [], getattr(end, nxt)
        while item is not end:
            assert len(order) <= len(members), "LRU list longer than its members (a cycle or a stray item)"
            assert getattr(getattr(item, nxt), prev) is item, "LRU next/prev links disagree"
            order.append(item)
            item = getattr(item, nxt)
        assert getattr(getattr(end, nxt), prev) is end, "LRU end links disagree"
        assert len(order) == len(set(map(id, order))), "an item is twice in an LRU list"
        assert len(order) == self._len, f"LRU list counts {self._len} items, holds {len(order)}"
        assert set(map(id, order)) == set(map(id, members)), "LRU list does not hold exactly its members"
        return order
