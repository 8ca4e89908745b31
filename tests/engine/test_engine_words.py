"""TensorRT-LLM's stop/bad words and min_tokens, against a brute-force greedy reference that applies the
same rules to transformers' logits (the rules, not our code, define the expected tokens)."""
import pytest
import torch

from engine_helpers import greedy, make_engine
from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.errors import UserError


def reference(hf, prompt, n, bad=(), stop=(), end_id=None, min_tokens=0):
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            logits = hf(torch.tensor(ids)[None]).logits[0, -1].clone()
            for w in bad:
                if len(w) == 1 or ids[len(ids) - len(w) + 1:] == list(w[:-1]):
                    logits[w[-1]] = float("-inf")
            if end_id is not None and len(out) < min_tokens:
                logits[end_id] = float("-inf")
            tok = int(torch.argmax(logits))
            if tok == end_id:
                break           # TensorRT-LLM's rule: the end token stops, and is not output
            ids.append(tok)
            out.append(tok)
            if any(out[-len(w):] == list(w) for w in stop):
                break
    return out


@pytest.fixture(scope="module")
def setup(tiny_models):
    path, hf = tiny_models["kda"]
    return make_engine(path), hf


PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def test_bad_words_single_and_multi_token(setup):
    engine, hf = setup
    free = reference(hf, PROMPT, 6)
    # ban the first free token outright, and the third only after the second (a two-token bad word)
    bad = [[free[0]], [free[1], free[2]]]
    (out,) = engine.generate([GenerationRequest("b", PROMPT, 6, bad_words=bad)])
    assert out == reference(hf, PROMPT, 6, bad=bad) and out[0] != free[0]


def test_stop_words_end_the_output(setup):
    engine, hf = setup
    free = reference(hf, PROMPT, 8)
    stop = [free[2:4]]
    req = GenerationRequest("s", PROMPT, 8, stop_words=stop)
    (out,) = engine.generate([req])
    assert out == free[:4] == reference(hf, PROMPT, 8, stop=stop)


def test_min_tokens_holds_back_end_id(setup):
    engine, hf = setup
    free = reference(hf, PROMPT, 6)
    end = free[0]
    (out,) = engine.generate([greedy("m0", PROMPT, 6, end_id=end)])
    assert out == []            # stopped at once by its end token, which is not output
    (out,) = engine.generate([GenerationRequest("m3", PROMPT, 6, end_id=end, min_tokens=3)])
    assert out == reference(hf, PROMPT, 6, end_id=end, min_tokens=3) and len(out) >= 3


@pytest.mark.parametrize("kw,needle", [(dict(bad_words=[[]]), "bad_words: a word has no tokens"),
                                       (dict(stop_words=[[1, 10**6]]), "stop_words: a token id"),
                                       (dict(min_tokens=-1), "min_tokens"), (dict(bad_words=5), "bad_words")])
def test_bad_word_lists_are_refused(setup, kw, needle):
    engine, _ = setup
    with pytest.raises(UserError, match=needle):
        engine.submit(GenerationRequest("x", PROMPT, 2, **kw))


def test_a_multi_token_stop_word_needs_all_its_tokens(setup):
    engine, hf = setup
    free = reference(hf, PROMPT, 8)
    # a two-token stop word whose last token is the output's fourth but whose first is not its third
    first = next(t for t in range(100) if t != free[2] and [t, free[3]] not in
                 [free[i:i + 2] for i in range(len(free) - 1)])
    stop = [[first, free[3]]]
    (out,) = engine.generate([GenerationRequest("s2", PROMPT, 8, stop_words=stop)])
    assert out == free == reference(hf, PROMPT, 8, stop=stop) and len(out) == 8
