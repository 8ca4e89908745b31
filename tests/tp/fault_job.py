"""Fault jobs on T ranks (``mpirun -np T python tests/tp/fault_job.py MODE ... --out O``), run by
tests/tp/test_tp_faults.py; rank 0 writes O. Every rank catches what the engine raises, so mpirun ends cleanly
and the test reads what each rank saw.

MODE start ENGINE_DIR: join the ranks from an engine directory (start_rank, as `dasc serve --tp` does);
    records the error each rank got (rank 0 gathers them), or that it started.
MODE nonfinite MODEL PLACEMENT: one prompt whose state overflows on some heads (the test's checkpoint), then
    the same prompt extended: each request's tokens, error and cached tokens.
MODE hang MODEL: rank 1 hangs in its first step (sleeps 600 s) under a TP timeout of 3 s; rank 0 submits one
    request. Nothing is written: the job must end by MPI's abort, long before the hung rank would wake.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PROMPT = [(7 * i + 3) % 90 + 3 for i in range(40)]


def _start(engine_dir: str):
    from trtllm_dasc.engine.config import engine_config
    from trtllm_dasc.engine.ranks import start_rank
    from trtllm_dasc.errors import UserError
    try:
        engine = start_rank(engine_config(engine_dir))
    except UserError as e:
        return f"UserError: {e}"
    if engine is not None:
        engine.shutdown(drain=False, timeout=30)
    return "started"


def _nonfinite(model: str, placement: str, tp: int):
    from trtllm_dasc.engine.config import EngineConfig
    from trtllm_dasc.engine.request import GenerationRequest
    cfg = EngineConfig(model=model, tp_size=tp, placement=placement, wmax=0, policy="nr", max_batch=2,
                       block_size=4, num_kv_blocks=200, interval=16, max_context=256)

    def job(engine):
        out = []
        for rid, p in (("a", PROMPT), ("b", PROMPT + [5, 6, 7])):
            got = {"tokens": []}

            def cb(o, got=got):
                got["tokens"].extend(o.token_ids)
                if o.finished:
                    got.update(error=o.error, cached=o.stats.cached_tokens if o.stats else None)
            engine.submit(GenerationRequest(rid, p, 3), cb)
            engine.run_until_idle()
            out.append(got)
        engine.sanity_check()
        return out
    if tp == 1:
        from trtllm_dasc.engine.engine import Engine
        engine = Engine(cfg)
        try:
            return job(engine)
        finally:
            engine.shutdown(drain=False, timeout=30)
    from trtllm_dasc.engine.ranks import run_ranks
    return run_ranks(cfg, job)


def _hang(model: str, tp: int):
    import time
    from trtllm_dasc.engine.config import EngineConfig
    from trtllm_dasc.engine.request import GenerationRequest
    from trtllm_dasc.engine.runner import ModelRunner
    from trtllm_dasc.parallel.group import mpi_world
    if mpi_world().Get_rank() == 1:
        ModelRunner.execute = lambda self, plan, sample_tokens=True: time.sleep(600)
    cfg = EngineConfig(model=model, tp_size=tp, wmax=0, policy="nr", max_batch=2, block_size=4, num_kv_blocks=200,
                       interval=16, max_context=256, tp_timeout_s=3)

    def job(engine):
        print(f"hang job: submitting at {time.time():.3f}", file=sys.stderr, flush=True)
        engine.submit(GenerationRequest("a", PROMPT, 3), lambda o: None)
        engine.run_until_idle()
        return ["not aborted"]
    from trtllm_dasc.engine.ranks import run_ranks
    return run_ranks(cfg, job)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("start", "nonfinite", "hang"))
    ap.add_argument("path")
    ap.add_argument("placement", nargs="?", default="off")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.mode == "start":
        from trtllm_dasc.parallel.group import mpi_world
        result = mpi_world().gather(_start(args.path), root=0)      # a list on rank 0, None elsewhere
    elif args.mode == "hang":
        result = _hang(args.path, args.tp)
    else:
        result = _nonfinite(args.path, args.placement, args.tp)     # None on the worker ranks
    if result is not None:
        Path(args.out).write_text(json.dumps(result))

if __name__ == "__main__":
    main()
