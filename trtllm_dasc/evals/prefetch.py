"""The next training batch, built in a child process while the GPU trains on the current one.

Building a batch of the RULER-like tasks is Python and numpy work: 40-100 ms for 65,536 tokens on the
project's 2-core CPU machine (12-06), against roughly 250 ms of GPU time per step when two models share one
card (session 27: about 2 steps/s each). Built inside the training loop, that time is GPU idle time on every
step. One worker process builds batch n+1 while step n runs.

Each batch's rows come from a generator of its own, seeded by (run seed, first step of this run, draw
index), so a batch is the same whichever process builds it and the training stream does not depend on
timing. The length of batch n+1 is chosen before step n's loss is known: at a curriculum stage change the
first batch of the new stage still has the old length.
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor

import numpy as np

from trtllm_dasc.evals.mixture import TrainingMixture


def build_batch(mixture: TrainingMixture, batch_size: int, length: int, seed_words: tuple[int, ...]):
    """(tokens, mask, row tasks, length) of one batch, from its own generator."""
    tokens, mask, tasks = mixture.batch(batch_size, length, np.random.default_rng(list(seed_words)),
                                        with_tasks=True)
    return tokens, mask, tasks, length


class BatchPrefetcher:
    """submit(batch_size, length) starts the next batch; take() waits for it. background=False builds it
    in this process at submit time (the same batches; used on the CPU, where the step itself is the CPU)."""

    def __init__(self, mixture: TrainingMixture, seed_words: tuple[int, ...], background: bool = True):
        self.mixture, self.seed_words, self.draws = mixture, tuple(seed_words), 0
        self._pending: Future | None = None
        # spawn, not fork: the parent holds a CUDA context, which a forked child must not inherit
        self._pool = (ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
                      if background else None)

    def submit(self, batch_size: int, length: int) -> None:
        if self._pending is not None:
            raise RuntimeError("BatchPrefetcher.submit: the previous batch was not taken")
        args = (self.mixture, batch_size, length, (*self.seed_words, self.draws))
        self.draws += 1
        if self._pool is not None:
            self._pending = self._pool.submit(build_batch, *args)
        else:
            self._pending = Future()
            try:
                self._pending.set_result(build_batch(*args))
            except Exception as e:      # raised by take(), as the worker's would be
                self._pending.set_exception(e)

    def take(self):
        """(tokens, mask, row tasks, length) of the batch last submitted; a worker's error is raised here."""
        if self._pending is None:
            raise RuntimeError("BatchPrefetcher.take: no batch was submitted")
        pending, self._pending = self._pending, None
        return pending.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
