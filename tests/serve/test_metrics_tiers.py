"""The host tier's Prometheus series read the cache manager's counters (names follow dasc_*)."""
from trtllm_dasc.cache import CacheManager
from trtllm_dasc.serve.metrics import FAMILIES, LABELLED

READ = {name: read for name, _, _, read in FAMILIES} | {name: read for name, _, _, _, read in LABELLED}


def run(m, prompt):
    lease = m.admit(prompt, len(prompt))
    caps = m.extend(lease, lease.match.ckpt_len, len(prompt))
    m.take_copies()
    m.store(lease, caps, [True] * len(caps))
    m.insert(lease, prompt)
    m.release(lease)


def test_tier_series():
    # one device slot of 100 B, two host slots: A is demoted by B, then promoted by A's repeat (demoting B)
    m = CacheManager.create(4, 64, 1, 2, interval=100, prompt_only=True, host_slots=2, slot_bytes=100)
    a, b = [1, 2, 3, 4, 5], [6, 7, 8, 9]
    run(m, a)
    run(m, b)
    run(m, a[:4] + [0, 0])
    s = m.stats()
    assert READ["dasc_checkpoint_promotions_total"](s) == 1
    # A for B, B for A's promotion; the repeat's own checkpoint at 5 finds the one slot locked (by A's
    # hit) and goes uncached: A stays in both tiers, B on the host
    assert READ["dasc_checkpoint_demotions_total"](s) == 2
    assert READ["dasc_checkpoint_hits_total"](s) == {"device": 0, "host": 1}
    assert READ["dasc_checkpoint_hit_tokens_total"](s) == {"device": 0, "host": 4}
    assert READ["dasc_checkpoint_bytes"](s) == {"device": 100, "host": 200}
    assert READ["dasc_host_checkpoint_slots"](s) == {"free": 0, "used": 2}


def test_tier_series_are_zero_with_the_tier_off():
    m = CacheManager.create(4, 64, 1, 2, interval=100, prompt_only=True)
    run(m, [1, 2, 3])
    run(m, [4, 5, 6])
    s = m.stats()
    assert READ["dasc_checkpoint_demotions_total"](s) == READ["dasc_checkpoint_promotions_total"](s) == 0
    assert READ["dasc_host_checkpoint_slots"](s) == {"free": 0, "used": 0}
    assert READ["dasc_checkpoint_bytes"](s) == {"device": 1, "host": 0}
