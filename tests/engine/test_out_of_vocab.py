"""Prompt token ids outside the vocabulary under out_of_vocab_inputs="zero" (a built engine's default, as
TensorRT-LLM's embedding lookup writes zeros for them and its benchmark_core_model.py sends random ids in
[0, 2^31)): the model sees a zero embedding there. The reference is transformers' model given the same zero
rows as inputs_embeds. --wmax 0 (dense): a cached hit is exact, so the hit is compared too."""
import pytest
import torch

from engine_helpers import VOCAB, make_engine, one_torch_thread
from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.sampling import SamplingParams, process_logits
from trtllm_dasc.errors import UserError

_one_thread = pytest.fixture(scope="module", autouse=True)(one_torch_thread)

# beside ordinary ids: just past the vocabulary, negative, and the largest INT32 (benchmark_core_model's range)
PROMPT = [3, VOCAB + 5, 7, 11, -2, 13, 2**31 - 1, 9, 4, 21, 6, 30, 2]


def _zero_embedded(hf, ids):
    """transformers' input embeddings of ids, a zero row for each id outside [0, VOCAB)."""
    t = torch.tensor(ids)
    inside = (t >= 0) & (t < VOCAB)
    with torch.no_grad():
        e = hf.get_input_embeddings()(torch.where(inside, t, 0))
    return e * inside[:, None].to(e.dtype)


def _hf_logits(hf, ids):
    with torch.no_grad():
        return hf(inputs_embeds=_zero_embedded(hf, ids)[None]).logits[0].float()


def _close(out, ref, rel=1e-4):
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert ((out - ref).abs().max() / ref.abs().max()).item() < rel


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_out_of_vocab_ids_are_zero_embeddings_as_transformers_computes_them(tiny_models, arch):
    path, hf = tiny_models[arch]
    engine = make_engine(path, out_of_vocab_inputs="zero")
    got = {}
    req = GenerationRequest("oov", PROMPT, 3, SamplingParams(), return_context_logits=True)
    engine.submit(req, lambda out: got.update(out=out) if out.context_logits is not None else None)
    engine.run_until_idle()
    _close(got["out"].context_logits, _hf_logits(hf, PROMPT))
    # the greedy continuation, each next token from transformers' logits over the zero-embedded prompt
    ids = list(PROMPT)
    for _ in range(3):
        ids.append(int(torch.argmax(_hf_logits(hf, ids)[-1])))
    assert engine.generate([GenerationRequest("again", PROMPT, 3, SamplingParams(), use_cache=False)]) \
        == [ids[len(PROMPT):]]
    engine.sanity_check()


def test_a_cached_prefix_holding_out_of_vocab_ids_is_hit_exactly(tiny_models):
    path, hf = tiny_models["kda"]
    engine = make_engine(path, out_of_vocab_inputs="zero", wmax=0, interval=4)
    engine.generate([GenerationRequest("first", PROMPT, 1, SamplingParams())])
    longer = PROMPT + [VOCAB + 1, 8]
    got = {}
    req = GenerationRequest("hit", longer, 1, SamplingParams(), return_context_logits=True)
    engine.submit(req, lambda out: got.update(out=out) if out.context_logits is not None else None)
    engine.run_until_idle()
    hit = req.stats.cached_tokens
    assert hit >= 8
    _close(got["out"].context_logits, _hf_logits(hf, longer)[hit:])
    engine.sanity_check()


def test_refuse_keeps_refusing_and_zero_still_wants_32_bit_ids(tiny_models):
    path, _ = tiny_models["gdn"]
    strict = make_engine(path)                          # an engine made directly refuses (EngineConfig's default)
    with pytest.raises(UserError, match="outside the vocabulary"):
        strict.submit(GenerationRequest(1, [1, VOCAB], 2))
    lenient = make_engine(path, out_of_vocab_inputs="zero")
    for bad in (2**31, -(2**31) - 1):
        with pytest.raises(UserError, match="not a 32-bit integer"):
            lenient.submit(GenerationRequest(2, [1, bad], 2))
    lenient.sanity_check()
    with pytest.raises(UserError, match="out_of_vocab_inputs"):
        make_engine(path, out_of_vocab_inputs="clamp")


def test_penalties_count_only_ids_inside_the_vocabulary():
    """The prompt's out-of-vocabulary ids have no logit to penalise (and 2^31 - 1 must not make a 2^31-bin
    count): worked by hand, token 1 twice and token 4 once in the history."""
    logits = torch.tensor([0.5, 2.0, -1.0, 3.0, -2.0])
    p = SamplingParams(repetition_penalty=2.0, presence_penalty=0.25, frequency_penalty=0.5)
    out = process_logits(logits, p, history=[1, VOCAB + 3, 1, -1, 2**31 - 1, 4])
    expect = torch.tensor([0.5, 2.0 / 2 - 0.25 - 0.5 * 2, -1.0, 3.0, -2.0 * 2 - 0.25 - 0.5 * 1])
    assert torch.equal(out, expect)
