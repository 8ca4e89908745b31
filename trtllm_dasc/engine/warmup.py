"""Warm-up: before an engine reports ready, run a synthetic workload that takes every code path its arm
will take, so Triton's JIT compiles and fla's autotuning happen here and not inside users' first requests
(on the H200 an unwarmed process ran its first prefix-reuse pass 2-3x slower in the dasc arms).

Triton compiles a kernel variant per specialisation of its integer arguments (equal to 1, divisible by
16, neither), so the shapes must vary the way real traffic does. For each batch size b in max_batch, ...,
4, 2, 1 (largest first, see below), two rounds run with b requests in the same steps:
  cold   b distinct long prompts (lengths both on and off the 16-token grid): a batched chunked prefill
         with checkpoint captures and stores at batch b, then decode at batch b;
  hits   b prompts extending the cold ones by 1 + {15, 4, 31, 0, ...} tokens: checkpoint loads at batch
         b (wr: replays + merge), short prefills of both kinds of lengths with stores, decode at batch b.
One request per round samples (temperature, top-k, top-p). Then the cache is flushed and the counters reset.
"""
from __future__ import annotations

import random
import time

from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.sampling import SamplingParams

TAILS = (15, 4, 31, 0, 63, 9, 16, 2)
DECODE = 3


def batch_buckets(max_batch: int) -> list[int]:
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return out + [max_batch]


def _lengths(longest: int, b: int) -> list[int]:
    """b prompt lengths <= longest, alternating a multiple of 16 and an odd length."""
    out = []
    for i in range(b):
        n = max(1, longest - 37 * i)
        out.append(max(1, n - n % 16) if i % 2 == 0 else n | 1)
    return [min(n, longest) for n in out]


def warmup(engine) -> dict:
    cfg, t0 = engine.cfg, time.perf_counter()
    rng = random.Random(0)
    vocab = engine.vocab_size
    # room for the longest tail and the decode after the cold prompt, in the context and in the KV cache
    longest = max(1, min(cfg.max_context - max(TAILS) - 1 - DECODE, 2 * cfg.interval + 5,
                         2 * cfg.prefill_chunk + 5, 4096))
    while longest > 1 and (engine.scheduler.worst_case_blocks(longest + 1 + max(TAILS), DECODE)
                           > cfg.num_kv_blocks):
        longest //= 2
    requests = 0
    # largest batch first: fla autotunes a kernel once, on its first call, with a key that ignores the
    # token count, so that first call should look like full-batch traffic rather than a lone request
    for b in reversed(batch_buckets(cfg.max_batch)):
        cold = [[rng.randrange(vocab) for _ in range(n)] for n in _lengths(longest, b)]
        hits = [p + [rng.randrange(vocab) for _ in range(1 + TAILS[i % len(TAILS)])] for i, p in enumerate(cold)]
        for name, prompts in (("cold", cold), ("hit", hits)):
            batch = [GenerationRequest(("warmup", b, name, i), p, DECODE,
                                       SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=i)
                                       if i == 0 else SamplingParams())
                     for i, p in enumerate(prompts)]
            engine.generate(batch)
            requests += len(batch)
    # the decode buckets the traffic above did not reach: their CUDA graphs, before the first user's step
    capture = getattr(engine.runner, "capture_graphs", None)
    if capture is not None:
        capture()
    engine.flush()
    engine.telemetry.reset()
    for kind in engine.cache.evictions:
        engine.cache.evictions[kind] = 0
    engine.ready = True
    return {"seconds": time.perf_counter() - t0, "requests": requests, "longest_prompt": longest,
            "batch_sizes": batch_buckets(cfg.max_batch)}
