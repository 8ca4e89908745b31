"""CPU benchmark: what a host tier of checkpoints does to the hit rate, on the cache's bookkeeping alone.

The engine's cache manager (cache/manager.py: admit, extend, store, insert, release; the radix tree's
eviction, demotion to host slots and promotion back) runs a multi-turn workload with no model and no
tensors: each turn is admitted, its checkpoint positions are "captured" (every capture stored), its prompt
inserted and its lease released, as the scheduler does around a prefill. What it measures is the token hit
rate, sum(checkpoint tokens reused) / sum(prompt tokens), and the hits per tier; not time (the H200 run of
issue 36 measures TTFT and the copies).

Workload: clients/multiturn.py's (the paper's Table 8 shape: ``--conversations`` conversations, ``--turns``
requests, each turn's prompt extends the previous turn's, so it reuses the checkpoint at the end of the
previous prompt), ``--concurrency`` conversations in flight, their turns taken round-robin in a seeded
order: a conversation's next turn comes after ~concurrency other turns, the reuse distance the slots must
cover. Lengths scaled by ``--scale`` (the bookkeeping is per block: lengths only set the token weights).
Openings: ``--opening-shape`` uniform (the default here: the shape the committed result and issue 36's verdict
used) or lognormal (Table 8's default since its fit to the paper's replay tokens per hit).

Arms, at equal checkpoint memory: dense checkpoints in ``--device-slots`` slots, and dasc-compressed ones in
device-slots x ``--compression`` slots (the checkpoint is that many times smaller: 2.59x for Kimi-Linear at
W_max 16, `dasc plan`), each with the host tier off and at ``--host-factor`` times the device budget, with
LRU and with cost-aware eviction (Marconi's FLOPs saved per byte, aged by recency); each host arm under every
``--write-policies`` (write-back: copied on device eviction; write-through: copied at store time), with
the copies each moved (host_copies: device -> host and back, per request). Prompt-end checkpoints only (the
paper's protocol), unless ``--interval`` is given. The verdict is the write-back arms'.

Target (issue 36, written before the first run): dasc-nr with a host tier of 8x its GPU budget reaches a
token hit rate >= 2x the GPU-only arm's, on the full workload.

    python -m benchmarks host_tier_sim [--device-slots 32] [--host-factor 8] [--compression 2.59] --commit C
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from benchmarks.results_io import provenance, write_result
from clients.multiturn import OPENING_SHAPES, MultiTurnConfig
from trtllm_dasc.cache.manager import CacheManager
from trtllm_dasc.spec import HOST_WRITE_POLICIES

HERE = os.path.dirname(os.path.abspath(__file__))

BS = 16
TARGET_RATIO = 2.0


def turn_order(cfg: MultiTurnConfig, concurrency: int, seed: int) -> list[tuple[int, int]]:
    """(conversation, turn) in arrival order: ``concurrency`` conversations in flight, taken round-robin,
    a finished one replaced by the next of a seeded permutation."""
    counts = cfg.turn_counts()
    waiting = [int(c) for c in np.random.default_rng([seed, 3]).permutation(cfg.conversations)]
    active: list[list[int]] = []           # [conversation, next turn]
    order = []
    while waiting or active:
        while waiting and len(active) < concurrency:
            active.append([waiting.pop(0), 0])
        still = []
        for conv in active:
            order.append((conv[0], conv[1]))
            conv[1] += 1
            if conv[1] < counts[conv[0]]:
                still.append(conv)
        active = still
    return order


def run_arm(cfg: MultiTurnConfig, order, slots: int, host_slots: int, eviction: str, interval: int | None,
            write_policy: str = "write-back") -> dict:
    """One arm: the workload through a fresh manager; hit tokens and hits per tier."""
    counts = cfg.turn_counts()
    prompts = {c: cfg.conversation(c, counts[c]) for c in range(cfg.conversations)}
    longest = max(len(p[-1]) for p in prompts.values())
    total_tokens = sum(len(p) for ps in prompts.values() for p in ps)
    # KV for every prompt (the study is about checkpoints: KV never evicts one here)
    blocks = 2 * sum(-(-len(ps[-1]) // BS) for ps in prompts.values()) + 2 * -(-longest // BS) + 16
    mgr = CacheManager.create(BS, blocks, slots, num_rows=4, interval=interval or 256,
                              prompt_only=interval is None, host_slots=host_slots, eviction=eviction,
                              write_policy=write_policy)
    for c, k in order:
        prompt = [int(t) for t in prompts[c][k]]
        lease = mgr.admit(prompt, len(prompt) + 1)
        if lease is None:
            raise RuntimeError("a request could not be admitted with nothing running: the KV budget is wrong")
        captures = mgr.extend(lease, lease.match.ckpt_len, len(prompt))
        mgr.store(lease, captures, [True] * len(captures))
        mgr.insert(lease, prompt)
        mgr.release(lease)
        mgr.take_copies()
    mgr.sanity_check([])
    hit_tokens = dict(mgr.hit_tokens)
    tier = mgr.tree.tier
    return {"slots": slots, "host_slots": host_slots, "eviction": eviction, "write_policy": write_policy,
            "host_copies": tier["demotion_copies"] + tier["write_through_copies"] + tier["promotions"],
            "requests": len(order),
            "prompt_tokens": total_tokens, "hits": dict(mgr.hits), "hit_tokens": hit_tokens,
            "token_hit_rate": sum(hit_tokens.values()) / total_tokens,
            "tier_counters": {k: v for k, v in mgr.tier_stats().items() if k.startswith("checkpoint_")
                              and isinstance(v, int)}}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=200)
    ap.add_argument("--turns", type=int, default=1051)
    ap.add_argument("--concurrency", type=int, default=64, help="conversations in flight (64)")
    ap.add_argument("--scale", type=float, default=0.25, help="prompt lengths x this (0.25: the bookkeeping "
                                                                 "is per block, lengths only weigh the tokens)")
    ap.add_argument("--device-slots", type=int, default=32, help="dense checkpoints the GPU budget holds (32)")
    ap.add_argument("--compression", type=float, default=2.59,
                    help="dasc's checkpoint capacity over dense at equal memory (2.59: Kimi-Linear W_max 16)")
    ap.add_argument("--host-factor", type=float, default=8.0, help="host tier as a multiple of the GPU budget (8)")
    ap.add_argument("--interval", type=int, default=None, help="checkpoint every N tokens too (default: prompt "
                                                               "ends only, the paper's protocol)")
    ap.add_argument("--write-policies", default="write-back,write-through",
                    help="host write policies to run for every host arm (write-back,write-through)")
    ap.add_argument("--opening-shape", choices=OPENING_SHAPES, default="uniform",
                    help="openings (clients/multiturn.py): uniform (default: the shape of the committed result) or "
                    "lognormal (Table 8's default)")
    ap.add_argument("--seeds", default="42,123,7", help="request-order seeds (42,123,7)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "host_tier_sim.json"))
    ap.add_argument("--commit", default=None, help="commit to record (default: this checkout's HEAD)")
    args = ap.parse_args(argv)
    cfg = MultiTurnConfig(vocab=32000, conversations=args.conversations, turns=args.turns, scale=args.scale,
                          opening_shape=args.opening_shape)
    seeds = [int(s) for s in args.seeds.split(",")]
    policies = [p for p in args.write_policies.split(",") if p]
    if not policies or any(p not in HOST_WRITE_POLICIES for p in policies) or "write-back" not in policies:
        ap.error(f"--write-policies: a comma list of {'|'.join(HOST_WRITE_POLICIES)} that includes write-back "
                 f"(the verdict's), got {args.write_policies!r}")
    arms = []
    for name, slots in (("dense", args.device_slots), ("dasc", int(args.device_slots * args.compression))):
        for host in (0, int(slots * args.host_factor)):
            for eviction in ("lru", "cost"):
                # the write policy only matters with a host tier
                for policy in (policies if host else ["write-back"]):
                    runs = [run_arm(cfg, turn_order(cfg, args.concurrency, s), slots, host, eviction, args.interval,
                                    policy) for s in seeds]
                    rates = [r["token_hit_rate"] for r in runs]
                    arm = {"arm": name, "host": bool(host), "eviction": eviction, "write_policy": policy,
                           "slots": slots, "host_slots": host,
                           "token_hit_rate_mean": float(np.mean(rates)), "token_hit_rate_by_seed": rates,
                           "host_copies_per_request": float(np.mean([r["host_copies"] / r["requests"] for r in runs])),
                           "runs": runs}
                    arms.append(arm)
                    print(f"{name:6} slots {slots:>4} host {host:>5} {eviction:4} {policy:13}: token hit rate "
                          f"{100 * arm['token_hit_rate_mean']:5.1f}%  (seeds "
                          f"{', '.join(f'{100 * r:.1f}' for r in rates)}); host copies per request "
                          f"{arm['host_copies_per_request']:.2f}", flush=True)

    def rate(name, host, eviction):
        return next(a["token_hit_rate_mean"] for a in arms if a["arm"] == name and a["host"] == host
                    and a["eviction"] == eviction and a["write_policy"] == "write-back")
    verdict = {ev: {"gpu_only": rate("dasc", False, ev), "with_host": rate("dasc", True, ev),
                    "ratio": rate("dasc", True, ev) / max(rate("dasc", False, ev), 1e-12)} for ev in ("lru", "cost")}
    for ev, v in verdict.items():
        v["met"] = v["ratio"] >= TARGET_RATIO
        print(f"dasc {ev}: host tier {args.host_factor:g}x -> token hit rate {100 * v['with_host']:.1f}% against "
              f"{100 * v['gpu_only']:.1f}% GPU-only ({v['ratio']:.2f}x; target >= {TARGET_RATIO:g}x: "
              f"{'met' if v['met'] else 'NOT met'})")
    result = {"benchmark": "host_tier_sim", **provenance("benchmarks/host_tier_sim.py", argv, args.commit),
              "workload": {"conversations": args.conversations, "turns": args.turns, "concurrency": args.concurrency,
                           "scale": args.scale, "seeds": seeds, "prompt_only": args.interval is None,
                           "interval": args.interval, "write_policies": policies,
                           "opening_shape": args.opening_shape},
              "device_slots_dense": args.device_slots, "compression": args.compression,
              "host_factor": args.host_factor, "target": f"dasc with a host tier of {args.host_factor:g}x its GPU "
              f"budget: token hit rate >= {TARGET_RATIO:g}x the GPU-only arm's", "arms": arms, "verdict": verdict}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
