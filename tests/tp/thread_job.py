"""The engine-seam thread scenario (tests/engine/thread_scenario.py) on T MPI ranks: rank 0's engine
drives the workers while 8 threads submit, abort and send malformed requests. The reference tokens
come from the caller (a JSON of [prompt, tokens] pairs); an assertion failure fails the mpirun."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "engine"))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--out", required=True)
    return ap


def main() -> None:
    args = parser().parse_args()
    stats = scenario(args)
    if stats is not None:
        Path(args.out).write_text(json.dumps(stats))


def scenario(args) -> dict | None:
    """The scenario on every rank of the mpirun; rank 0 gets the engine's final (flat) stats."""
    from thread_scenario import ENGINE, run_scenario

    from trtllm_dasc.engine.ranks import run_ranks
    from trtllm_dasc.engine.config import EngineConfig
    reference = {tuple(p): t for p, t in json.loads(Path(args.reference).read_text())}
    cfg = EngineConfig(model=args.model, tp_size=args.tp, **ENGINE)
    stats = run_ranks(cfg, lambda engine: run_scenario(engine, reference, args.vocab))
    return None if stats is None else {k: v for k, v in stats.items() if not isinstance(v, dict)}


if __name__ == "__main__":
    main()
