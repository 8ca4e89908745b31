"""Rank 0 schedules, every rank executes: DistributedRunner wraps rank 0's ModelRunner so that each
``execute(plan)`` is first broadcast to the workers; ``worker_loop`` is all a worker rank ever runs.

Failure rule (no rank may wait forever on a collective another rank has left):
- a UserError is a plan the model refuses while validating its inputs, before any collective of the
  forward; every rank raises the same one, so every rank goes on with the next plan (rank 0 fails that
  step's requests);
- a tier copy that one rank cannot queue fails no step: every rank sums per-copy failure flags (one
  all-reduce in each step with copies, ModelRunner._tier_copies) and rank 0 fails the requests that read it;
- anything else may have struck one rank halfway through the all-reduces: that rank aborts the whole MPI
  job (mpirun then stops every rank; a server reports not-ready and exits).
"""
from __future__ import annotations

import sys
import traceback

from trtllm_dasc.errors import UserError

STEP, STOP = "step", "stop"


class DistributedRunner:
    """Rank 0's runner: the scheduler's plans go to every rank, then run here. Everything else (the pool,
    the model, the memory report) is rank 0's own runner's."""

    def __init__(self, runner, group):
        self.runner, self.group = runner, group
        self._stopped = False

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def execute(self, plan, sample_tokens: bool = True):
        if self._stopped:
            raise RuntimeError("the TP ranks were stopped")
        self.group.broadcast((STEP, plan))
        return _guarded(self.group, lambda: self.runner.execute(plan, sample_tokens))

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
