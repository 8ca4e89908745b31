"""Radix prefix cache over token ids: full-attention KV blocks plus recurrent-state checkpoint slots.

A hybrid model can reuse a prefix only where it has both the KV of every token before it and a
checkpoint of the recurrent state exactly there. So a match reports two depths: ``kv_len`` (common
prefix with KV) and ``ckpt_len`` (the deepest checkpointed boundary within it, at most len - 1 so the
last prompt token is always computed and gives the first output's logits).

Invariant (``sanity_check`` asserts it; tests call it after every step):
  1. shape: each non-root node has a non-empty edge ``tokens``, ``child.start == parent.end``, and
     ``parent.children[child.tokens[0]] is child``.
  2. KV: ``node.blocks`` holds one block id per block index its edge touches, [start//bs, (end-1)//bs];
     each such block holds valid KV for every position of that block below ``node.end`` (positions of
     the parent's part included: a split shares the block, a copy-on-write copies those rows).
     The tree owns one reference per (node, block) entry; blocks with no reference are free.
  3. checkpoints: ``node.ckpt_slot`` is the recurrent state after position ``node.end``; slot ids are
     distinct, allocated, never 0.
  4. locks (SGLang's mamba radix cache): ``lock(node)`` takes a path lock, counted in ``lock_ref`` on the
     node and every ancestor, so ``lock_ref(parent) >= sum(lock_ref(children))``, and a checkpoint lock,
     counted in ``ckpt_lock`` on that node alone, so ``ckpt_lock <= lock_ref``. A path-locked node keeps
     its KV; only a checkpoint-locked node keeps its checkpoint: a running request pins the checkpoint it
     loaded, while its ancestors' checkpoints stay evictable (their KV stays).
  5. eviction: checkpoints and KV are evicted by LRU independently. KV goes leaf by leaf; a node keeps
     its KV after losing its checkpoint, and loses its checkpoint with its KV.
  6. LRU lists, one per resource, LRU first: ``_kv_lru`` holds every non-root node in ``last_access``
     order, each node after all its descendants; ``_ckpt_lru`` holds every node with a checkpoint in
     ``ckpt_access`` order. Every touch takes a fresh tick of one clock, so the lists are what a min()
     over the stamps would pick, and eviction is O(1) amortised: it walks from the LRU end past the locked
     nodes only (path-locked ones for KV, checkpoint-locked ones for checkpoints). The first unlocked node
     of ``_kv_lru`` is a leaf, since its children sit LRU-side of it, so are locked, and would lock it too.
  7. host tier (optional, ``host_slots``): a node's checkpoint lives in a device slot (``ckpt_slot``), a
     host slot (``host_slot``: the same encoded bytes in host memory), or both. Device eviction demotes
     (write-back: a copy device -> host, queued in ``copies``, unless the host already holds it) instead of
     dropping; with ``write_policy`` write-through, insert queues that copy for every checkpoint it keeps
     (a host slot permitting), so a device eviction finds the host copy there and copies nothing; host eviction drops; a match may end at a host-only checkpoint, which the manager promotes
     (a copy host -> device into a fresh device slot; the host copy stays, so the node then lives in both).
     A node that loses its KV loses both copies. ``_host_lru`` holds every node with a host slot in
     ``host_access`` order; a checkpoint-locked node keeps its host copy (it may be a pending promotion's
     source). Copies run in the order queued: demotions read a device slot before a later store or
     promotion reuses it (the runner runs every demotion of a step before its promotions, see manager.py).
  9. host KV (optional, ``host_blocks``): a node is warm (``blocks`` are device KV blocks) or cold (``cold``:
     ``blocks`` are host KV block ids of ``host_blocks``, the same rows in host memory). A cold node's
     descendants are cold. A KV eviction demotes the victim's blocks to host blocks (queued in
     ``kv_copies``) when it has a checkpoint in either tier or cold children, instead of dropping it; a
     cold leaf is dropped from the LRU end of ``_cold_lru`` (cold nodes, in ``last_access`` order, each after
     its descendants). A hit on a cold checkpoint node warms its path (``warm``: fresh device blocks, copies
     host -> device, the host blocks freed); an insert that walks into a cold node warms it from the
     request's own table (its KV is valid there). Cold nodes are never locked once admission is done.
  8. eviction policy: ``lru`` (above), or ``cost``: among the unlocked candidates of a tier, Marconi's
     utility, recency (min-max normalised stamp) + alpha * FLOP efficiency (prefill FLOPs the prefix saves per
     byte, normalised by the candidates' maximum), evicting the smallest.
"""
from __future__ import annotations

from typing import NamedTuple

from trtllm_dasc.cache.allocators import BlockPool, IdPool
from trtllm_dasc.cache.lru import LRUList
from trtllm_dasc.cache.radix_checks import check_tree
from trtllm_dasc.spec import EVICTIONS, HOST_WRITE_POLICIES


class Node:
    __slots__ = ("parent", "children", "tokens", "start", "blocks", "ckpt_slot", "lock_ref", "ckpt_lock",
                 "last_access", "ckpt_access", "kv_prev", "kv_next", "ck_prev", "ck_next", "host_slot", "host_access",
                 "hs_prev", "hs_next", "cold")

    def __init__(self, parent, tokens, start, blocks):
        self.parent, self.children = parent, {}
        self.tokens, self.start, self.blocks = list(tokens), start, list(blocks)
        self.ckpt_slot, self.lock_ref, self.last_access, self.ckpt_access = None, 0, 0, 0
        self.ckpt_lock = 0
        self.kv_prev = self.kv_next = self.ck_prev = self.ck_next = None
        self.host_slot, self.host_access, self.hs_prev, self.hs_next = None, 0, None, None
        self.cold = False

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    def path(self):
        """Root-side first, this node last (the root itself excluded)."""
        out, node = [], self
        while node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]


class MatchResult(NamedTuple):
    node: Node            # deepest node whose end is kv_len
    kv_len: int           # tokens of the common prefix that have KV in the tree
    ckpt_len: int         # the usable prefix: deepest checkpoint <= min(kv_len, len - 1); 0 if none
    ckpt_slot: int | None
    block_table: list     # KV blocks covering [0, ckpt_len); the last one is partial when unaligned
    ckpt_node: Node       # the node ending at ckpt_len (the root if none): what a request reuses, so what
                          # it locks (its path's KV, its own checkpoint); the KV beyond it is recomputed
                          # and stays evictable


class RadixCache:
    def __init__(self, block_size: int, blocks: BlockPool, slots: IdPool, interval: int = 256,
                 prompt_only: bool = False, host_slots: IdPool | None = None, eviction: str = "lru",
                 flops_per_token: float = 1.0, slot_bytes: int = 1, alpha: float = 1.0,
                 write_policy: str = "write-back", host_blocks: BlockPool | None = None,
                 flops_per_pair: float = 0.0):
        if block_size < 1 or interval < 1:
            raise ValueError("block_size and interval must be >= 1")
        if eviction not in EVICTIONS:
            raise ValueError(f"eviction must be one of {'|'.join(EVICTIONS)}, got {eviction!r}")
        if write_policy not in HOST_WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {'|'.join(HOST_WRITE_POLICIES)}, got {write_policy!r}")
        self.host_slots, self.eviction, self.write_policy = host_slots, eviction, write_policy
        # the cost rule's value of a checkpoint at position p: the prefill it saves per byte,
        # (p * flops_per_token + flops_per_pair * p (p + 1) / 2) / slot_bytes (model/prefill_flops.py)
        self.flops_per_token, self.flops_per_pair = flops_per_token, flops_per_pair
        self.slot_bytes, self.alpha = slot_bytes, alpha
        self._host_lru = LRUList("hs_prev", "hs_next")
        # checkpoint copies the runner owes, in order: ("demote", device slot, host slot) or
        # ("promote", host slot, device slot); the manager hands them to the next step
        self.copies: list[tuple[str, int, int]] = []
        # host KV (invariant 9): its block pool, the cold nodes, its copies in order (("demote", device block,
        # host block) or ("promote", host block, device block)) and counters
        self.host_blocks = host_blocks
        self._cold_lru = LRUList("kv_prev", "kv_next")
        self.kv_copies: list[tuple[str, int, int]] = []
        self.kv_tier = {"demoted_nodes": 0, "demoted_blocks": 0, "warmed_nodes": 0, "warmed_blocks": 0,
                        "host_evictions": 0}
        self.tier = {"demotions": 0, "demotion_copies": 0, "promotions": 0, "host_evictions": 0,
                     "write_through_copies": 0}
        self.bs, self.blocks, self.slots = block_size, blocks, slots
        self.interval, self.prompt_only = interval, prompt_only
        self.root = Node(None, [], 0, [])
        self._clock = 0
        # nodes whose KV a failed copy left undefined (mark_stale), dropped once no request locks them
        self.stale: set[Node] = set()
        self._kv_lru = LRUList("kv_prev", "kv_next")
        self._ckpt_lru = LRUList("ck_prev", "ck_next")
        self.evictions = {"kv_nodes": 0, "kv_blocks": 0, "checkpoints": 0, "checkpoints_with_kv": 0}
        # checkpoints gone from every tier (evicted, flushed, lost with their KV, or left undefined by a failed
        # copy). The per-tier counters above count copies (a demoted checkpoint is a device eviction, later a
        # host one); this counts each checkpoint once, where its last copy goes (_drop_checkpoint, _drop_host)
        self.dropped = {"checkpoints": 0}

    # ---- lookup ------------------------------------------------------------------------------------
    def match(self, tokens: list[int]) -> MatchResult:
        node, pos, path = self.root, 0, []
        while pos < len(tokens) and tokens[pos] in node.children:
            child = node.children[tokens[pos]]
            if child in self.stale:
                break       # its KV is undefined: the request recomputes from here
            n = _common(child.tokens, tokens, pos)
            if n < len(child.tokens):
                child = self._split(child, child.start + n)
            path.append(child)
            node, pos = child, pos + n
        self._touch_kv(path)
        limit = min(pos, len(tokens) - 1)
        ckpt = next((n for n in reversed(path) if n.end <= limit
                     and (n.ckpt_slot is not None or n.host_slot is not None)), None)
        if ckpt is None:
            return MatchResult(node, pos, 0, None, [], self.root)
        # a host-only checkpoint: ckpt_slot None until the manager promotes it
        if ckpt.ckpt_slot is not None:
            self._touch_ckpt(ckpt)
        else:
            self._touch_host(ckpt)
        return MatchResult(node, pos, ckpt.end, ckpt.ckpt_slot, self.block_table(ckpt), ckpt)

    def miss(self) -> MatchResult:
        """What a request that reuses nothing holds: the root (locking it pins nothing)."""
        return MatchResult(self.root, 0, 0, None, [], self.root)

    def block_table(self, node: Node) -> list[int]:
        """Blocks covering [0, node.end): per block index, the deepest node's block (see invariant 2)."""
        table = []
        for n in node.path():
            first = n.start // self.bs
            for i, block in enumerate(n.blocks):
                if first + i < len(table):
                    table[first + i] = block
                else:
                    table.append(block)
        return table

    def checkpoint_positions(self, prompt_len: int, match: MatchResult) -> list[int]:
        """Where this prompt's prefill stores checkpoints: the interval grid, the branch point (where it
        leaves the cached path: KV there but no checkpoint) and the prompt end. The prompt-end checkpoint
        sits at len - 1, so that a repeat of the same prompt hits it and computes only its last token."""
        last, start = prompt_len - 1, match.ckpt_len
        if last <= start:
            return []
        if self.prompt_only:
            return [last]
        grid = range((start // self.interval + 1) * self.interval, last, self.interval)
        branch = min(match.kv_len, last)
        return sorted({last, *grid} | ({branch} if branch > start else set()))

    # ---- recency -----------------------------------------------------------------------------------
    def _touch_kv(self, path: list[Node]) -> None:
        """Make a root-side-first path the most recent, leaf first, so ancestors end up more recent than
        their descendants (invariant 6; also links nodes new to the list)."""
        for n in reversed(path):
            self._clock += 1
            n.last_access = self._clock
            self._lru_of(n).touch(n)

    def _lru_of(self, n: Node):
        return self._cold_lru if n.cold else self._kv_lru

    def _pool_of(self, n: Node) -> BlockPool:
        return self.host_blocks if n.cold else self.blocks

    def _touch_ckpt(self, node: Node) -> None:
        self._clock += 1
        node.ckpt_access = self._clock
        self._ckpt_lru.touch(node)

    def _touch_host(self, node: Node) -> None:
        self._clock += 1
        node.host_access = self._clock
        self._host_lru.touch(node)

    # ---- locks and references ----------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """Pin the KV of the path to ``node`` and the checkpoint of ``node`` alone (invariant 4)."""
        node.ckpt_lock += 1
        while node is not None:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        if node.ckpt_lock <= 0 or node.lock_ref <= 0:
            raise RuntimeError("unlock of a node that is not locked")
        node.ckpt_lock -= 1
        while node is not None:
            node.lock_ref -= 1
            node = node.parent

    # ---- allocation with eviction ------------------------------------------------------------------
    def make_room(self, num_blocks: int) -> bool:
        """Evict LRU unlocked leaves until ``num_blocks`` KV blocks are free; False if they cannot be."""
        while self.blocks.num_free < num_blocks:
            if not self._evict_kv_leaf():
                return False
        return True

    def alloc_slot(self) -> int | None:
        """A free checkpoint slot, evicting the LRU unlocked checkpoint; None if every one is pinned."""
        while (slot := self.slots.try_alloc()) is None:
            if not self._evict_checkpoint():
                return None
        return slot

    def _kv_victim(self) -> Node | None:
        """The LRU unlocked leaf: the first unlocked node from the LRU end (a leaf by invariant 6)."""
        return next((n for n in self._kv_lru if n.lock_ref == 0), None)

    def _ckpt_victim(self) -> Node | None:
        """The device checkpoint to evict among those no request has locked on its own node: the least
        recently used one, or (cost) the least useful one."""
        if self.eviction == "cost":
            return self._cost_victim([n for n in self._ckpt_lru if n.ckpt_lock == 0], "ckpt_access")
        return next((n for n in self._ckpt_lru if n.ckpt_lock == 0), None)

    def _host_victim(self) -> Node | None:
        """Likewise among the host copies (a locked node's copy may be a pending promotion's source)."""
        if self.eviction == "cost":
            return self._cost_victim([n for n in self._host_lru if n.ckpt_lock == 0], "host_access")
        return next((n for n in self._host_lru if n.ckpt_lock == 0), None)

    def value(self, node: Node) -> float:
        """Prefill FLOPs a hit on this checkpoint saves, per byte it occupies (a checkpoint's eviction frees its
        slot only: the KV on its path is evicted on its own). The attention term makes it grow faster than the
        prefix: with it the rule is more than recency and length."""
        p = node.end
        return (p * self.flops_per_token + self.flops_per_pair * p * (p + 1) / 2) / self.slot_bytes

    def _cost_victim(self, candidates: list[Node], stamp: str) -> Node | None:
        """Marconi's rule: the smallest recency + alpha * efficiency, both min-max normalised over the
        candidates (efficiency by its maximum: all are >= 0); ties go to the least recent (list order)."""
        if not candidates:
            return None
        stamps = [getattr(n, stamp) for n in candidates]
        lo, span = min(stamps), max(stamps) - min(stamps)
        values = [self.value(n) for n in candidates]
        top = max(values) or 1.0
        scores = [((t - lo) / span if span else 0.0) + self.alpha * v / top for t, v in zip(stamps, values)]
        return candidates[min(range(len(candidates)), key=scores.__getitem__)]

    def _evict_checkpoint(self, demote: bool = True) -> bool:
        """Evict one device checkpoint: demoted to the host tier when there is one (and ``demote``)."""
        victim = self._ckpt_victim()
        if victim is None:
            return False
        if demote and self.host_slots is not None:
            if victim.host_slot is None:
                host = self._alloc_host_slot()
                if host is not None:
                    # write-back: the device slot's bytes go to the host before anything reuses the slot
                    self.copies.append(("demote", victim.ckpt_slot, host))
                    victim.host_slot = host
                    self._touch_host(victim)
                    self.tier["demotion_copies"] += 1
            if victim.host_slot is not None:
                self.tier["demotions"] += 1
        self._drop_checkpoint(victim)
        self.evictions["checkpoints"] += 1
        return True

    def _alloc_host_slot(self) -> int | None:
        while (slot := self.host_slots.try_alloc()) is None:
            victim = self._host_victim()
            if victim is None:
                return None
            self._drop_host(victim)
        return slot

    def _drop_host(self, node: Node, evicted: bool = True) -> None:
        """Free a checkpoint's host copy. ``evicted``: the host tier's choice (LRU, its KV gone, a flush), a host
        eviction (dasc_host_evictions_total); a copy a failed transfer left undefined is no eviction."""
        if evicted:
            self.tier["host_evictions"] += 1
        self.host_slots.free(node.host_slot)
        node.host_slot = None
        self._host_lru.remove(node)
        self._note_gone(node)

    def _note_gone(self, node: Node) -> None:
        """Count a checkpoint whose last copy just went (called after each copy's drop, so exactly once)."""
        if node.ckpt_slot is None and node.host_slot is None:
            self.dropped["checkpoints"] += 1

    def promote(self, node: Node) -> int | None:
        """Give a host-only checkpoint a device slot (queueing the copy host -> device); the host copy
        stays. Returns the device slot, or None when every device checkpoint is pinned."""
        assert node.ckpt_slot is None and node.host_slot is not None, "promote of a checkpoint not host-only"
        slot = self.alloc_slot()
        if slot is None:
            return None
        self.copies.append(("promote", node.host_slot, slot))
        node.ckpt_slot = slot
        self._touch_ckpt(node)
        self.tier["promotions"] += 1
        return slot

    def _evict_kv_leaf(self, demote: bool = True) -> bool:
        victim = self._kv_victim()
        if victim is None:
            return False
        assert not any(not c.cold for c in victim.children.values()), "the KV LRU list put a parent before its child"
        if self.host_blocks is not None:
            keep = victim.children or victim.ckpt_slot is not None or victim.host_slot is not None
            if demote and keep and self._demote_kv(victim):
                return True
            # not kept: its cold subtree goes with it
            for c in list(victim.children.values()):
                self._drop_cold_subtree(c)
        self._drop_node(victim)
        return True

    def _demote_kv(self, node: Node) -> bool:
        """Move a warm node's KV to host blocks (copies queued); False when the host has no room."""
        while self.host_blocks.num_free < len(node.blocks):
            if not self._evict_cold_leaf():
                return False
        host = self.host_blocks.alloc(len(node.blocks))
        self.kv_copies.extend(("demote", b, h) for b, h in zip(node.blocks, host))
        self.blocks.decref(node.blocks)
        self._kv_lru.remove(node)
        node.blocks, node.cold = host, True
        # a fresh stamp: more recent than its cold descendants (they stay LRU-side of it)
        self._touch_kv([node])
        self.kv_tier["demoted_nodes"] += 1
        self.kv_tier["demoted_blocks"] += len(host)
        return True

    def _evict_cold_leaf(self) -> bool:
        """Drop the LRU unlocked cold node (a leaf: its children are cold and older, see invariant 9)."""
        victim = next((n for n in self._cold_lru if n.lock_ref == 0), None)
        if victim is None:
            return False
        assert not victim.children, "the cold LRU list put a parent before its child"
        self._drop_node(victim)
        self.kv_tier["host_evictions"] += 1
        return True

    def in_tree(self, node: Node) -> bool:
        while node.parent is not None:
            if node.parent.children.get(node.tokens[0]) is not node:
                return False
            node = node.parent
        return node is self.root

    def mark_stale(self, node: Node) -> None:
        """A failed copy left one of ``node``'s KV blocks undefined: from now on no match reaches it or below,
        and it goes (with its subtree) once no request locks it (drop_stale). A request that locks it now
        keeps running only if it does not read that block (CacheManager.copies_failed tells which do)."""
        self.stale.add(node)

    def drop_stale(self) -> None:
        """Drop the stale nodes no request locks any more (locks pass through a path: the subtree is free)."""
        for n in list(self.stale):
            if not self.in_tree(n):
                self.stale.discard(n)
            elif n.lock_ref == 0:
                self.drop_subtree(n)
                self.stale.discard(n)

    def drop_subtree(self, node: Node) -> None:
        """Drop an unlocked node and everything below it (KV and checkpoints, both tiers)."""
        assert node.lock_ref == 0, "drop of a locked subtree"
        for c in list(node.children.values()):
            self.drop_subtree(c)
        self._drop_node(node)

    def _drop_cold_subtree(self, node: Node) -> None:
        for c in list(node.children.values()):
            self._drop_cold_subtree(c)
        self._drop_node(node)
        self.kv_tier["host_evictions"] += 1

    def warm(self, node: Node, also: int = 0) -> bool:
        """Give every cold node of the path to ``node`` (locked by the caller) device blocks, queueing the
        copies host -> device, with ``also`` blocks left free after; False (nothing changed) when the device
        has no room."""
        path = node.path()
        cold = [n for n in path if n.cold]
        if not self.make_room(sum(len(n.blocks) for n in cold) + also):
            return False
        for n in cold:
            dev = self.blocks.alloc(len(n.blocks))
            self.kv_copies.extend(("promote", h, d) for h, d in zip(n.blocks, dev))
            self.host_blocks.decref(n.blocks)
            self._cold_lru.remove(n)
            n.blocks, n.cold = dev, False
            self.kv_tier["warmed_nodes"] += 1
            self.kv_tier["warmed_blocks"] += len(dev)
        self._touch_kv(path)
        return True

    def _drop_node(self, victim: Node) -> None:
        """Take a childless node out of the tree with its KV and both checkpoint copies."""
        if victim.ckpt_slot is not None:
            self._drop_checkpoint(victim)
            self.evictions["checkpoints_with_kv"] += 1
        if victim.host_slot is not None:
            self._drop_host(victim)
        self._pool_of(victim).decref(victim.blocks)
        del victim.parent.children[victim.tokens[0]]
        self._lru_of(victim).remove(victim)
        if not victim.cold:
            self.evictions["kv_nodes"] += 1
            self.evictions["kv_blocks"] += len(victim.blocks)

    def _drop_checkpoint(self, node: Node) -> None:
        self.slots.free(node.ckpt_slot)
        node.ckpt_slot = None
        self._ckpt_lru.remove(node)
        self._note_gone(node)

    # ---- insertion ---------------------------------------------------------------------------------
    def insert(self, tokens: list[int], block_table: list[int], checkpoints: dict[int, int]) -> int:
        """Give the tree a finished prefill: ``block_table`` covers every position of ``tokens`` with valid
        KV; ``checkpoints`` maps position -> slot (the state after that many tokens). The tree takes its
        own block references (the request keeps and later releases its own) and takes ownership of the
        slots; a slot whose position already has a device checkpoint is freed, one whose position has a
        host-only checkpoint becomes that checkpoint's device copy. Returns how many checkpoints are new to
        the tree (in neither tier before)."""
        if len(block_table) * self.bs < len(tokens):
            raise ValueError("block_table does not cover the tokens")
        for p in checkpoints:
            if not 0 < p <= len(tokens):
                raise ValueError(f"checkpoint position {p} outside 1..{len(tokens)}")
        node, pos, path = self.root, 0, []
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                blocks = block_table[pos // self.bs:(len(tokens) - 1) // self.bs + 1]
                child = Node(node, tokens[pos:], pos, blocks)
                self.blocks.incref(blocks)
                node.children[tokens[pos]] = child
            n = _common(child.tokens, tokens, pos)
            if n < len(child.tokens):
                child = self._split(child, child.start + n)
            if child.cold:
                # the request holds valid KV for every position of it: warm it from the request's blocks
                self.host_blocks.decref(child.blocks)
                self._cold_lru.remove(child)
                child.blocks = block_table[child.start // self.bs:(child.end - 1) // self.bs + 1]
                self.blocks.incref(child.blocks)
                child.cold = False
            path.append(child)
            node, pos = child, pos + n
        self._touch_kv(path)
        new, stored = 0, []
        for p, slot in sorted(checkpoints.items()):
            at = self._boundary(node, p)
            if at.ckpt_slot is None:
                # a host-only checkpoint here (a concurrent request's, demoted since) gains a device copy
                # for free: the same checkpoint, not a new one (checkpoints_dropped counts it once)
                new += at.host_slot is None
                at.ckpt_slot = slot
                stored.append(at)
            else:
                self.slots.free(slot)
        # deepest first, like the KV path: a shallower checkpoint serves every prompt the deeper one
        # serves, so it ends up the more recent one
        for at in reversed(stored):
            self._touch_ckpt(at)
        if self.write_policy == "write-through" and self.host_slots is not None:
            for at in reversed(stored):
                self._write_through(at)
        return new

    def _write_through(self, node: Node) -> None:
        """Queue the host copy of a checkpoint just stored (its device slot was filled by an earlier step's
        store, so the copy, queued for the next step, reads it after that store)."""
        if node.host_slot is not None:
            return
        host = self._alloc_host_slot()
        if host is None:
            # every host copy is pinned: this one is copied on its eviction instead (write-back)
            return
        self.copies.append(("demote", node.ckpt_slot, host))
        node.host_slot = host
        self._touch_host(node)
        self.tier["write_through_copies"] += 1

    def _boundary(self, leaf: Node, p: int) -> Node:
        """The node ending exactly at position p on the path to ``leaf`` (splitting an edge if needed)."""
        node = leaf
        while node.start >= p:
            node = node.parent
        return node if node.end == p else self._split(node, p)

    def _split(self, node: Node, p: int) -> Node:
        """Cut ``node`` at absolute position p: a new parent keeps [start, p); ``node`` keeps [p, end) and
        its identity (requests hold locks on it), its checkpoint and children."""
        k = p - node.start
        first, split_block = node.start // self.bs, (p - 1) // self.bs
        top = Node(node.parent, node.tokens[:k], node.start, node.blocks[:split_block - first + 1])
        # the path locks through node pass through top; node keeps its checkpoint, so its checkpoint locks
        top.lock_ref, top.last_access, top.children = node.lock_ref, node.last_access, {node.tokens[k]: node}
        top.cold = node.cold
        if node in self.stale:
            # the undefined block may be in either half: both stay unmatchable until dropped
            self.mark_stale(top)
        node.parent.children[node.tokens[0]] = top
        # the new parent must be more recent than node yet older than everything node was older than
        self._lru_of(node).insert_after(node, top)
        rest = node.blocks[p // self.bs - first:]
        if p % self.bs:
            # both halves touch the block that holds position p: the tree now holds it twice
            self._pool_of(node).incref(rest[0])
        node.parent, node.tokens, node.start, node.blocks = top, node.tokens[k:], p, rest
        return top

    def flush(self) -> None:
        """Drop every unlocked checkpoint (both tiers) and KV node (the paper's flush between workload phases)."""
        while self._evict_checkpoint(demote=False):
            pass
        for n in [n for n in self._host_lru if n.ckpt_lock == 0]:
            self._drop_host(n)
        while self._evict_kv_leaf(demote=False):
            pass
        while self._evict_cold_leaf():
            pass

    # ---- introspection -----------------------------------------------------------------------------
    def _nodes(self):
        """Every non-root node, each before its children."""
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            yield n

    def num_checkpoints(self) -> int:
        return len(self._ckpt_lru)

    def num_host_checkpoints(self) -> int:
        return len(self._host_lru)

    def host_checkpoint_slots(self) -> set[int]:
        return {n.host_slot for n in self._nodes() if n.host_slot is not None}

    def host_block_refs(self) -> dict[int, int]:
        refs: dict[int, int] = {}
        for n in self._nodes():
            for b in (n.blocks if n.cold else []):
                refs[b] = refs.get(b, 0) + 1
        return refs

    def checkpoint_slots(self) -> set[int]:
        """The slots the tree holds (a check, O(nodes))."""
        return {n.ckpt_slot for n in self._nodes() if n.ckpt_slot is not None}

    def tree_block_refs(self) -> dict[int, int]:
        refs: dict[int, int] = {}
        for n in self._nodes():
            for b in ([] if n.cold else n.blocks):
                refs[b] = refs.get(b, 0) + 1
        return refs

    def sanity_check(self, request_block_refs: dict[int, int] | None = None,
                     request_locks: dict[Node, int] | None = None) -> None:
        """Assert the invariant. ``request_block_refs``: the in-flight requests' references, if known
        (then every allocator count must equal tree + request references exactly). ``request_locks``:
        {node: locks the in-flight requests took on exactly that node}, if known (then every lock_ref must
        equal the locks taken on the node and its descendants)."""
        check_tree(self, request_block_refs, request_locks)


def _common(edge: list[int], tokens: list[int], pos: int) -> int:
    n = 0
    limit = min(len(edge), len(tokens) - pos)
    while n < limit and edge[n] == tokens[pos + n]:
        n += 1
    return n
