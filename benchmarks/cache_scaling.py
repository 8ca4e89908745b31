"""CPU benchmark: radix cache cost per request as the number of cached prefixes grows.

The tree is filled with N distinct prompts (64-256 tokens, most opening with one of a few few-shot
headers; room for all their KV, checkpoint slots for ``--slots-per-prefix`` per prompt, so the fill
already evicts checkpoints), then every block and slot still free is held aside, so each timed request
has to evict KV leaves and checkpoints to get its own. A timed request is the engine's bookkeeping path: match -> lock
-> make_room -> reserve_table -> alloc_slot per checkpoint position -> insert, plus finishing the request
issued ``--inflight`` requests earlier (unlock, release blocks): in-flight requests keep locked nodes in
the lists, which eviction walks past. Timed on the wall clock and on the thread's CPU clock (the latter
leaves out time this process spent descheduled: the machine is shared).

Arms: ``lru`` (the intrusive LRU lists, O(1) amortised eviction) and ``scan`` (the old rule: a min()
over every node per eviction; same choices, tested equal), the latter only at the smaller N.

    python -m benchmarks cache_scaling [--sizes 1000 10000 100000] [--requests 2000] [--scan-sizes 1000 10000]
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections import deque

HERE = os.path.dirname(os.path.abspath(__file__))

from benchmarks.results_io import provenance, write_result  # noqa: E402

from trtllm_dasc.cache import BlockPool, IdPool, RadixCache, fresh_blocks, reserve_table  # noqa: E402

BS, INTERVAL = 16, 64
# tokens below 257 are CPython's cached small ints: 100k prompts share their objects (memory, build time)
VOCAB = 250


class ScanCache(RadixCache):
    """The old eviction rule: every eviction scans all cached nodes."""

    def _kv_victim(self):
        return min((n for n in self._nodes() if not n.children and n.lock_ref == 0),
                   key=lambda n: n.last_access, default=None)

    def _ckpt_victim(self):
        return min((n for n in self._nodes() if n.ckpt_slot is not None and n.ckpt_lock == 0),
                   key=lambda n: n.ckpt_access, default=None)


def prompts(seed: int):
    """Endless distinct prompts: 80% open with one of 16 few-shot headers (16-96 tokens)."""
    rng = random.Random(seed)
    headers = [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(16, 97))] for _ in range(16)]
    while True:
        n = rng.randrange(64, 257)
        head = rng.choice(headers) if rng.random() < 0.8 else []
        yield head + [rng.randrange(1, VOCAB) for _ in range(n - len(head))]


def start(cache: RadixCache, tokens: list[int]):
    m = cache.match(tokens)
    cache.lock(m.ckpt_node)
    if not cache.make_room(fresh_blocks(m.ckpt_len, len(tokens), BS)):
        raise RuntimeError("pool too small for the in-flight requests")
    table, _ = reserve_table(cache.blocks, m.block_table, m.ckpt_len, len(tokens), BS)
    ckpts = {}
    for p in cache.checkpoint_positions(len(tokens), m):
        slot = cache.alloc_slot()
        if slot is not None:
            ckpts[p] = slot
    cache.insert(tokens, table, ckpts)
    return m.ckpt_node, table


def finish(cache: RadixCache, req) -> None:
    node, table = req
    cache.unlock(node)
    cache.blocks.decref(table)


def run(arm: str, n: int, requests: int, inflight: int, slots_per_prefix: float, seed: int) -> dict:
    # KV room for every prompt in full (256 tokens = 16 blocks): no KV eviction while filling
    slots = int(slots_per_prefix * n) + 4 * inflight
    cache = RadixCache(BS, BlockPool(16 * (n + inflight) + 16), IdPool.checkpoint_slots(slots), interval=INTERVAL)
    stream = prompts(seed)
    t0 = time.perf_counter()
    for _ in range(n):
        finish(cache, start(cache, next(stream)))
    build_s = time.perf_counter() - t0
    nodes0, ckpts0 = sum(1 for _ in cache._nodes()), cache.num_checkpoints()
    # hold every free block and slot aside: from here on each request evicts to get its own
    held_blocks = cache.blocks.alloc(cache.blocks.num_free)
    held_slots = [cache.slots.try_alloc() for _ in range(cache.slots.num_free)]
    if arm == "scan":
        # filled by the lists (the same choices, tested equal, without the scan's cost); timed scanning
        cache.__class__ = ScanCache
    gc.collect()
    gc.freeze()
    ev0 = dict(cache.evictions)
    window, times, cpu, evicting_kv, evicting_ckpt = deque(), [], [], 0, 0
    for _ in range(requests):
        tokens = next(stream)
        before = (cache.evictions["kv_nodes"], cache.evictions["checkpoints"])
        c, t = time.thread_time_ns(), time.perf_counter_ns()
        window.append(start(cache, tokens))
        if len(window) > inflight:
            finish(cache, window.popleft())
        times.append((time.perf_counter_ns() - t) / 1e3)
        cpu.append((time.thread_time_ns() - c) / 1e3)
        evicting_kv += cache.evictions["kv_nodes"] > before[0]
        evicting_ckpt += cache.evictions["checkpoints"] > before[1]
    gc.unfreeze()
    while window:
        finish(cache, window.popleft())
    times.sort()
    cpu.sort()
    ev = {k: cache.evictions[k] - ev0[k] for k in ev0}
    out = {"arm": arm, "cached_prefixes": n, "requests": requests, "build_s": round(build_s, 2),
           "nodes_at_start": nodes0, "checkpoints_at_start": ckpts0,
           "nodes_at_end": sum(1 for _ in cache._nodes()), "checkpoints_at_end": cache.num_checkpoints(),
           "blocks_held_aside": len(held_blocks), "slots_held_aside": len(held_slots),
           "mean_us": round(statistics.fmean(times), 1), "p50_us": _pct(times, 0.5), "p99_us": _pct(times, 0.99),
           "cpu_mean_us": round(statistics.fmean(cpu), 1), "cpu_p99_us": _pct(cpu, 0.99),
           "requests_evicting_kv": evicting_kv / requests, "requests_evicting_ckpt": evicting_ckpt / requests,
           "evictions_per_request": {k: round(v / requests, 2) for k, v in ev.items()}}
    del cache
    gc.collect()
    return out


def _pct(sorted_us: list[float], q: float) -> float:
    return round(sorted_us[min(len(sorted_us) - 1, int(q * len(sorted_us)))], 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--scan-sizes", type=int, nargs="*", default=[1000, 10000])
    ap.add_argument("--scan-requests", type=int, default=100, help="timed requests of the (slow) scan arm")
    ap.add_argument("--slots-per-prefix", type=float, default=1.0)
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cache_scaling.json"))
    args = ap.parse_args(argv)
    rows = []
    for n in args.sizes:
        arms = [("lru", args.requests)] + ([("scan", args.scan_requests)] if n in args.scan_sizes else [])
        for arm, requests in arms:
            rows.append(run(arm, n, requests, args.inflight, args.slots_per_prefix, args.seed))
            r = rows[-1]
            print(f"{arm:>5} N={n:>7} nodes={r['nodes_at_start']:>7} ckpts={r['checkpoints_at_start']:>7} "
                  f"mean={r['mean_us']:>9.1f} us p99={r['p99_us']:>9.1f} us "
                  f"(build {r['build_s']} s, {requests} requests)", flush=True)
    print(f"\n{'N':>8} {'arm':>5} {'nodes':>8} {'mean us':>10} {'p50 us':>10} {'p99 us':>10} "
          f"{'cpu mean':>10} {'cpu p99':>10} {'evict kv/ckpt':>14}")
    for r in rows:
        print(f"{r['cached_prefixes']:>8} {r['arm']:>5} {r['nodes_at_start']:>8} {r['mean_us']:>10.1f} "
              f"{r['p50_us']:>10.1f} {r['p99_us']:>10.1f} {r['cpu_mean_us']:>10.1f} {r['cpu_p99_us']:>10.1f} "
              f"{r['requests_evicting_kv']:>8.0%}/{r['requests_evicting_ckpt']:.0%}")
    result = {"benchmark": "cache_scaling", **provenance("benchmarks/cache_scaling.py", argv), "block_size": BS,
              "interval": INTERVAL, "inflight": args.inflight,
              "slots_per_prefix": args.slots_per_prefix,
              "timed": "per request: match, lock, make_room, reserve_table, alloc_slot per checkpoint, insert, "
                       "plus finishing the request issued `inflight` earlier (unlock, release blocks); "
                       "gc frozen after the fill",
              "rows": rows}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
