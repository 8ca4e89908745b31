"""The training batches built in a worker process (evals/prefetch.py) and the short lr warm-up of a resume.

The reference for the batches is the mixture itself, called here with the generator each batch must be
drawn from (run seed, first step, draw index): a batch built across the process boundary, or in order with
others, must be that batch exactly (integer tokens and a bool mask: exact by construction)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from trtllm_dasc.errors import UserError
from trtllm_dasc.evals.mixture import TrainingMixture
from trtllm_dasc.evals.prefetch import BatchPrefetcher
from trtllm_dasc.evals.vocab import TaskVocab

MIXTURE = TrainingMixture(vocab=TaskVocab(256), min_length=256, max_length=384, seed=3)
# a model small enough for a few CPU steps a test
TINY = dict(vocab_size=256, hidden_size=32, groups=1, heads=2, head_dim=16, intermediate_size=64, min_length=256,
            max_length=384, tokens_per_step=768)


@pytest.mark.parametrize("background", [True, False])
def test_each_batch_is_the_mixtures_batch_of_its_own_seed(background):
    plan = [(3, 384), (2, 256), (4, 320)]
    with BatchPrefetcher(MIXTURE, (7, 40), background=background) as prefetch:
        got = []
        for batch, length in plan:
            prefetch.submit(batch, length)
            got.append(prefetch.take())
    for i, ((batch, length), (tokens, mask, tasks, got_length)) in enumerate(zip(plan, got)):
        want_tokens, want_mask, want_tasks = MIXTURE.batch(batch, length, np.random.default_rng([7, 40, i]),
                                                           with_tasks=True)
        assert got_length == length and tokens.shape == (batch, length)
        assert np.array_equal(tokens, want_tokens) and np.array_equal(mask, want_mask) and tasks == want_tasks
    # the draws differ: a prefetcher that reused one generator state would repeat a batch
    first = MIXTURE.batch(3, 384, np.random.default_rng([7, 40, 0]))[0]
    again = MIXTURE.batch(3, 384, np.random.default_rng([7, 40, 2]))[0]
    assert not np.array_equal(first, again)


def test_a_workers_error_reaches_take_and_misuse_is_refused():
    with BatchPrefetcher(MIXTURE, (0, 0), background=True) as prefetch:
        prefetch.submit(2, 64)                       # shorter than the mixture's tasks need
        with pytest.raises(UserError, match="too short"):
            prefetch.take()
        with pytest.raises(RuntimeError, match="no batch was submitted"):
            prefetch.take()
        prefetch.submit(1, 256)
        with pytest.raises(RuntimeError, match="not taken"):
            prefetch.submit(1, 256)


def test_a_resume_with_fresh_moments_warms_the_lr_up_in_25_steps(tmp_path):
    """A compact stage has no Adam moments: the resumed run warms the lr up again, over 25 steps (not the
    config's 200), so the first resumed step runs at lr / 25 and a fresh run's first at lr / 200."""
    from trtllm_dasc.evals.train import TrainConfig, train
    cfg = TrainConfig(arch="kda", **TINY, lr=1e-3, warmup_steps=200)
    fresh, resumed = [], []
    train(cfg, str(tmp_path / "a"), minutes=2, device="cpu", max_steps=1, stage=str(tmp_path / "s"),
          log=fresh.append)
    train(cfg, str(tmp_path / "b"), minutes=2, device="cpu", max_steps=2, resume=str(tmp_path / "s"),
          log=resumed.append)

    def first_lr(logs):
        return float(re.search(r" lr ([0-9.e-]+) ", next(m for m in logs if "answer tokens right" in m)).group(1))
    assert first_lr(fresh) == pytest.approx(1e-3 / 200, rel=1e-2)
    assert first_lr(resumed) == pytest.approx(1e-3 / 25, rel=1e-2)


def test_a_non_finite_loss_stops_the_run_with_the_last_good_weights(tmp_path, monkeypatch):
    """The loss is read back once a step, after the backward is queued; a non-finite one must still stop the
    run before the update: the stage then holds exactly the weights of a run that stopped one step earlier
    (the same seeds give the same first batch; both runs on this CPU in this process)."""
    import torch

    from trtllm_dasc.evals import train as T
    cfg = T.TrainConfig(arch="kda", **TINY, warmup_steps=1)
    T.train(cfg, str(tmp_path / "a"), minutes=2, device="cpu", max_steps=1, stage=str(tmp_path / "sa"),
            log=lambda m: None)
    real_loss_fn, calls, logs = T.loss_fn, [], []

    def nan_on_the_second_step(*args, **kwargs):
        calls.append(1)
        loss, *rest = real_loss_fn(*args, **kwargs)
        return (loss * float("nan") if len(calls) == 2 else loss, *rest)
    monkeypatch.setattr(T, "loss_fn", nan_on_the_second_step)
    meta = T.train(cfg, str(tmp_path / "b"), minutes=2, device="cpu", max_steps=3, stage=str(tmp_path / "sb"),
                   log=logs.append)
    assert meta["steps"] == 1 and len(calls) == 2 and any("the loss became nan" in m for m in logs)
    good = torch.load(tmp_path / "sa" / "train_state.pt")["model"]
    kept = torch.load(tmp_path / "sb" / "train_state.pt")["model"]
    assert good.keys() == kept.keys() and all(torch.equal(good[k], kept[k]) for k in good)


def test_the_worker_outlives_sigterm_and_a_dead_worker_costs_no_batch():
    """A device command's timeout sends SIGTERM to the whole process group: the worker must ignore it (the
    training process stops and saves on it). A worker that dies anyway (SIGKILL) must not end the run: the
    batch is built in the training process instead, and it is the same batch."""
    import os
    import signal
    import time

    with BatchPrefetcher(MIXTURE, (5, 0), background=True) as prefetch:
        prefetch.submit(2, 256)
        first = prefetch.take()                          # the worker is up
        (worker,) = list(prefetch._pool._processes)
        os.kill(worker, signal.SIGTERM)
        time.sleep(0.5)
        prefetch.submit(2, 320)
        second = prefetch.take()
        assert prefetch._pool is not None and list(prefetch._pool._processes) == [worker], "SIGTERM killed it"
        os.kill(worker, signal.SIGSTOP)                 # so it cannot have built the next batch when it dies
        prefetch.submit(3, 384)
        os.kill(worker, signal.SIGKILL)
        third = prefetch.take()
        assert prefetch._pool is None
        prefetch.submit(1, 256)                          # and on, in this process
        fourth = prefetch.take()
    for i, (got, (batch, length)) in enumerate(zip((first, second, third, fourth),
                                                   ((2, 256), (2, 320), (3, 384), (1, 256)))):
        want = MIXTURE.batch(batch, length, np.random.default_rng([5, 0, i]))[0]
        assert np.array_equal(got[0], want), i
