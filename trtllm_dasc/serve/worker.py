"""A worker rank of a TP server: ``python -m trtllm_dasc.serve.worker --engine ENGINE_DIR``.

`dasc serve --tp T` starts tritonserver as rank 0 of one mpirun and T-1 of these beside it (MPMD, as
TensorRT-LLM's launch_triton_server.py runs its ranks); the dasc_hybrid model, inside the server, joins
as rank 0 and drives them. A worker exits when rank 0 shuts its engine down; if it dies, mpirun stops
the whole job (the server with it), so a broken TP group never serves.
"""
from __future__ import annotations

import argparse
import sys
from trtllm_dasc.errors import UserError
from trtllm_dasc.engine.config import engine_config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="trtllm_dasc.serve.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--engine", required=True, help="the engine directory rank 0 serves")
    args = ap.parse_args(argv)
    # lazy: torch / numpy load only when this runs (keeps importing this module light)
    from trtllm_dasc.engine.ranks import join_ranks, worker
    try:
        cfg = engine_config(args.engine)
        group, runner, _ = join_ranks(cfg)
        steps = worker(cfg, group, runner)
    except UserError as e:
        print(f"dasc tp worker: error: {e}", file=sys.stderr)
        return 2
    print(f"dasc tp worker: rank {group.rank} done after {steps} steps", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
