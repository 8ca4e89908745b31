"""Several TP jobs on the ranks of one ``mpirun -np T python tests/tp/batch_job.py --tasks F --out O``: each
task is what tp_job.py, storage_job.py or thread_job.py does on its own mpirun (a new TP group, engine or
pools per task, closed after it), run one after another by the same T processes. On a 2-core CI machine a
rank's start (python, torch, transformers, the MPI and gloo setup) costs more than most tasks, so the test
module starts each degree's ranks once (tests/tp/test_tp_cpu.py).

F: a JSON list of {"kind": "engine" | "storage" | "thread", "args": [that script's arguments, no --out]}.
Rank 0 writes O after every task: the list so far, per task {"result": ...} or {"error": its traceback}.
A failure on rank 0 (a job's assertion, an engine error) is written as that task's error and then ends
the mpirun (MPI Abort: the workers may wait in a collective of the failed task); a failure on a worker
ends it as a lone job's would. The caller reports the tasks that never ran with mpirun's output.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import storage_job  # noqa: E402
import thread_job  # noqa: E402
import tp_job  # noqa: E402


def _engine(argv: list[str]):
    from trtllm_dasc.engine.ranks import run_ranks
    args = tp_job.parser().parse_args([*argv, "--out", "-"])
    return run_ranks(tp_job.engine_config(args), tp_job.job)


def _storage(argv: list[str]):
    from trtllm_dasc.parallel.group import TPGroup
    args = storage_job.parser().parse_args([*argv, "--out", "-"])
    group = TPGroup.from_mpi("cpu")
    try:
        return storage_job.round_trip(args, group)
    finally:
        group.close()


def _thread(argv: list[str]):
    return thread_job.scenario(thread_job.parser().parse_args([*argv, "--out", "-"]))


KINDS = {"engine": _engine, "storage": _storage, "thread": _thread}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from trtllm_dasc.parallel.group import mpi_world
    rank = mpi_world().Get_rank()
    results: list[dict] = []
    for task in json.loads(Path(args.tasks).read_text()):
        if rank != 0:
            # a worker's failure is not caught: mpirun stops every rank and the test reports the stderr
            KINDS[task["kind"]](task["args"])
            continue
        try:
            results.append({"result": KINDS[task["kind"]](task["args"])})
        except BaseException:
            results.append({"error": traceback.format_exc()})
            Path(args.out).write_text(json.dumps(results))
            print(results[-1]["error"], file=sys.stderr, flush=True)
            mpi_world().Abort(1)
        Path(args.out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
