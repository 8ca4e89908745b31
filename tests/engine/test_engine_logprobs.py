"""TensorRT-LLM's log probs, generation logits, penalties, embedding_bias and min_length through the engine
(CPU), against transformers: its forward's log-softmax and its logits processors (RepetitionPenalty,
MinLength) plus presence / frequency as OpenAI defines them (logit - presence*(n>0) - frequency*n), the
counts over prompt and output as TensorRT-LLM's penalty kernel takes them."""
import pytest
import torch

from engine_helpers import make_engine
from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.sampling import SamplingParams, process_logits

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]


@pytest.fixture(scope="module")
def setup(tiny_models):
    path, hf = tiny_models["gdn"]
    return make_engine(path), hf


def run(engine, req):
    events = []
    engine.submit(req, events.append)
    while not (events and events[-1].finished):
        engine.step()
    assert events[-1].finish_reason in ("length", "stop"), events[-1].error
    return events


def reference(hf, prompt, tokens, process=lambda ids, x: x, temperature=1.0):
    """Per output token: (transformers' raw logits, log-softmax of the processed ones at that token)."""
    ids, raw, lps = list(prompt), [], []
    with torch.no_grad():
        for t in tokens:
            logits = hf(torch.tensor(ids)[None]).logits[0, -1].float()
            x = process(ids, logits / temperature)
            raw.append(logits)
            lps.append(float(torch.log_softmax(x, -1)[t]))
            ids.append(t)
    return torch.stack(raw), torch.tensor(lps)


def test_greedy_log_probs_and_generation_logits_are_transformers(setup):
    engine, hf = setup
    events = run(engine, GenerationRequest("lp", PROMPT, 6, SamplingParams(), return_log_probs=True,
                                           return_generation_logits=True))
    tokens = [t for e in events for t in e.token_ids]
    raw, lps = reference(hf, PROMPT, tokens)
    assert tokens == [int(r.argmax()) for r in raw]
    got = torch.tensor([lp for e in events for lp in e.log_probs])
    torch.testing.assert_close(got, lps, rtol=1e-4, atol=1e-4)
    # streamed per token, cumulative on every event
    cums = torch.tensor([e.cum_log_prob for e in events], dtype=torch.float64)
    torch.testing.assert_close(cums, torch.cumsum(lps.double(), 0), rtol=1e-4, atol=1e-4)
    gen = torch.cat([e.generation_logits for e in events])
    assert gen.shape == raw.shape
    torch.testing.assert_close(gen, raw, rtol=1e-4, atol=1e-4)


def test_sampled_log_probs_are_under_the_tempered_logits(setup):
    # TensorRT-LLM's log prob is log softmax(logits / T) at the sampled token, before the top-k/top-p cut
    engine, hf = setup
    sp = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, seed=5)
    events = run(engine, GenerationRequest("t", PROMPT, 6, sp, return_log_probs=True))
    tokens = [t for e in events for t in e.token_ids]
    _, lps = reference(hf, PROMPT, tokens, temperature=0.7)
    got = torch.tensor([lp for e in events for lp in e.log_probs])
    torch.testing.assert_close(got, lps, rtol=1e-4, atol=1e-4)


def hf_processors(prompt_len, end_id, min_tokens, rep, presence, frequency, bias):
    from transformers import MinLengthLogitsProcessor, RepetitionPenaltyLogitsProcessor
    rep_p = RepetitionPenaltyLogitsProcessor(rep)
    min_p = MinLengthLogitsProcessor(prompt_len + min_tokens, end_id)

    def process(ids, x):
        x = x.clone()
        for t, v in bias:
            x[t] += v
        ids_t = torch.tensor(ids)[None]
        x = rep_p(ids_t, x[None])[0]
        counts = torch.bincount(ids_t[0], minlength=x.numel()).float()
        x = x - presence * (counts > 0) - frequency * counts
        return min_p(ids_t, x[None])[0]
    return process


def test_penalties_bias_and_min_length_are_transformers_processors(setup):
    engine, hf = setup
    free = [t for e in run(engine, GenerationRequest("f", PROMPT, 3, SamplingParams())) for t in e.token_ids]
    end = free[1]
    bias = ((free[0], -3.0), (7, 2.5))
    kw = dict(rep=1.4, presence=0.6, frequency=0.35, bias=bias)
    sp = SamplingParams(repetition_penalty=kw["rep"], presence_penalty=kw["presence"],
                        frequency_penalty=kw["frequency"], embedding_bias=bias)
    events = run(engine, GenerationRequest("p", PROMPT, 6, sp, end_id=end, min_tokens=3, return_log_probs=True))
    tokens = [t for e in events for t in e.token_ids]
    process = hf_processors(len(PROMPT), end, 3, **kw)
    # the brute-force greedy under the processed logits, stopping at end_id, with its log probs
    ids, want, lps = list(PROMPT), [], []
    with torch.no_grad():
        while len(want) < 6:
            x = process(ids, hf(torch.tensor(ids)[None]).logits[0, -1].float())
            tok = int(x.argmax())
            if tok == end:
                break           # TensorRT-LLM's rule: the end token stops, and is not output (nor its log prob)
            want.append(tok)
            lps.append(float(torch.log_softmax(x, -1)[tok]))
            ids.append(tok)
    assert tokens == want and tokens != free[:len(tokens)]
    torch.testing.assert_close(torch.tensor([lp for e in events for lp in e.log_probs]), torch.tensor(lps),
                               rtol=1e-4, atol=1e-4)


def test_process_logits_exact_on_a_tiny_vocabulary():
    # dyadic logits and penalties: every operation is exact in fp32, so the comparison is exact
    from transformers import RepetitionPenaltyLogitsProcessor
    logits = torch.tensor([1.5, -2.0, 0.25, 3.0, -0.75, 0.0, 2.5, -1.25])
    history = [0, 1, 1, 3, 4, 4, 4]
    sp = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25,
                        embedding_bias=((2, 0.5), (6, -1.0)))
    got = process_logits(logits, sp, history, banned=[5])
    x = logits.clone()
    x[2] += 0.5
    x[6] -= 1.0
    x = RepetitionPenaltyLogitsProcessor(2.0)(torch.tensor([history]), x[None])[0]
    n = torch.bincount(torch.tensor(history), minlength=8).float()
    x = x - 0.5 * (n > 0) - 0.25 * n
    x[5] = float("-inf")
    assert torch.equal(got, x)
    # temperature scales before the penalties (TensorRT-LLM's order)
    sp2 = SamplingParams(temperature=0.5, top_k=1, repetition_penalty=2.0)
    want = RepetitionPenaltyLogitsProcessor(2.0)(torch.tensor([history]), (logits / 0.5)[None])[0]
    assert torch.equal(process_logits(logits, sp2, history), want)


def test_context_logits_on_the_final_event_too(setup):
    engine, hf = setup
    events = run(engine, GenerationRequest("c", PROMPT, 3, SamplingParams(), return_context_logits=True,
                                           use_cache=False))
    assert len(events) == 3 and events[0].context_logits is not None and events[-1].context_logits is not None
    with torch.no_grad():
        ref = hf(torch.tensor(PROMPT)[None]).logits[0].float()
    torch.testing.assert_close(events[-1].context_logits.float(), ref, rtol=1e-4, atol=1e-4)
