"""Engine lifecycle and admission edge cases found in review: a hit that pins its own prefix, shutdown with
a timeout, submit after shutdown, flush from another thread, an empty generate, a generate with a bad request,
a resubmitted request, a warm-up in a small cache, and a scheduling failure (the engine reports itself dead,
never hangs)."""
import random
import threading
import time

import pytest

from engine_helpers import VOCAB, greedy, make_engine, reference_greedy
from trtllm_dasc.engine.engine import EngineDead


def test_a_hit_that_pins_its_own_prefix_is_admitted_as_a_miss(tiny_models):
    path, hf = tiny_models["kda"]
    # 4 blocks of 16: a 60-token prompt + 5 outputs needs all 4; a hit at 39 (unaligned) would pin the
    # cached partial block it copies and so needs a fifth
    engine = make_engine(path, block_size=16, num_kv_blocks=4, interval=256)
    rng = random.Random(0)
    first = [rng.randrange(VOCAB) for _ in range(40)]
    engine.generate([greedy("a", first, 1)])
    longer = first + [rng.randrange(VOCAB) for _ in range(20)]
    req = greedy("b", longer, 5)
    assert engine.generate([req]) == [reference_greedy(hf, longer, 5)]
    assert req.stats.cached_tokens == 0
    engine.sanity_check()


def test_shutdown_timeout_leaves_the_loop_alone_then_completes(tiny_models):
    engine = make_engine(tiny_models["gdn"][0])
    engine.start()
    gate = threading.Event()
    events = []

    def slow(out):
        events.append(out)
        gate.wait(5)
    engine.submit(greedy("slow", [1, 2, 3], 2), slow)
    while not events:
        time.sleep(0.01)
    with pytest.raises(TimeoutError):
        engine.shutdown(timeout=0.1)
    gate.set()
    engine.shutdown(timeout=30)
    assert [e.finished for e in events] == [False, True] and events[-1].finish_reason == "length"
    engine.sanity_check()


def test_submit_after_shutdown_is_refused(tiny_models):
    engine = make_engine(tiny_models["gdn"][0])
    engine.start()
    engine.shutdown()
    with pytest.raises(EngineDead, match="shut down"):
        engine.submit(greedy("late", [1, 2], 1))


def test_flush_from_another_thread_while_serving(tiny_models):
    path, hf = tiny_models["kda"]
    engine = make_engine(path, interval=4, num_kv_blocks=120)
    engine.start()
    stop = threading.Event()

    def flusher():
        while not stop.is_set():
            engine.flush()
    t = threading.Thread(target=flusher)
    t.start()
    rng = random.Random(1)
    base = [rng.randrange(VOCAB) for _ in range(12)]
    prompts = [base[:rng.randrange(3, 12)] + [rng.randrange(VOCAB)] for _ in range(40)]
    outs = engine.generate([greedy(i, p, 2) for i, p in enumerate(prompts)])
    stop.set()
    t.join()
    engine.shutdown()
    assert outs == [reference_greedy(hf, p, 2) for p in prompts]
    engine.sanity_check()


def test_generate_nothing_returns_at_once(tiny_models):
    engine = make_engine(tiny_models["gdn"][0])
    engine.start()
    assert engine.generate([]) == []
    engine.shutdown()


def test_generate_with_a_bad_request_queues_none_of_its_batch(tiny_models):
    """generate submitted its requests one by one: a bad one raised, the good ones before it stayed queued (run
    by whatever stepped next, their outputs lost), and a retry of the batch without the bad one was refused
    ("request_id 1 is already in flight"). From a review helper; fails on the old code."""
    from trtllm_dasc.engine.request import GenerationRequest
    from trtllm_dasc.errors import UserError
    path, hf = tiny_models["gdn"]
    engine = make_engine(path)
    with pytest.raises(UserError, match="prompt is empty"):
        engine.generate([greedy(1, [1, 2, 3], 2), GenerationRequest(2, [], 2)])
    assert not engine.has_work()
    assert engine.generate([greedy(1, [1, 2, 3], 2)]) == [reference_greedy(hf, [1, 2, 3], 2)]
    engine.sanity_check()


def test_a_resubmitted_request_starts_with_fresh_stats(tiny_models):
    engine = make_engine(tiny_models["gdn"][0], interval=4)
    req = greedy("r", [1, 2, 3, 4, 5, 6, 7, 8, 9], 2)
    engine.generate([req])
    engine.generate([req])
    assert req.stats.cached_tokens > 0
    engine.flush()
    engine.generate([req])
    st = req.stats
    assert st.cached_tokens == 0 and not st.checkpoint_loaded
    assert st.arrival_time_ns <= st.first_scheduled_time_ns <= st.first_token_time_ns <= st.last_token_time_ns


def test_warmup_fits_a_small_kv_cache(tiny_models):
    engine = make_engine(tiny_models["kda"][0], block_size=16, num_kv_blocks=20, max_batch=2)
    engine.warmup()
    assert engine.ready and engine.stats()["kv_blocks_free"] == 20


def test_a_scheduling_failure_kills_the_engine_cleanly(tiny_models):
    engine = make_engine(tiny_models["gdn"][0])
    engine.start()
    finals = []
    boom = engine.scheduler.schedule

    def broken():
        raise AssertionError("injected bookkeeping bug")
    engine.scheduler.schedule = broken
    engine.submit(greedy("x", [1, 2, 3], 2), lambda out: finals.append(out) if out.finished else None)
    deadline = time.time() + 10
    while not finals and time.time() < deadline:
        time.sleep(0.01)
    assert finals and finals[0].finish_reason == "error" and "scheduling failed" in finals[0].error
    assert engine.dead and not engine.ready
    with pytest.raises(EngineDead):
        engine.submit(greedy("y", [1, 2], 1))
    engine.scheduler.schedule = boom
    engine.shutdown(timeout=10)
