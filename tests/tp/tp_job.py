"""One TP job, run on every rank by ``mpirun -np T python tests/tp/tp_job.py ...`` (tp_helpers.run_job):
rank 0 runs ``job(engine)`` and writes its JSON; the others execute rank 0's step plans.

The job: four cold prompts (context logits and 5 greedy tokens each), then the same prompts extended
(checkpoint hits: stores and loads on every rank's share), then one sampled request.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from trtllm_dasc.engine.config import EngineConfig  # noqa: E402
from trtllm_dasc.engine.request import GenerationRequest  # noqa: E402
from trtllm_dasc.engine.sampling import SamplingParams  # noqa: E402

LENGTHS = (37, 50, 23, 61)


def prompts(vocab: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    cold = [[rng.randrange(3, vocab) for _ in range(n)] for n in LENGTHS]
    hot = [p + [rng.randrange(3, vocab) for _ in range(7)] for p in cold]
    return cold, hot


def _run(engine, requests) -> list[dict]:
    ends = {}

    def collect(out, key):
        rec = ends.setdefault(key, {"tokens": [], "logits": None})
        rec["tokens"].extend(out.token_ids)
        if out.context_logits is not None:      # with the first token's event
            rec["logits"] = out.context_logits.tolist()
        if out.finished:
            rec.update(error=out.error, cached=out.stats.cached_tokens if out.stats else None)
    for r in requests:
        engine.submit(r, lambda out, key=r.request_id: collect(out, key))
    engine.run_until_idle()
    return [ends[r.request_id] for r in requests]


def job(engine) -> dict:
    cold, hot = prompts(engine.vocab_size)
    first = _run(engine, [GenerationRequest(("cold", i), p, 5, return_context_logits=True)
                          for i, p in enumerate(cold)])
    second = _run(engine, [GenerationRequest(("hot", i), p, 5) for i, p in enumerate(hot)])
    sampled = _run(engine, [GenerationRequest("sampled", hot[0], 6,
                                              SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=7))])
    engine.sanity_check()
    stats = engine.stats()
    return {"cold": first, "hot": second, "sampled": sampled, "rank_reports": engine.rank_reports,
            "exchange": stats["exchange"], "slot_bytes_per_rank": stats["checkpoint_slot_bytes_per_rank"],
            "checkpoint_hits": stats.get("checkpoint_hits"), "checkpoint_promotions": stats.get("checkpoint_promotions"),
            "checkpoint_demotions": stats.get("checkpoint_demotions"), "kv_tier": stats.get("kv_tier"),
            "host_kv_blocks": stats.get("host_kv_blocks"), "kv_matched_tokens": stats.get("kv_matched_tokens"),
            "host_tier": stats.get("host_tier")}


def engine_config(args) -> EngineConfig:
    return EngineConfig(model=args.model, wmax=args.wmax, policy=args.policy, codec=args.codec,
                        placement=args.placement, tp_size=args.tp, max_batch=args.max_batch, block_size=4, num_kv_blocks=args.kv_blocks,
                        interval=16, max_context=256, state_budget_bytes=args.budget,
                        host_cache_bytes=args.host_cache_bytes, eviction=args.eviction,
                        host_kv_blocks=args.host_kv_blocks, precision=args.precision)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--wmax", type=int, default=0)
    ap.add_argument("--policy", default="nr")
    ap.add_argument("--codec", default="native")
    ap.add_argument("--precision", default="uniform")
    ap.add_argument("--placement", default="off")
    ap.add_argument("--budget", type=int, default=None)
    ap.add_argument("--host-cache-bytes", type=int, default=0)
    ap.add_argument("--eviction", default="lru")
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--kv-blocks", type=int, default=200)
    ap.add_argument("--host-kv-blocks", type=int, default=0)
    ap.add_argument("--copy-fault-rank", type=int, default=-1,
                    help="on this rank, the first checkpoint promotion raises when queued (a copy fault)")
    ap.add_argument("--out", required=True)
    return ap


def copy_fault() -> None:
    """This rank's first checkpoint promotion raises when the host tier queues it (its other copies run)."""
    from trtllm_dasc.state.host_tier import HostTier
    real, done = HostTier._copy, []

    def copy(self, to_host, d, h):
        if not to_host and not done:
            done.append((h, d))
            raise RuntimeError("copy fault on this rank")
        return real(self, to_host, d, h)
    HostTier._copy = copy


def main() -> None:
    args = parser().parse_args()
    from trtllm_dasc.engine.ranks import run_ranks
    if args.copy_fault_rank >= 0:
        from trtllm_dasc.parallel.group import mpi_world
        if mpi_world().Get_rank() == args.copy_fault_rank:
            copy_fault()
    result = run_ranks(engine_config(args), job)
    if result is not None:
        Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
