"""benchmarks/host_tier_sim.py: the cache manager's bookkeeping over a multi-turn workload. Against a count
made from the workload alone: with room for every conversation's checkpoint, each turn after the first
reuses the checkpoint at its predecessor's prompt end (len - 1 tokens, prompt-end checkpoints)."""
from __future__ import annotations

from benchmarks import host_tier_sim as sim
from clients.multiturn import MultiTurnConfig


def _best_rate(cfg: MultiTurnConfig) -> float:
    counts = cfg.turn_counts()
    reused = total = 0
    for c in range(cfg.conversations):
        prompts = cfg.conversation(c, counts[c])
        total += sum(len(p) for p in prompts)
        reused += sum(len(p) - 1 for p in prompts[:-1])
    return reused / total


def test_room_for_every_checkpoint_on_either_tier_reaches_the_workloads_bound():
    cfg = MultiTurnConfig(vocab=1000, conversations=12, turns=40, scale=0.05)
    order = sim.turn_order(cfg, concurrency=6, seed=1)
    assert sorted(order) == sorted((c, k) for c, n in enumerate(cfg.turn_counts()) for k in range(n))
    best = _best_rate(cfg)
    # every checkpoint fits on the device; or 2 device slots and every checkpoint on the host (promotions)
    assert abs(sim.run_arm(cfg, order, 64, 0, "lru", None)["token_hit_rate"] - best) < 1e-12
    both = sim.run_arm(cfg, order, 2, 64, "lru", None)
    assert abs(both["token_hit_rate"] - best) < 1e-12
    assert both["hits"]["host"] > 0
    # write-through: the same bound (the host holds every checkpoint), no copy on a device eviction
    through = sim.run_arm(cfg, order, 2, 64, "lru", None, "write-through")
    assert abs(through["token_hit_rate"] - best) < 1e-12 and through["tier_counters"]["checkpoint_demotion_copies"] == 0
    # 2 device slots alone and 6 conversations in flight: most turns find their checkpoint evicted
    assert sim.run_arm(cfg, order, 2, 0, "lru", None)["token_hit_rate"] < best / 2
