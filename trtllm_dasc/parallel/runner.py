"""Rank 0 schedules, every rank executes: DistributedRunner wraps rank 0's ModelRunner so that each
``execute(plan)`` is first broadcast to the workers; ``worker_loop`` is all a worker rank ever runs.

Failure rule (no rank may wait forever on a collective another rank has left):
- a UserError is a plan the model refuses while validating its inputs, before any collective of the
  forward; every rank raises the same one, so every rank goes on with the next plan (rank 0 fails that
  step's requests);
- a tier copy that one rank cannot queue fails no step: every rank sums per-copy failure flags (one
  all-reduce in each step with copies, ModelRunner._tier_copies) and rank 0 fails the requests that read it;
- anything else may have struck one rank halfway through the all-reduces: that rank aborts the whole MPI
  job (mpirun then stops every rank; a server reports not-ready and exits);
- a served step that does not end within ``step_timeout_s`` (the engine's tp_timeout_s) on rank 0 aborts the
  job too: the plan's broadcast is an MPI call without a timeout (gloo's all-reduces have one), and a worker
  stopped or hung while rank 0 waited in it held the server ready for good. Armed when the engine starts
  serving (Engine.start): warm-up's steps compile kernels on a cold cache and may run long on purpose.
"""
from __future__ import annotations

import sys
import threading
import time
import traceback

from trtllm_dasc.errors import UserError

STEP, STOP = "step", "stop"


class DistributedRunner:
    """Rank 0's runner: the scheduler's plans go to every rank, then run here. Everything else (the pool,
    the model, the memory report) is rank 0's own runner's."""

    def __init__(self, runner, group, step_timeout_s: float | None = None):
        self.runner, self.group = runner, group
        self._stopped = False
        # when the step in progress began (None between steps): two writes a step, read by the watchdog
        self._step_started: float | None = None
        self._step_timeout_s, self._watching = step_timeout_s, False

    def arm_step_watchdog(self) -> None:
        """Start timing steps (module docstring); idempotent, a no-op without a timeout."""
        if self._step_timeout_s and not self._watching:
            self._watching = True
            threading.Thread(target=self._watch, args=(float(self._step_timeout_s),), name="dasc-tp-step-watchdog",
                             daemon=True).start()

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def execute(self, plan, sample_tokens: bool = True):
        if self._stopped:
            raise RuntimeError("the TP ranks were stopped")
        self._step_started = time.monotonic()
        try:
            self.group.broadcast((STEP, plan))
            return _guarded(self.group, lambda: self.runner.execute(plan, sample_tokens))
        finally:
            self._step_started = None

    def _watch(self, timeout_s: float) -> None:
        """Abort every rank when a step has run for longer than ``timeout_s`` (module docstring)."""
        while not self._stopped:
            time.sleep(min(1.0, timeout_s / 4))
            started = self._step_started
            if started is not None and not self._stopped and time.monotonic() - started > timeout_s:
                print(f"[dasc tp rank 0/{self.group.size}] a step has not ended in {timeout_s:g} s (tp_timeout_s): "
                      "a rank stopped or hung; aborting every rank", file=sys.stderr, flush=True)
                self.group.comm.Abort(1)
                return

    def stop(self) -> None:
        """Release the workers (their loops return) and leave the group; idempotent."""
        if not self._stopped:
            self._stopped = True
            self.group.broadcast((STOP, None))
            self.group.close()


def worker_loop(runner, group) -> int:
    """Execute rank 0's plans until it says stop; returns the number of steps run."""
    steps = 0
    while True:
        kind, plan = group.broadcast()
        if kind == STOP:
            return steps
        try:
            # workers never sample: tokens are rank 0's (every rank has the same logits)
            _guarded(group, lambda: runner.execute(plan, sample_tokens=False))
        except UserError:
            pass    # rank 0 raised the same one and fails the step's requests
        steps += 1


def _guarded(group, fn):
    try:
        return fn()
    except UserError:
        raise
    except BaseException:  # noqa: BLE001 - any other failure may have left a collective half done
        print(f"[dasc tp rank {group.rank}/{group.size}] step failed; aborting every rank:\n"
              f"{traceback.format_exc()}", file=sys.stderr, flush=True)
        group.comm.Abort(1)
        raise
