"""A brute-force runner under the real scheduler and cache manager, with simulated KV contents.

The scheduler (engine.scheduler.Scheduler) admits each prompt through the cache manager and plans its
prefill as one chunk; this simulator executes the plan as the model would, on simulated memory: every KV
cell a request computes holds (position, hash of the prefix through it), every checkpoint slot holds the
exact prefix it summarises. It checks what each step reads (the KV before a span, a loaded checkpoint)
against what was really written, and reads the tree back the same way, independently of how the tree
stores it.

A request stays in flight (running, holding its blocks and lock) until ``finish``: after its prefill it
sits in decode, whose spans the simulator ignores (its one output token is never fed back).
"""
from collections import Counter

from trtllm_dasc.cache import CacheManager, IdPool
from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.scheduler import Scheduler
from trtllm_dasc.engine.sequence import Sequence
from trtllm_dasc.engine.step import StepOutput

MAX_INFLIGHT = 64


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
        self.inflight = []          # (match, table, tokens, sequence)
        self.pins = []              # nodes locked by something other than a request (a hit's lock below root)
        self.manager = CacheManager(cache, IdPool.rows(MAX_INFLIGHT))
        # one chunk per prompt, no token budget, no wr replay: admission and prefill in one step
        cfg = EngineConfig(model="unused", block_size=cache.bs, num_kv_blocks=num_blocks, interval=cache.interval,
                           prompt_only=cache.prompt_only, max_batch=MAX_INFLIGHT, prefill_chunk=1 << 20)
        self.sched = Scheduler(cfg, cache.slots.capacity, MAX_INFLIGHT, 0, manager=self.manager)
        self.last_match = None
        self._n = 0
        match = cache.match

        def spy(tokens):
            self.last_match = match(tokens)
            return self.last_match
        # what the tree itself answered (admission may then take a hit that cannot fit as a miss)
        cache.match = spy

    def cell(self, tokens, p):
        return (p, hash(tuple(tokens[:p + 1])))

    def start(self, tokens, expect=None):
        """Queue a prompt and run one scheduler step. Returns its match, or None when it was not admitted
        (out of KV blocks while others are in flight or pinned): then it is dropped, holding nothing."""
        self._n += 1
        seq = Sequence(GenerationRequest(("sim", self._n), list(tokens), 1), None)
        self.last_match = None
        self.sched.add([seq])
        try:
            sched = self.sched.schedule()
        except RuntimeError:
            # nothing running, but the test's pins hold the cache: the scheduler calls it pinned
            if not self.pins:
                raise
            sched = None
        if expect is not None:
            m = self.last_match
            assert (m.kv_len, m.ckpt_len) == tuple(expect), ((m.kv_len, m.ckpt_len), tuple(expect))
        if seq not in self.sched.running:
            self.sched.drop(seq)
            if sched is not None:
                self._step(*sched)
            return None
        self._step(*sched)
        assert not seq.in_prefill and seq.output, "one step prefills the whole prompt"
        self.inflight.append((seq.match, seq.table, list(tokens), seq))
        return seq.match

    def _step(self, plan, owners):
        """Execute a plan on the simulated memory, then book it through the scheduler."""
        for src, dst in plan.kv_copies:
            self.cells[dst] = list(self.cells[src])
        by_row = {s.row: s for s in owners}
        for slot, row in plan.loads:
            s = by_row[row]
            assert self.slot_content[slot] == tuple(s.prompt[:s.match.ckpt_len]), "wrong checkpoint loaded"
        assert not plan.replays and not plan.warm_loads
        tokens, stored = [], []
        for span, s in zip(plan.spans, owners):
            if span.start >= len(s.prompt):
                # a decode span of a request held in flight: never executed
                tokens.append(None)
                continue
            table = span.block_table
            for p in range(span.start):
                assert self.cells[table[p // self.bs]][p % self.bs] == self.cell(s.prompt, p), "stale KV reused"
            for p in range(span.start, span.start + len(span.token_ids)):
                self.cells[table[p // self.bs]][p % self.bs] = self.cell(s.prompt, p)
            for p, slot in span.captures:
                self.slot_content[slot] = tuple(s.prompt[:p])
                stored.append(True)
            tokens.append(0 if span.sampling is not None else None)
        n = len(plan.spans)
        out = StepOutput(tokens, [None] * n, [None] * n, stored)
        for s, token, error in self.sched.apply(plan, owners, out):
            assert error is None
            s.output.append(token)

    def finish(self, i=0):
        *_, seq = self.inflight.pop(i)
        self.sched.drop(seq)

    def request_refs(self):
        return Counter(b for _, table, _, _ in self.inflight for b in table)

    def pin(self, node):
        self.cache.lock(node)
        self.pins.append(node)

    def unpin(self, i=0):
        self.cache.unlock(self.pins.pop(i))

    def unpin_all(self):
        while self.pins:
            self.unpin()

    def locked_nodes(self):
        """The nodes whose checkpoints must stay: what each admitted request loaded (the scheduler's running
        ones, admitted this step included), and the pins."""
        return {s.match.ckpt_node for s in self.sched.running} | set(self.pins)

    def request_locks(self):
        return Counter([m.ckpt_node for m, _, _, _ in self.inflight] + self.pins)

    def check(self):
        c = self.cache
        assert [s for *_, s in self.inflight] == self.sched.running and not self.sched.waiting
        c.sanity_check(dict(self.request_refs()), dict(self.request_locks()))
        c.blocks.sanity_check()
        c.slots.sanity_check()
        self.manager.rows.sanity_check()
        assert self.manager.rows.num_used == len(self.inflight), "state rows leaked"
        for node in c._nodes():
            prefix = [t for n in node.path() for t in n.tokens]
            table = c.block_table(node)
            for p in range(node.end):
                assert self.cells[table[p // self.bs]][p % self.bs] == self.cell(prefix, p), "tree KV corrupt"
            if node.ckpt_slot is not None:
                assert self.slot_content[node.ckpt_slot] == tuple(prefix), "tree checkpoint corrupt"
        for n in [m.ckpt_node for m, _, _, _ in self.inflight] + self.pins:
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
