"""A controlled prefix-reuse workload (the paper's cache-fill / replay protocol, App. C.2, in miniature)
and a runner that reports what each arm made of it at the same state memory.

Documents (shared prefixes) are each followed by distinct questions. Fill: every document once, untimed.
Replay: the remaining questions, shuffled with a seed; only replay requests enter the figures: the
token-weighted hit rate (Eq. 9), the prompt tokens actually prefilled, time per request.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.engine import Engine


@dataclass(slots=True)
class Workload:
    fill: list[list[int]]
    replay: list[list[int]]
    doc_len: int


def prefix_reuse_workload(num_docs: int = 40, doc_len: int = 96, question_len: int = 8,
                          questions_per_doc: int = 4, vocab: int = 512, seed: int = 42) -> Workload:
    rng = random.Random(seed)
    docs = [[rng.randrange(3, vocab) for _ in range(doc_len)] for _ in range(num_docs)]
    ask = lambda doc: doc + [rng.randrange(3, vocab) for _ in range(question_len)]  # noqa: E731
    fill = [ask(d) for d in docs]
    replay = [ask(d) for d in docs for _ in range(questions_per_doc - 1)]
    rng.shuffle(replay)
    return Workload(fill, replay, doc_len)


def run_workload(engine: Engine, work: Workload, concurrency: int = 4) -> dict:
    """Fill (untimed), then replay in waves of ``concurrency`` requests; one output token each (TTFT-like).
    Figures are of the replay requests only."""
    for i in range(0, len(work.fill), concurrency):
        engine.generate([GenerationRequest(("fill", i + j), p, 1) for j, p in enumerate(work.fill[i:i + concurrency])])
    before = engine.stats()
    reqs = [GenerationRequest(("replay", i), p, 1) for i, p in enumerate(work.replay)]
    t0 = time.perf_counter()
    for i in range(0, len(reqs), concurrency):
        engine.generate(reqs[i:i + concurrency])
    seconds = time.perf_counter() - t0
    prompt = sum(r.stats.prompt_tokens for r in reqs)
    cached = sum(r.stats.cached_tokens for r in reqs)
    after = engine.stats()
    return {"replay_requests": len(reqs), "replay_seconds": seconds, "hit_rate": cached / prompt,
            "prefilled_tokens": prompt - cached, "replayed_tokens": sum(r.stats.replayed_tokens for r in reqs),
            "ms_per_request": seconds * 1e3 / len(reqs), "input_tokens_per_s": prompt / seconds,
            "checkpoint_evictions": sum(after["evictions"][k] - before["evictions"][k]
                                        for k in ("checkpoints", "checkpoints_with_kv"))}


def run_arm(cfg: EngineConfig, work: Workload, concurrency: int = 4) -> dict:
    """A fresh engine for one arm, the workload once."""
    engine = Engine(cfg)
    result = run_workload(engine, work, concurrency)
    engine.sanity_check()
    return {"arm": cfg.arm, "checkpoint_slots": engine.runner.pool.num_slots,
            "slot_bytes": engine.runner.pool.slot_bytes, "budget_bytes": engine.runner.budget, **result}
