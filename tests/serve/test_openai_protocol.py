"""The OpenAI frontend's request side without a server: a tokenizer_config.json chat_template renders and
encodes as transformers' apply_chat_template does (the reference), template errors are a 400 naming
'messages', and the sampling fields map onto TensorRT-LLM's inputs (temperature 0 is greedy)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trtllm_dasc.serve.openai_frontend import Frontend
from trtllm_dasc.serve.openai_protocol import APIError, GenRequest

ASSET = Path(__file__).resolve().parents[2] / "trtllm_dasc" / "assets" / "tiny-kimi-linear"
CHATML = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}"
          "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "planet."}]}]


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    """An engine directory's two files the frontend reads: config.json and model/ with the tokenizer."""
    d = tmp_path_factory.mktemp("engine")
    shutil.copytree(ASSET, d / "model", ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((d / "model" / "tokenizer_config.json").read_text())
    (d / "model" / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHATML}))
    (d / "config.json").write_text(json.dumps({"engine": {"max_context": 256}, "source": str(ASSET)}))
    return d


def test_chat_template_equals_transformers(engine_dir):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(engine_dir / "model"))
    # text parts join with a newline, as vLLM's chat_utils joins them
    flat = [MESSAGES[0], {"role": "user", "content": "Name a \nplanet."}]
    want_text = tok.apply_chat_template(flat, tokenize=False, add_generation_prompt=True)
    want_ids = tok.apply_chat_template(flat, tokenize=True, add_generation_prompt=True)
    want_ids = list(want_ids["input_ids"] if hasattr(want_ids, "keys") else want_ids)
    front = Frontend(str(engine_dir), "127.0.0.1:1")
    assert front.template.kind == "jinja"
    assert front.template.render(MESSAGES) == (want_text, False)
    _, reqs = front.requests({"messages": MESSAGES, "max_tokens": 3}, chat=True)
    # the template writes BOS itself: no second one from the tokenizer
    assert reqs[0].prompt_ids == want_ids and want_ids.count(tok.bos_token_id) == 1


def test_template_errors_name_messages(engine_dir):
    front = Frontend(str(engine_dir), "127.0.0.1:1")
    with pytest.raises(APIError) as e:
        front.requests({"messages": [{"role": "tool", "content": "x"}]}, chat=True)
    assert e.value.param == "messages" and "no tools here" in e.value.message and e.value.status == 400
    with pytest.raises(APIError) as e:
        front.requests({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, chat=True)
    assert e.value.param == "messages[0].content"


def test_chat_max_tokens_defaults_to_the_context_left(engine_dir):
    front = Frontend(str(engine_dir), "127.0.0.1:1")
    _, reqs = front.requests({"messages": [{"role": "user", "content": "hi"}]}, chat=True)
    assert reqs[0].max_tokens == 256 - len(reqs[0].prompt_ids)
    _, reqs = front.requests({"prompt": "hi"}, chat=False)
    assert reqs[0].max_tokens == 16


def test_sampling_maps_to_tensorrt_llm_inputs():
    greedy = GenRequest([1, 5], 4, temperature=0.0, seed=7).triton_inputs(end_id=2)
    assert greedy["runtime_top_k"] == [1] and "temperature" not in greedy and greedy["seed"] == [7]
    assert greedy["end_id"] == [2] and greedy["input_lengths"] == [2] and greedy["streaming"] == [True]
    # OpenAI's defaults (temperature 1, top_p 1) sample from the whole distribution
    sampled = GenRequest([1], 4).triton_inputs(end_id=2)
    assert sampled["runtime_top_k"] == [0] and sampled["runtime_top_p"] == [1.0] and sampled["temperature"] == [1.0]
    # OpenAI's top_p 0 is the smallest nucleus, the top token: greedy. It went as TensorRT-LLM's top_p 1 (its
    # own 0 means off) and sampled the whole distribution (a review helper's finding; fails on the old code)
    tight = GenRequest([1], 4, top_p=0.0).triton_inputs(end_id=2)
    assert tight["runtime_top_k"] == [1] and "runtime_top_p" not in tight
    assert GenRequest([1], 4, ignore_eos=True).triton_inputs(end_id=2)["end_id"] == [-1]


def test_no_seed_samples_afresh_and_vllms_extensions_are_served_or_refused():
    """A review helper's findings against OpenAI / vLLM: without a seed every sampled request had the engine's
    seed 0, so the same sample; repetition_penalty, min_p, stop_token_ids and response_format were silently
    ignored; top_k -1 and negative int64 seeds (vLLM's) were refused."""
    from trtllm_dasc.serve.openai_protocol import common_fields
    seeds = {GenRequest([1], 4).triton_inputs(end_id=2)["seed"][0] for _ in range(4)}
    assert len(seeds) == 4                                            # a fresh seed each request
    assert "seed" not in GenRequest([1], 4, temperature=0.0).triton_inputs(end_id=2)   # greedy needs none
    assert GenRequest([1], 4, seed=9).triton_inputs(end_id=2)["seed"] == [9]
    fields = common_fields({"prompt": "hi", "repetition_penalty": 1.3, "top_k": -1, "seed": -5}, chat=False)
    s = fields["sampling"]
    assert (s["repetition_penalty"], s["top_k"], s["seed"]) == (1.3, 0, 2**64 - 5)
    assert GenRequest([1], 4, repetition_penalty=1.3).triton_inputs(end_id=2)["repetition_penalty"] == [1.3]
    assert "repetition_penalty" not in GenRequest([1], 4).triton_inputs(end_id=2)
    for name, value in (("min_p", 0.1), ("stop_token_ids", [5]), ("response_format", {"type": "json_object"})):
        with pytest.raises(APIError) as e:
            common_fields({"prompt": "hi", name: value}, chat=False)
        assert e.value.param == name
    common_fields({"prompt": "hi", "min_p": 0, "stop_token_ids": [], "response_format": {"type": "text"}}, chat=True)


def test_non_finite_numbers_are_refused_by_name():
    # Python's json parses NaN / Infinity, and NaN passes every range check: it went on to Triton
    from trtllm_dasc.serve.openai_protocol import common_fields
    for bad in ("NaN", "Infinity", "-Infinity"):
        body = json.loads('{"prompt": "hi", "temperature": %s}' % bad)
        with pytest.raises(APIError, match="'temperature' must be a finite number"):
            common_fields(body, chat=False)
    assert common_fields({"prompt": "hi", "temperature": 0.5}, chat=False)["sampling"]["temperature"] == 0.5


def test_an_upstream_error_in_a_chunked_body_keeps_its_message():
    # Triton's generate_stream answers a refused request with a chunked JSON body: read raw, the message
    # the client got was the chunk's size line ("4c")
    import asyncio
    from trtllm_dasc.serve.openai_frontend import _read_body, _upstream_error
    error = json.dumps({"error": "input 'temperature' must be finite"}).encode()
    wire = b"%x\r\n" % len(error) + error + b"\r\n0\r\n\r\n"

    async def read(data, headers):
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await _read_body(reader, headers)

    body = asyncio.run(read(wire, {"transfer-encoding": "chunked"}))
    assert body == error
    assert _upstream_error(body.decode(), 400).body()["error"]["message"] == "input 'temperature' must be finite"
    # by Content-Length, and a cut-short chunk: what came is the message
    assert asyncio.run(read(error + b"extra", {"content-length": str(len(error))})) == error
    assert asyncio.run(read(wire[:20], {"transfer-encoding": "chunked"})) == error[:20 - len(b"%x\r\n" % len(error))]


def test_templates_with_loop_controls_dates_and_json_render_as_transformers(tmp_path):
    """A template using {% continue %}, strftime_now (Llama 3's date line) and tojson of non-ASCII text: ours
    failed to load the first ('unknown tag continue': the frontend did not start) and refused every request with
    the second; transformers' apply_chat_template renders them. A template that does not parse is one line
    naming it. From a review helper; fails on the old code."""
    from transformers import AutoTokenizer
    from trtllm_dasc.errors import UserError
    template = ("{{ bos_token }}Today {{ strftime_now('%Y') }}{% for m in messages %}{% if m.role == 'system' %}"
                "{% continue %}{% endif %}<{{ m.role }}>{{ m.content | tojson }}{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% endif %}")
    d = tmp_path / "e"
    shutil.copytree(ASSET, d / "model", ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((d / "model" / "tokenizer_config.json").read_text())
    (d / "model" / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    (d / "config.json").write_text(json.dumps({"engine": {"max_context": 256}, "source": str(ASSET)}))
    tok = AutoTokenizer.from_pretrained(str(d / "model"))
    messages = [{"role": "system", "content": "skip me"}, {"role": "user", "content": "héllo"}]
    want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "héllo" in want and "skip me" not in want
    assert Frontend(str(d), "127.0.0.1:1").template.render(messages) == (want, False)
    (d / "model" / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{% for %}"}))
    with pytest.raises(UserError, match="chat_template does not parse"):
        Frontend(str(d), "127.0.0.1:1")
