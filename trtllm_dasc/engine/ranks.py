"""An engine over T ranks, on every rank of one ``mpirun -np T`` (parallel/launch.py builds that command):
each rank joins the TP group and builds its ModelRunner (its shard, state rows and pool); rank 0 owns the
Engine (scheduler, radix cache, sampling) over a DistributedRunner and runs ``job(engine)``; ranks 1..T-1
only execute the plans rank 0 broadcasts (``worker``).
"""
from __future__ import annotations

import dataclasses
import os

import torch

from trtllm_dasc.engine.engine import Engine
from trtllm_dasc.engine.runner import ModelRunner
from trtllm_dasc.errors import UserError
from trtllm_dasc.parallel.group import TPGroup
from trtllm_dasc.parallel.runner import DistributedRunner, worker_loop


def join_ranks(cfg, threads_per_rank: int | None = None):
    """Collective, on every rank of the mpirun: the TP group and this rank's ModelRunner (its device,
    shard and pool); rank 0 also gets every rank's pool report. Returns (group, runner, reports).
    A rank that cannot build its runner (a rank weight file of another rank, a device it cannot use) fails
    every rank with one UserError naming it: alone, it left the others waiting in the gather below, and
    mpirun, which sees no rank exit, kept the server "not ready" until its timeout (30 minutes)."""
    group = TPGroup.from_mpi(cfg.device, timeout_s=cfg.tp_timeout_s)
    runner, failure = None, None
    try:
        if group.size != cfg.tp_size:
            raise UserError(f"tp_size {cfg.tp_size} but mpirun started {group.size} ranks")
        if cfg.device == "cpu":
            # ranks share the cores: without this, T ranks x all cores threads thrash
            torch.set_num_threads(threads_per_rank or max(1, (os.cpu_count() or 1) // group.size))
        device = cfg.device
        if device.startswith("cuda"):
            device = f"cuda:{group.rank % torch.cuda.device_count()}"
        runner = ModelRunner(dataclasses.replace(cfg, device=device), group.rank, group.all_reduce,
                             group.all_to_all)
    except UserError as e:
        failure = str(e)
    except Exception as e:  # noqa: BLE001 - reported to every rank, then raised there as one UserError
        failure = f"{type(e).__name__}: {e}"
    # before any collective of the runners: every rank learns whether any rank failed (the runner's build
    # has no collective, so every rank gets here)
    import socket
    gathered = group.comm.allgather((failure, os.getpid(), socket.gethostname()))
    failures = [f for f, _, _ in gathered]
    # rank 0's pid, for the workers' watchdog (worker): only where it shares this rank's host (/proc is local)
    group.root_pid = gathered[0][1] if gathered[0][2] == socket.gethostname() else None
    if any(failures):
        group.close()
        raise UserError("; ".join(f"TP rank {r} of {group.size} could not start: {f}"
                                  for r, f in enumerate(failures) if f))
    try:
        # every rank's pool as allocated (slot bytes, slots): rank 0 reports them, the planner predicts them
        reports = group.gather(runner.memory_report())
    except BaseException:
        group.close()
        raise
    return group, runner, reports


def rank0_engine(cfg, group, runner, reports):
    """Rank 0's Engine over every rank: its shutdown releases the workers and the group."""
    engine = Engine(dataclasses.replace(cfg, device=runner.cfg.device),
                    runner=DistributedRunner(runner, group, step_timeout_s=cfg.tp_timeout_s))
    engine.rank_reports = reports
    return engine


def worker(cfg, group, runner) -> int:
    """A worker rank's whole life: execute rank 0's plans until it stops; returns the steps run."""
    import threading
    done = threading.Event()
    if getattr(group, "root_pid", None):
        threading.Thread(target=_watch_root, args=(group.root_pid, done), daemon=True).start()
    try:
        return worker_loop(runner, group)
    finally:
        done.set()
        group.close()


def _watch_root(pid: int, done, every_s: float = 1.0) -> None:
    """Rank 0 (the Triton model's stub) dead without a stop: this worker would wait in MPI's broadcast
    forever (a spinning core) and mpirun, which watches tritonserver, never ends the job. Exit instead:
    mpirun then stops every rank, the server with them."""
    import sys
    import time
    while not done.wait(every_s):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "X"
        if state in ("Z", "X") and not done.is_set():
            print(f"dasc tp worker: rank 0 (pid {pid}) died; ending the job", file=sys.stderr, flush=True)
            os._exit(1)


def start_rank(cfg, threads_per_rank: int | None = None):
    """For a process that keeps its engine (the Triton model): rank 0 gets the Engine; a worker rank
    executes until rank 0 shuts down and then gets None."""
    group, runner, reports = join_ranks(cfg, threads_per_rank)
    if group.rank != 0:
        worker(cfg, group, runner)
        return None
    return rank0_engine(cfg, group, runner, reports)


def run_ranks(cfg, job, threads_per_rank: int | None = None):
    """Called by every rank of an ``mpirun -np cfg.tp_size``. Rank 0 returns ``job(engine)``; the other
    ranks execute plans until rank 0 is done and return None."""
    engine = start_rank(cfg, threads_per_rank)
    if engine is None:
        return None
    try:
        return job(engine)
    finally:
        engine.shutdown(drain=False, timeout=60)
