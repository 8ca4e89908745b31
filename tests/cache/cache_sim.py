"""A brute-force driver of the radix cache: it plays the engine's part with simulated KV contents, on the
engine's own allocators (BlockPool, IdPool).

Every KV cell a request computes holds (position, hash of the prefix through it); every checkpoint slot
holds the exact prefix it summarises. Reading them back through the tree checks the tree's bookkeeping
against what was really written, independently of how the tree stores it.
"""
from collections import Counter


def prompt_stream(rng, n):
    """Prompts built from a few shared prefixes (few-shot headers, conversations) plus random tails."""
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(3, 30))] for _ in range(6)]
    for _ in range(n):
        base = rng.choice(prefixes)
        cut = rng.randrange(0, len(base) + 1)
        tail = [rng.randrange(50) for _ in range(rng.randrange(1, 12))]
        yield base[:cut] + tail


class Sim:
    def __init__(self, cache, num_blocks):
        self.cache, self.bs = cache, cache.bs
        self.cells = [[None] * cache.bs for _ in range(num_blocks)]
        self.slot_content = {}
        self.inflight = []          # (match, table, tokens)
        self.pins = []              # nodes locked by something other than a request (a hit's lock below root)

    def cell(self, tokens, p):
        return (p, hash(tuple(tokens[:p + 1])))

    def start(self, tokens, expect=None):
        """match -> lock -> reuse (copy-on-write) -> compute the rest -> store checkpoints -> insert."""
        c = self.cache
        if expect is not None:
            kv, ck = expect
        m = c.match(tokens)
        if expect is not None:
            assert (m.kv_len, m.ckpt_len) == (kv, ck), ((m.kv_len, m.ckpt_len), (kv, ck))
        c.lock(m.ckpt_node)
        for p in range(m.ckpt_len):
            assert self.cells[m.block_table[p // self.bs]][p % self.bs] == self.cell(tokens, p), "stale KV reused"
        if m.ckpt_slot is not None:
            assert self.slot_content[m.ckpt_slot] == tuple(tokens[:m.ckpt_len]), "wrong checkpoint loaded"
        table = list(m.block_table)
        c.acquire_blocks(table)
        if m.ckpt_len % self.bs:
            # the last reused block is shared and partial: copy its rows before writing after them
            fresh = c.alloc_block()
            if fresh is None:
                return self._give_up(m, table)
            self.cells[fresh] = list(self.cells[table[-1]])
            c.release_blocks([table[-1]])
            table[-1] = fresh
        while len(table) * self.bs < len(tokens):
            b = c.alloc_block()
            if b is None:
                return self._give_up(m, table)
            table.append(b)
        for p in range(m.ckpt_len, len(tokens)):
            self.cells[table[p // self.bs]][p % self.bs] = self.cell(tokens, p)
        ckpts = {}
        for p in c.checkpoint_positions(len(tokens), m):
            s = c.alloc_slot()
            if s is not None:
                self.slot_content[s] = tuple(tokens[:p])
                ckpts[p] = s
        c.insert(tokens, table, ckpts)
        self.inflight.append((m, table, tokens))
        return m

    def _give_up(self, m, table):
        """Out of KV blocks while others are pinned: leave nothing allocated."""
        self.cache.release_blocks(table)
        self.cache.unlock(m.ckpt_node)
        return None

    def finish(self, i=0):
        m, table, _ = self.inflight.pop(i)
        self.cache.unlock(m.ckpt_node)
        self.cache.release_blocks(table)

    def request_refs(self):
        return Counter(b for _, table, _ in self.inflight for b in table)

    def pin(self, node):
        self.cache.lock(node)
        self.pins.append(node)

    def unpin(self, i=0):
        self.cache.unlock(self.pins.pop(i))

    def unpin_all(self):
        while self.pins:
            self.unpin()

    def request_locks(self):
        return Counter([m.ckpt_node for m, _, _ in self.inflight] + self.pins)

    def check(self):
        c = self.cache
        c.sanity_check(dict(self.request_refs()), dict(self.request_locks()))
        c.blocks.sanity_check()
        c.slots.sanity_check()
        for node in c._nodes():
            prefix = [t for n in node.path() for t in n.tokens]
            table = c.block_table(node)
            for p in range(node.end):
                assert self.cells[table[p // self.bs]][p % self.bs] == self.cell(prefix, p), "tree KV corrupt"
            if node.ckpt_slot is not None:
                assert self.slot_content[node.ckpt_slot] == tuple(prefix), "tree checkpoint corrupt"
        for n in [m.ckpt_node for m, _, _ in self.inflight] + self.pins:
            # a locked node's path is still in the tree, with its checkpoint
            while n.parent is not None:
                n = n.parent
            assert n is c.root, "locked node evicted"

    def flat_sets(self):
        kv, ck = set(), set()
        for node in self.cache._nodes():
            prefix = tuple(t for n in node.path() for t in n.tokens)
            kv.update(prefix[:p] for p in range(node.start + 1, node.end + 1))
            if node.ckpt_slot is not None:
                ck.add(prefix)
        return kv, ck

    def expected_match(self, tokens):
        kv, ck = self.flat_sets()
        kv_len = max((p for p in range(1, len(tokens) + 1) if tuple(tokens[:p]) in kv), default=0)
        limit = min(kv_len, len(tokens) - 1)
        ckpt = max((p for p in range(1, limit + 1) if tuple(tokens[:p]) in ck), default=0)
        return kv_len, ckpt
