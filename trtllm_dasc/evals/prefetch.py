"""The next training batch, built in a child process while the GPU trains on the current one.

Building a batch of the RULER-like tasks is Python and numpy work: tens of milliseconds for 65,536 tokens
(`python -m benchmarks batch_build`, benchmarks/results/batch_build.json), against a few hundred milliseconds
of GPU time per step (session 27's training logs, on the branch quality-stages: about 2 steps/s per model, two
models sharing one card). Built inside the training loop, that time is GPU idle time on every step.
One worker process builds batch n+1 while step n runs. Measured since: session 29's H100 calls ran at the
rate session 27's did (KDA 2.1 against 2.0 steps/s): the build was not what held the steps back.

Each batch's rows come from a generator of its own, seeded by (run seed, first step of this run, draw
index), so a batch is the same whichever process builds it and the training stream does not depend on
timing. The length of batch n+1 (and its task weights, which follow the per-task losses) is chosen
before step n's loss is known: at a curriculum stage change the first batch of the new stage still has
the old length. The worker ignores SIGTERM (the training process
stops and saves on it), and if it dies anyway the run builds its batches itself: the same batches.
With task weights drawn from the losses (--task-sampling loss), the stream is the same for the same losses:
losses that differ in their last bits between two GPU runs can flip a row's task, so two such runs drift apart.
"""
from __future__ import annotations

import multiprocessing
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from trtllm_dasc.evals.mixture import TrainingMixture


def _ignore_stop_signals() -> None:
    """The worker's initializer. A device command's `timeout` sends SIGTERM to its whole process group; the
    training process turns it into "stop and save", and the worker must not die first: a take() waiting on
    a dead worker would end the run without its stage. The worker ends when the pool is shut down (or its
    parent dies: its queue closes)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def build_batch(mixture: TrainingMixture, batch_size: int, length: int, seed_words: tuple[int, ...],
                task_weights: tuple[float, ...] | None = None):
    """(tokens, mask, row tasks, length) of one batch, from its own generator."""
    tokens, mask, tasks = mixture.batch(batch_size, length, np.random.default_rng(list(seed_words)),
                                        with_tasks=True, task_weights=task_weights)
    return tokens, mask, tasks, length


class BatchPrefetcher:
    """submit(batch_size, length[, task_weights]) starts the next batch; take() waits for it. background=False builds it
    in this process at submit time (the same batches; used on the CPU, where the step itself is the CPU)."""

    def __init__(self, mixture: TrainingMixture, seed_words: tuple[int, ...], background: bool = True):
        self.mixture, self.seed_words, self.draws = mixture, tuple(seed_words), 0
        self._pending: Future | None = None
        # spawn, not fork: the parent holds a CUDA context, which a forked child must not inherit
        self._pool = (ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                          initializer=_ignore_stop_signals) if background else None)
        self._args = None

    def submit(self, batch_size: int, length: int, task_weights: tuple[float, ...] | None = None) -> None:
        if self._pending is not None:
            raise RuntimeError("BatchPrefetcher.submit: the previous batch was not taken")
        args = self._args = (self.mixture, batch_size, length, (*self.seed_words, self.draws), task_weights)
        self.draws += 1
        if self._pool is not None:
            try:
                self._pending = self._pool.submit(build_batch, *args)
                return
            except BrokenProcessPool as e:
                self._worker_died(e)
        self._pending = Future()                # built here: no worker (the CPU), or it died
        try:
            self._pending.set_result(build_batch(*args))
        except Exception as e:                  # raised by take(), as the worker's would be
            self._pending.set_exception(e)

    def take(self):
        """(tokens, mask, row tasks, length) of the batch last submitted; a worker's error is raised here."""
        if self._pending is None:
            raise RuntimeError("BatchPrefetcher.take: no batch was submitted")
        pending, self._pending = self._pending, None
        try:
            return pending.result()
        except BrokenProcessPool as e:
            self._worker_died(e)
            return build_batch(*self._args)     # the same batch: its generator is its own

    def _worker_died(self, error: Exception) -> None:
        """The worker died (killed, out of memory): the run goes on, building its batches in this process."""
        print(f"[prefetch] the batch worker died ({error}); building batches in the training process from now on",
              flush=True)
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
