"""Cache hits through the whole engine, checked against transformers' own greedy decoding."""
import random

import pytest
import torch

from engine_helpers import VOCAB, greedy, make_engine, reference_greedy


def run_one(engine, rid, prompt, n=3):
    req = greedy(rid, prompt, n)
    (out,) = engine.generate([req])
    engine.sanity_check()
    return out, req.stats


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_dense_hit_gives_the_same_tokens_as_no_cache(tiny_models, arch):
    path, hf = tiny_models[arch]
    engine = make_engine(path)
    rng = random.Random(1)
    prefix = [rng.randrange(VOCAB) for _ in range(19)]
    for i in range(3):
        prompt = prefix + [rng.randrange(VOCAB) for _ in range(4)]
        out, stats = run_one(engine, i, prompt)
        assert out == reference_greedy(hf, prompt, 3)
        if i >= 1:
            assert stats.checkpoint_loaded and stats.cached_tokens > 0
    assert engine.stats()["hit_rate"] > 0


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_shared_prefix_hits_in_full_from_the_third_request(tiny_models, arch):
    path, _ = tiny_models[arch]
    engine = make_engine(path, wmax=16)           # interval 8; the prefix is 21 tokens, not a multiple
    rng = random.Random(2)
    prefix = [rng.randrange(VOCAB) for _ in range(21)]
    for i in range(6):
        _, stats = run_one(engine, i, prefix + [rng.randrange(VOCAB) for _ in range(5)])
        if i >= 2:
            assert stats.cached_tokens == len(prefix), (i, stats)
    short = [rng.randrange(VOCAB) for _ in range(5)]
    cached = [run_one(engine, 10 + i, short + [i])[1].cached_tokens for i in range(3)]
    assert cached[2] == len(short)


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_wr_covering_the_whole_prefix_reproduces_dense(tiny_models, arch):
    path, hf = tiny_models[arch]
    engine = make_engine(path, wmax=10**6, policy="wr", replay_window=10**6)   # every unit omitted
    rng = random.Random(3)
    prefix = [rng.randrange(VOCAB) for _ in range(17)]
    for i in range(3):
        prompt = prefix + [rng.randrange(VOCAB) for _ in range(3)]
        out, stats = run_one(engine, i, prompt, n=4)
        assert out == reference_greedy(hf, prompt, 4)
        if i:
            assert stats.replayed_tokens == stats.cached_tokens > 0


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_nr_above_every_horizon_equals_a_zero_state(tiny_models, arch):
    from trtllm_dasc.model import HybridModel
    from trtllm_dasc.model.direct import DirectRunner
    path, _ = tiny_models[arch]
    engine = make_engine(path, wmax=10**6)
    assert sum(len(k) for k in engine.runner.plan.retained) == 0
    rng = random.Random(4)
    prefix = [rng.randrange(VOCAB) for _ in range(13)]
    # one more token: this prompt's end checkpoint (at len - 1) is the prefix, taken by an exact prefill
    # (a checkpoint stored after an earlier lossy hit would carry that loss in its conv state and KV)
    run_one(engine, 0, prefix + [1])
    prompt = prefix + [3, 4, 5]
    out, stats = run_one(engine, 1, prompt, n=4)
    c = stats.cached_tokens
    assert c == len(prefix)
    # brute force: prefill the prefix, zero the temporal state (conv and KV stay exact), continue greedily
    r = DirectRunner(HybridModel.from_pretrained(str(path)), rows=1, max_tokens=64, block_size=4)
    r.run(prompt[:c], logits="none")
    r.state.temporal.zero_()
    logits = r.run(prompt[c:], logits="last").logits[0]
    ref = []
    for _ in range(4):
        ref.append(int(torch.argmax(logits)))
        logits = r.run([ref[-1]], logits="last").logits[0]
    assert out == ref


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_nr_load_into_a_reused_row_zeroes_what_it_omits(tiny_models, arch):
    """A load lands in a row a finished request left full of state (rows are reused, never reset before a
    load): the units the checkpoint omits must be zero afterwards, whatever the row held."""
    from trtllm_dasc.model import HybridModel
    from trtllm_dasc.model.direct import DirectRunner
    path, _ = tiny_models[arch]
    engine = make_engine(path, wmax=10**6, max_batch=1)
    rng = random.Random(6)
    prefix = [rng.randrange(VOCAB) for _ in range(13)]
    run_one(engine, 0, prefix + [1])
    # garbage in every row (temporal and conv): what a reused row may hold
    g = torch.Generator().manual_seed(0)
    state = engine.runner.state
    state.temporal.copy_(torch.randn(state.temporal.shape, generator=g) * 10)
    state.conv.copy_(torch.randn(state.conv.shape, generator=g).to(state.conv.dtype) * 10)
    loaded = []
    inner = engine.runner.pool.load

    def spy(slots, temporal, conv, rows, **kw):
        inner(slots, temporal, conv, rows, **kw)
        loaded.append(float(temporal[:, rows].abs().max()))
    engine.runner.pool.load = spy
    prompt = prefix + [3, 4, 5]
    out, stats = run_one(engine, 1, prompt, n=4)
    # nothing is retained at this W_max: every unit of a loaded row is omitted, so all zero
    assert loaded == [0.0] and stats.cached_tokens == len(prefix)
    # brute force as above: exact prefix, temporal state zeroed, continue greedily
    r = DirectRunner(HybridModel.from_pretrained(str(path)), rows=1, max_tokens=64, block_size=4)
    r.run(prefix, logits="none")
    r.state.temporal.zero_()
    logits = r.run(prompt[len(prefix):], logits="last").logits[0]
    ref = []
    for _ in range(4):
        ref.append(int(torch.argmax(logits)))
        logits = r.run([ref[-1]], logits="last").logits[0]
    assert out == ref


def test_concurrent_chunked_requests_match_transformers(tiny_models):
    path, hf = tiny_models["kda"]
    rng = random.Random(5)
    prefix = [rng.randrange(VOCAB) for _ in range(11)]
    prompts = [prefix[:rng.randrange(3, 11)] + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 20))]
               for _ in range(7)]
    refs = [reference_greedy(hf, p, 3) for p in prompts]
    # dense, and wr with a window over every prefix (exact again), both batched and chunked: replays ride
    # in the same forward as other requests' prefill chunks and decode steps
    # (and a step token budget smaller than the batch's prefill: chunks shrink, requests wait their turn)
    for arm in ({}, {"wmax": 10**6, "policy": "wr", "replay_window": 10**6}, {"max_num_tokens": 7}):
        engine = make_engine(path, max_batch=3, prefill_chunk=5, interval=4, **arm)
        for wave in range(2):
            outs = engine.generate([greedy((wave, i), p, 3) for i, p in enumerate(prompts)])
            assert outs == refs, (arm, wave)
            engine.sanity_check()
        assert engine.stats()["hit_rate"] > 0.3


def test_seeded_sampling_does_not_depend_on_the_batch(tiny_models):
    from trtllm_dasc.engine.request import GenerationRequest
    from trtllm_dasc.engine.sampling import SamplingParams
    path, _ = tiny_models["gdn"]
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=123)
    prompt = [4, 8, 15, 16, 23, 42]
    alone = make_engine(path).generate([GenerationRequest("x", prompt, 6, params)])[0]
    others = [GenerationRequest(i, [i + 1] * (i + 2), 5, SamplingParams(temperature=0.8, seed=i)) for i in range(3)]
    batched = make_engine(path).generate(others + [GenerationRequest("x", prompt, 6, params)])[-1]
    assert alone == batched and len(alone) == 6


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_wr_warm_with_a_window_reaching_position_0_is_exact(tiny_models, arch):
    """A hit at K = 6 with a replay window of 8: the replay recomputes the prefix from position 0, whose state
    is known (zero). wr-warm put the checkpoint's retained units there (the state after K tokens): relative
    error 0.10 (gdn) / 1.4e-3 (kda) against transformers, where wr is exact. From a review helper; fails on
    the old code."""
    import torch
    from engine_helpers import split_wmax
    from trtllm_dasc.engine.request import GenerationRequest
    path, hf = tiny_models[arch]
    rng = random.Random(0)
    first = [rng.randrange(VOCAB) for _ in range(7)]                # its end checkpoint at K = 6
    prompt = first[:6] + [rng.randrange(VOCAB) for _ in range(4)]
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0, 6:]
    engine = make_engine(path, policy="wr-warm", prompt_only=True, wmax=split_wmax(path), replay_window=8)
    engine.generate([GenerationRequest("first", first, 1)])
    got = {}
    req = GenerationRequest("hit", prompt, 1, return_context_logits=True)
    engine.submit(req, lambda out: got.setdefault("logits", out.context_logits))
    engine.run_until_idle()
    assert req.stats.cached_tokens == 6 and req.stats.replayed_tokens == 6
    assert ((got["logits"] - ref).abs().max() / ref.abs().max()).item() < 1e-4
