"""Request lifecycle edges a review found (session 36), each against an independent reference:
- a step that fails whole also fails the requests it admitted without giving them tokens (their row reset or
  checkpoint load never ran): kept running they decoded from another request's stale state row;
- flush() (any command for the loop) on a dead engine raises instead of waiting forever;
- a temperature, bias or penalty that overflows fp32 samples the distribution's limit, never the last id;
- resubmitting an in-flight request object leaves the running request's figures alone;
- an abort of a request that finishes first does not cancel a later request that reuses its id."""
import random
import threading
import time

import pytest
import torch

from engine_helpers import VOCAB, greedy, make_engine, one_torch_thread, reference_greedy
from trtllm_dasc.engine.engine import EngineDead
from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.sampling import SamplingParams, process_logits, sample
from trtllm_dasc.errors import UserError

_one_thread = pytest.fixture(scope="module", autouse=True)(one_torch_thread)


def test_a_failed_step_fails_the_requests_it_admitted_without_tokens(tiny_models):
    path, hf = tiny_models["kda"]
    rng = random.Random(2)
    # a 4-token step budget: "a" takes it all, "b" is admitted (its checkpoint load planned) without a span
    engine = make_engine(path, max_num_tokens=4, prefill_chunk=4)
    a = [rng.randrange(VOCAB) for _ in range(8)]
    b = [rng.randrange(VOCAB) for _ in range(8)]
    engine.generate([greedy("warm", b, 1)])                      # b's prefix cached: its admission loads
    # rows left dirty by other requests: a missing reset or load shows as wrong tokens
    engine.generate([greedy(f"w{i}", [rng.randrange(VOCAB) for _ in range(9)], 3) for i in range(4)])
    execute, calls = engine.runner.execute, [0]

    def fail_first(plan, *args, **kw):
        calls[0] += 1
        if calls[0] == 1:
            assert plan.loads and not any(span.row == plan.loads[0][1] for span in plan.spans), \
                "the failing step must hold b's load without b's span (the case under test)"
            raise RuntimeError("injected step failure")
        return execute(plan, *args, **kw)

    engine.runner.execute = fail_first
    ends, tokens = {}, {"a": [], "b": []}

    def callback(o):
        tokens[o.request_id] += o.token_ids
        ends[o.request_id] = o.finish_reason if o.finished else None

    engine.submit(greedy("a", a, 3), callback)
    engine.submit(greedy("b", b, 3), callback)
    engine.run_until_idle()
    # b's load was part of the failed step: b fails with it (it decoded [44, 90, 63] from a stale row,
    # finish reason "length", where transformers gives [75, 68, 82])
    assert ends == {"a": "error", "b": "error"}, (ends, tokens, reference_greedy(hf, b, 3))
    engine.scheduler.sanity_check()
    # the engine serves on: both prompts again give transformers' tokens
    assert engine.generate([greedy("a2", a, 3), greedy("b2", b, 3)]) == [reference_greedy(hf, a, 3),
                                                                          reference_greedy(hf, b, 3)]


def test_flush_on_a_dead_engine_raises_instead_of_hanging(tiny_models):
    path, _ = tiny_models["kda"]
    engine = make_engine(path)
    engine.start()

    def broken():
        raise AssertionError("injected bookkeeping bug")

    engine.scheduler.schedule = broken
    outs = []
    engine.submit(greedy("x", [1, 2, 3], 2), outs.append)
    deadline = time.monotonic() + 30
    while not outs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert outs and outs[-1].finish_reason == "error" and engine.dead
    engine._thread.join(10)
    result = []

    def flush():
        try:
            engine.flush()
            result.append("returned")
        except EngineDead as e:
            result.append(e)

    t = threading.Thread(target=flush, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "flush() on a dead engine is still waiting"
    assert len(result) == 1 and isinstance(result[0], EngineDead), result


def test_overflowing_temperature_samples_the_greedy_limit():
    # a temperature that overflows fp32 (1e-40 is subnormal): the limit of the distribution is the argmax
    logits = torch.tensor([0.5, 3.0, -1.0, 2.9, 1.0])
    for seed in range(5):
        params = SamplingParams(temperature=1e-40, seed=seed)
        assert sample(logits, params, token_index=0) == 1
    # an ordinary temperature is untouched by the guard: the token is the inverse-CDF draw recomputed here
    params = SamplingParams(temperature=0.7, seed=3)
    from trtllm_dasc.engine.sampling import draw_uniform
    probs = torch.softmax(logits.double() / 0.7, -1)
    order = sorted(range(5), key=lambda i: (-probs[i].item(), i))
    u, acc = draw_uniform(3, 0), 0.0
    want = next(i for i in order if (acc := acc + probs[i].item()) > u)
    assert sample(logits, params, token_index=0) == want


def test_overflowing_bias_and_penalty_share_the_mass_among_the_overflowed():
    logits = torch.tensor([0.5, 3.0, -1.0, 2.9, 1.0, 0.0])
    # a bias past fp32's range on token 3: it alone has all the mass
    biased = SamplingParams(temperature=1.0, top_k=0, embedding_bias=((3, 1e39),), seed=1)
    x = process_logits(logits, biased)
    assert torch.isfinite(torch.softmax(x, -1)).all()
    assert all(sample(x, biased, t, scaled=True) == 3 for t in range(4))
    # a negative frequency penalty that overflows tokens 0 and 4 (each seen twice): they share the mass
    pen = SamplingParams(temperature=1.0, frequency_penalty=-3e38, seed=5)
    x = process_logits(logits, pen, history=[0, 4, 0, 4])
    assert sorted({sample(x, pen, t, scaled=True) for t in range(40)}) == [0, 4]
    # nothing left to sample: an error (its request fails), never a made-up id
    with pytest.raises(ValueError):
        sample(torch.full((4,), float("nan")), SamplingParams(temperature=1.0, seed=0), 0)


def test_overflowing_temperature_through_the_engine_gives_the_greedy_tokens(tiny_models):
    path, hf = tiny_models["kda"]
    engine = make_engine(path)
    prompt = [5, 17, 33, 2, 9]
    got = engine.generate([GenerationRequest("t", prompt, 4, SamplingParams(temperature=1e-40, seed=7))])[0]
    assert got == reference_greedy(hf, prompt, 4)


def test_resubmitting_an_in_flight_request_keeps_its_figures(tiny_models):
    path, _ = tiny_models["kda"]
    engine = make_engine(path, interval=4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    engine.generate([greedy("warm", prompt, 1)])
    req = greedy("r", prompt, 3)
    engine.submit(req)
    engine.step()
    cached, arrival = req.stats.cached_tokens, req.stats.arrival_time_ns
    assert cached == 8 and arrival > 0        # the 9-token prompt's last checkpoint is at 8 tokens
    with pytest.raises(UserError, match="already in flight"):
        engine.submit(req)
    engine.run_until_idle()
    assert (req.stats.cached_tokens, req.stats.arrival_time_ns) == (cached, arrival)
    assert req.stats.first_scheduled_time_ns > 0


def test_a_stale_abort_does_not_cancel_a_later_request_with_the_same_id(tiny_models):
    path, hf = tiny_models["kda"]
    engine = make_engine(path)
    log, aborted = [], []

    def abort_x(o):
        if not o.finished and not aborted:
            aborted.append(engine.abort("x"))      # queued; "x" finishes in this same step

    engine.submit(greedy("y", [4, 5, 6], 3), abort_x)
    engine.submit(greedy("x", [1, 2, 3], 1), lambda o: log.append(("old", o.finish_reason)))
    engine.step()
    assert aborted == [True] and log == [("old", "length")]
    engine.submit(greedy("x", [7, 8, 9], 3), lambda o: log.append(("new", o.finish_reason, o.token_ids)))
    engine.run_until_idle()
    new = [e for e in log if e[0] == "new"]
    assert new[-1][1] == "length", log
    assert [t for e in new for t in e[2]] == reference_greedy(hf, [7, 8, 9], 3)
