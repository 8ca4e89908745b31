"""Warm-up: before an engine reports ready, run a synthetic workload that takes every code path its arm
will take, so Triton's JIT compiles and fla's autotuning happen here and not inside users' first requests
(on the H200 an unwarmed process ran its first prefix-reuse pass 2-3x slower in the dasc arms).

Rounds at batch sizes 1, 2, 4, ..., max_batch: a shared prefix is prefilled once (chunked prefill,
checkpoint captures and stores), then each round submits that many prompts extending it, all at once:
every one hits (checkpoint load; wr: replay + merge), prefills a few tokens with captures (stores at that
batch), and decodes a few tokens at that batch size. Then the cache is flushed and the counters reset.
"""
from __future__ import annotations

import random
import time

from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.sampling import SamplingParams


def batch_buckets(max_batch: int) -> list[int]:
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return out + [max_batch]


def warmup(engine) -> dict:
    cfg, t0 = engine.cfg, time.perf_counter()
    rng = random.Random(0)
    vocab = engine.vocab_size
    tail, decode = 5, 3
    # a prefix long enough to cross the interval grid and several prefill chunks, off the block grid
    prefix_len = max(1, min(cfg.max_context - tail - decode - 1, 2 * cfg.interval + 3,
                            2 * cfg.prefill_chunk + 3, 4096))
    prefix = [rng.randrange(vocab) for _ in range(prefix_len)]
    requests = 0
    engine.generate([GenerationRequest(("warmup", 0), prefix, decode)])
    for b in batch_buckets(cfg.max_batch):
        batch = []
        for i in range(b):
            prompt = prefix + [rng.randrange(vocab) for _ in range(rng.randrange(1, tail + 1))]
            # one sampled request per round: the sampling path compiles too
            params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=i) if i == 0 else SamplingParams()
            batch.append(GenerationRequest(("warmup", b, i), prompt, decode, params))
        engine.generate(batch)
        requests += b
    engine.flush()
    engine.telemetry.reset()
    engine.ready = True
    return {"seconds": time.perf_counter() - t0, "requests": requests + 1, "prefix_tokens": prefix_len,
            "batch_sizes": batch_buckets(cfg.max_batch)}
