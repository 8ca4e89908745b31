"""The cache manager: the one owner of KV blocks, checkpoint slots, state rows and the radix tree.

The scheduler (and the tests' simulator) reach the bookkeeping through this API alone:
  admit    reserve what a request will use (rows, KV blocks, the lock on what it reuses), or wait;
  extend   checkpoint slots for the boundaries one prefill chunk captures;
  store    book a step's captures (kept by the request until its prompt is inserted, or freed);
  insert   hand a finished prompt's KV and checkpoints to the tree;
  end_replay / release / abort   give back a replay's scratch, a whole request, a failed step's slots;
  evict    drop everything unpinned (the paper's flush between phases);
  take_copies / copies_failed   the checkpoint copies between tiers a step runs first (demotions, then
           promotions), and what failed copies leave undefined (dropped; the leases that read it named);
  stats / reset_stats   the counters the engine reports (and warm-up zeroes).

Ints only, like the rest of cache/: a Lease is what one admitted request holds. Nothing here knows plans,
sequences or tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_dasc.cache.allocators import BlockPool, IdPool, fresh_blocks, reserve_table
from trtllm_dasc.cache.radix import MatchResult, RadixCache


@dataclass(slots=True)
class Replay:
    """A pending dasc-wr replay: tokens [start, end) from a zero scratch row, on its own KV table (the
    shared blocks before start, then blocks of its own for what it recomputes)."""

    start: int
    end: int
    row: int
    table: list[int]


@dataclass(slots=True, eq=False)
class Lease:
    """What one admitted request holds until ``release``."""

    match: MatchResult                    # what admission reuses; match.ckpt_node is locked until release
    row: int                              # active recurrent-state row
    table: list[int]                      # KV blocks for positions [0, end_len)
    positions: list[int]                  # where this prompt's prefill stores checkpoints
    copies: list[tuple[int, int]] = field(default_factory=list)   # (src, dst) blocks copied before writing
    replay: Replay | None = None
    captured: dict = field(default_factory=dict)   # position -> checkpoint slot, handed to the tree at insert
    promoted: bool = False                # its checkpoint is being copied from the host tier (admission's)


class CacheManager:
    def __init__(self, tree: RadixCache, rows: IdPool):
        """Around an existing tree (its block pool, slot pool and host slot pool) and a pool of state rows."""
        self.tree, self.rows = tree, rows
        self.blocks, self.slots, self.bs = tree.blocks, tree.slots, tree.bs
        # per tier: admissions that reused a checkpoint found there, and the tokens they reused
        self.hits = {"device": 0, "host": 0}
        self.hit_tokens = {"device": 0, "host": 0}

    @classmethod
    def create(cls, block_size: int, num_blocks: int, num_slots: int, num_rows: int, interval: int = 256,
               prompt_only: bool = False, host_slots: int = 0, eviction: str = "lru", flops_per_token: float = 1.0,
               slot_bytes: int = 1, flops_per_pair: float = 0.0, write_policy: str = "write-back", host_kv_blocks: int = 0) -> "CacheManager":
        """A fresh manager: empty tree, every block, slot and row free; ``host_slots`` > 0 adds the host tier
        (host slot ids 0..host_slots-1: no reserved one, the host pool has no table that needs a zero id)."""
        host = IdPool(range(host_slots), "host checkpoint slot") if host_slots else None
        tree = RadixCache(block_size, BlockPool(num_blocks), IdPool.checkpoint_slots(num_slots), interval=interval,
                          prompt_only=prompt_only, host_slots=host, eviction=eviction,
                          flops_per_token=flops_per_token, flops_per_pair=flops_per_pair, slot_bytes=slot_bytes,
                          write_policy=write_policy,
                          host_blocks=BlockPool(host_kv_blocks) if host_kv_blocks else None)
        return cls(tree, IdPool.rows(num_rows))

    # ---- admission -----------------------------------------------------------------------------------
    def admit(self, prompt: list[int], end_len: int, use_cache: bool = True, replay_window: int = 0,
              idle: bool = False, max_replay: float = float("inf")) -> Lease | None:
        """Reserve a request's rows, KV blocks and prefix lock; None when it must wait (nothing held).
        ``max_replay``: a hit whose replay would run more tokens than this waits (the step's token budget
        left: a replay runs whole in the step that admits it)."""
        bs, tree = self.bs, self.tree
        m = tree.match(prompt) if use_cache else tree.miss()
        c = m.ckpt_len
        replay_start = max(0, c - replay_window) if (replay_window and c) else None
        if replay_start is not None and c - replay_start > max_replay:
            return None
        if self.rows.num_free < 1 + (replay_start is not None):
            return None
        # only the reused prefix is pinned: the cached KV beyond the checkpoint gets recomputed
        tree.lock(m.ckpt_node)
        need = fresh_blocks(c, end_len, bs)
        if replay_start is not None:
            need += fresh_blocks(replay_start, c, bs)
        if not tree.make_room(need):
            tree.unlock(m.ckpt_node)
            if not idle or not c:
                return None
            # the hit itself pins what it needs (the partial block it copies, the replay's source): with
            # nothing running, a miss always fits (check_fits), so take it as one
            m, replay_start = tree.miss(), None
            tree.lock(m.ckpt_node)
            if not tree.make_room(fresh_blocks(0, end_len, bs)):
                tree.unlock(m.ckpt_node)
                return None
        if m.ckpt_len and m.ckpt_node.cold:
            # the reused prefix's KV (some of it) is on the host: device blocks and copies back first
            if tree.warm(m.ckpt_node, also=need):
                m = m._replace(block_table=tree.block_table(m.ckpt_node))
            else:
                tree.unlock(m.ckpt_node)
                m, replay_start = tree.miss(), None
                tree.lock(m.ckpt_node)
                if not tree.make_room(fresh_blocks(0, end_len, bs)):
                    tree.unlock(m.ckpt_node)
                    return None
        tier = "device"
        if m.ckpt_len and m.ckpt_slot is None:
            # a host-only checkpoint (locked above, so its host copy stays): copy it into a device slot first
            tier, m = "host", self._promote(m)
            if m is None:
                # every device checkpoint is pinned by running requests: reuse nothing
                m, replay_start = tree.miss(), None
                tree.lock(m.ckpt_node)
                if not tree.make_room(fresh_blocks(0, end_len, bs)):
                    tree.unlock(m.ckpt_node)
                    return None
        if m.ckpt_len:
            self.hits[tier] += 1
            self.hit_tokens[tier] += m.ckpt_len
        lease = self._reserve(prompt, end_len, m, replay_start)
        lease.promoted = tier == "host" and bool(m.ckpt_len)
        return lease

    def _promote(self, m: MatchResult) -> MatchResult | None:
        """The match with its checkpoint promoted to a device slot; None (nothing locked) if none is free."""
        slot = self.tree.promote(m.ckpt_node)
        if slot is None:
            self.tree.unlock(m.ckpt_node)
            return None
        return m._replace(ckpt_slot=slot)

    def _reserve(self, prompt, end_len, m: MatchResult, replay_start) -> Lease:
        c = m.ckpt_len
        table, copy = reserve_table(self.blocks, m.block_table, c, end_len, self.bs)
        lease = Lease(m, self.rows.try_alloc(), table, self.tree.checkpoint_positions(len(prompt), m))
        if copy:
            lease.copies.append(copy)
        if replay_start is not None:
            row = self.rows.try_alloc()
            rtable, copy = reserve_table(self.blocks, m.block_table, replay_start, c, self.bs)
            if copy:
                lease.copies.append(copy)
            lease.replay = Replay(replay_start, c, row, rtable)
        return lease

    # ---- prefill -------------------------------------------------------------------------------------
    def extend(self, lease: Lease, done: int, end: int) -> list[tuple[int, int]]:
        """(position, slot) for each checkpoint a prefill chunk [done, end) captures, evicting as needed."""
        captures = []
        for p in lease.positions:
            if done < p <= end:
                slot = self.tree.alloc_slot()
                # None: every checkpoint is pinned by running requests, this boundary goes uncached
                if slot is not None:
                    captures.append((p, slot))
        return captures

    def store(self, lease: Lease, captures: list[tuple[int, int]], stored: list[bool]) -> None:
        """Book a step's captures: a stored one is the lease's until insert, a failed one is freed."""
        for (pos, slot), ok in zip(captures, stored, strict=True):
            if ok:
                lease.captured[pos] = slot
            else:
                self.slots.free(slot)

    def insert(self, lease: Lease, prompt: list[int]) -> int:
        """Give the tree a prefilled prompt and its captured checkpoints; returns how many it kept (new to
        the cache: a capture that became the device copy of a host-only checkpoint is none)."""
        kept = self.tree.insert(prompt, lease.table, lease.captured)
        lease.captured = {}
        return kept

    # ---- giving back ---------------------------------------------------------------------------------
    def end_replay(self, lease: Lease) -> None:
        """The replay ran: free its scratch row and KV table."""
        self.blocks.decref(lease.replay.table)
        self.rows.free(lease.replay.row)
        lease.replay = None

    def release(self, lease: Lease) -> None:
        """Give back everything a lease holds (finished, failed or aborted request)."""
        if lease.replay is not None:
            self.end_replay(lease)
        for slot in lease.captured.values():
            self.slots.free(slot)
        lease.captured = {}
        self.blocks.decref(lease.table)
        lease.table = []
        self.tree.unlock(lease.match.ckpt_node)
        self.rows.free(lease.row)
        lease.row = -1
        if self.tree.stale:
            self.tree.drop_stale()

    def abort(self, captures: list[tuple[int, int]]) -> None:
        """A step failed: free the slots its captures were to fill (never handed to a lease)."""
        for _, slot in captures:
            self.slots.free(slot)

    def evict(self) -> None:
        """Drop every checkpoint (both tiers) and KV node no running request pins."""
        self.tree.flush()

    # ---- copies between the tiers --------------------------------------------------------------------
    def take_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The copies the bookkeeping so far assumes done: (demotions [(device slot, host slot)], promotions
        [(host slot, device slot)]). The runner runs every demotion, then every promotion, before the step's
        loads and stores: safe, since a promotion's host source is locked (no demotion of the same step
        overwrites it) and a demotion's device source is read before a promotion reuses the slot."""
        copies, self.tree.copies = self.tree.copies, []
        return ([(a, b) for k, a, b in copies if k == "demote"], [(a, b) for k, a, b in copies if k == "promote"])

    def take_kv_copies(self) -> list[tuple[str, int, int]]:
        """The host KV copies the bookkeeping so far assumes done, in order: ("demote", device block, host
        block) or ("promote", host block, device block). Run in this order (a host block a warm freed may be
        the next demotion's)."""
        copies, self.tree.kv_copies = self.tree.kv_copies, []
        return copies

    def copies_failed(self, demotions, promotions, kv_copies=(), failed=None, leases=()) -> dict:
        """Copies failed: what they leave undefined is dropped, the checkpoints (the host copies demotions and
        write-throughs were to write, the device copies promotions were to write) if nothing reused them since,
        and the prefix nodes whose KV blocks host KV copies were to write (with their subtrees: a warmed node
        when the failed requests that locked it are released). ``failed``: per copy (demotions, promotions,
        then kv_copies: the order they ran), whether it failed; None: all of them (a failed step). Returns, of
        ``leases``, each that reads what a failed copy left undefined (a promoted checkpoint, a warmed KV
        block), with the index of that copy."""
        ckpt = [("demote", d, h) for d, h in demotions] + [("promote", h, d) for h, d in promotions]
        failed = [True] * (len(ckpt) + len(kv_copies)) if failed is None else list(failed)
        bad = undefined(ckpt, failed[:len(ckpt)])
        bad_kv = undefined(list(kv_copies), failed[len(ckpt):], offset=len(ckpt))
        host, device = ({i for (tier, i) in bad if tier == t} for t in ("host", "device"))
        kv_host, kv_device = ({b for (tier, b) in bad_kv if tier == t} for t in ("host", "device"))
        for n in list(self.tree._nodes()):
            if n.host_slot in host:
                self.tree._drop_host(n, evicted=False)
            if n.ckpt_slot in device:
                self.tree._drop_checkpoint(n)
            if set(n.blocks) & (kv_host if n.cold else kv_device):
                self.tree.mark_stale(n)
        hurt = {}
        for lease in leases:
            if lease.match.ckpt_slot in device:
                hurt[lease] = bad[("device", lease.match.ckpt_slot)]
                continue
            # the shared prefix it reads (a partial block's copy source included) and its own tables
            tables = [lease.match.block_table, lease.table] + ([lease.replay.table] if lease.replay else [])
            read = next((b for t in tables for b in t if b in kv_device), None)
            if read is not None:
                hurt[lease] = bad_kv[("device", read)]
        self.tree.drop_stale()
        return hurt

    # ---- counters ------------------------------------------------------------------------------------
    def stats(self) -> dict:
        """The engine's cache counters (the keys of Engine.stats)."""
        return {"evictions": dict(self.tree.evictions), "checkpoint_slots": self.slots.capacity,
                "checkpoint_slots_free": self.slots.num_free, "checkpoints_cached": self.tree.num_checkpoints(),
                "kv_blocks": self.blocks.num_blocks, "kv_blocks_free": self.blocks.num_free,
                "state_rows": self.rows.capacity, "state_rows_free": self.rows.num_free,
                "checkpoints_dropped": self.tree.dropped["checkpoints"], **self.tier_stats()}

    def tier_stats(self) -> dict:
        """The host tier's counters (zeros and empty pools with the tier off)."""
        tree, host = self.tree, self.tree.host_slots
        cached = {"device": tree.num_checkpoints(), "host": tree.num_host_checkpoints()}
        return {"host_checkpoint_slots": host.capacity if host else 0,
                "host_checkpoint_slots_free": host.num_free if host else 0,
                "host_checkpoints_cached": cached["host"], "eviction": tree.eviction,
                "host_write_policy": tree.write_policy,
                "checkpoint_bytes": {t: n * tree.slot_bytes for t, n in cached.items()},
                "checkpoint_hits": dict(self.hits), "checkpoint_hit_tokens": dict(self.hit_tokens),
                **{f"checkpoint_{k}": v for k, v in tree.tier.items()},
                "host_kv_blocks": tree.host_blocks.num_blocks if tree.host_blocks else 0,
                "host_kv_blocks_free": tree.host_blocks.num_free if tree.host_blocks else 0,
                "kv_tier": dict(tree.kv_tier)}

    def reset_stats(self) -> None:
        """Zero the eviction and tier counters (after warm-up)."""
        for counters in (self.tree.evictions, self.tree.dropped, self.tree.tier, self.tree.kv_tier, self.hits,
                         self.hit_tokens):
            for kind in counters:
                counters[kind] = 0

    def sanity_check(self, leases) -> None:
        """Every block reference, slot, row and lock is accounted for by the tree or one of ``leases``."""
        refs, locks, rows, slots = {}, {}, set(), set()
        for lease in leases:
            tables = [lease.table] + ([lease.replay.table] if lease.replay else [])
            for t in tables:
                for b in t:
                    refs[b] = refs.get(b, 0) + 1
            held = [lease.row] + ([lease.replay.row] if lease.replay else [])
            assert not rows & set(held), "a state row is held twice"
            rows.update(held)
            assert not slots & set(lease.captured.values()), "a captured slot is held twice"
            slots.update(lease.captured.values())
            locks[lease.match.ckpt_node] = locks.get(lease.match.ckpt_node, 0) + 1
        assert rows == self.rows.used_ids(), f"state rows {sorted(self.rows.used_ids())} != held {sorted(rows)}"
        self.rows.sanity_check()
        self.slots.sanity_check()
        self.blocks.sanity_check()
        self.tree.sanity_check(refs, locks)
        tree = self.tree.checkpoint_slots()
        assert not tree & slots and tree | slots == self.slots.used_ids(), "checkpoint slots leaked or shared"


def undefined(copies, failed, offset: int = 0) -> dict:
    """Where copies run in order ("demote", device id, host id) / ("promote", host id, device id), what they
    leave undefined: {("device"|"host", id): index (plus offset) of the failed copy that left it so}. A copy
    that failed, or that read what such a copy left (a promotion from a host slot whose demotion failed in the
    same step), leaves its destination undefined; one that succeeded defines it again."""
    bad = {}
    for i, ((kind, a, b), f) in enumerate(zip(copies, failed, strict=True)):
        src, dst = (("device", a), ("host", b)) if kind == "demote" else (("host", a), ("device", b))
        if f:
            bad[dst] = offset + i
        elif src in bad:
            bad[dst] = bad[src]
        else:
            bad.pop(dst, None)
    return bad
