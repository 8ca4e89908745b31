"""Randomized streams against a brute-force model of the cache, invariants checked after every step."""
import random

import pytest

from cache_sim import Sim, prompt_stream
from trtllm_dasc.cache import BlockPool, IdPool, RadixCache


@pytest.mark.parametrize("seed,bs,blocks,slots,interval,prompt_only", [
    (0, 4, 40, 6, 8, False), (1, 1, 60, 3, 5, False), (2, 3, 30, 10, 4, True), (3, 8, 24, 2, 16, False),
    (4, 2, 50, 20, 3, False),
], ids=["bs4", "bs1-few-slots", "prompt-only", "bs8-tiny", "many-slots"])
def test_random_stream_against_brute_force(seed, bs, blocks, slots, interval, prompt_only):
    rng = random.Random(seed)
    cache = RadixCache(bs, BlockPool(blocks), IdPool.checkpoint_slots(slots), interval=interval,
                       prompt_only=prompt_only)
    sim = Sim(cache, blocks)
    hits = 0
    for i, tokens in enumerate(prompt_stream(rng, 1500)):
        expected = sim.expected_match(tokens)
        m = sim.start(tokens, expect=expected)
        if m is None:
            # no blocks to be had while others are in flight: drain and the same prompt must fit
            while sim.inflight:
                sim.finish()
            assert sim.start(tokens, expect=sim.expected_match(tokens)) is not None
        hits += bool(sim.inflight[-1][0].ckpt_len)
        while len(sim.inflight) > rng.randrange(0, 4):
            sim.finish(rng.randrange(len(sim.inflight)))
        if i % 7 == 0 or len(tokens) < 4:
            sim.check()
    while sim.inflight:
        sim.finish()
    sim.check()
    cache.flush()
    sim.check()
    assert cache.blocks.num_free == blocks and cache.slots.num_free == slots
    assert not cache.root.children
    assert hits > 50                                  # the stream really exercises reuse
