"""The OpenAI-compatible frontend (serve/openai_frontend.py) in front of the real tritonserver serving the
embedded default model, through stdlib http.client (and the `openai` package where installed): completions,
non-streamed and streamed (SSE), equal the ensemble's own greedy output for the same text; chat renders
the messages (the plain fallback: the default model has no chat_template) and equals the ensemble on that
text; stop strings cut the text; /v1/models lists the model; bad fields give an OpenAI-style 400 naming
the field. The jinja2 chat template is checked against transformers' apply_chat_template."""
from __future__ import annotations

import http.client
import json
import urllib.request
from pathlib import Path

import pytest

from trtllm_dasc.serve.openai_frontend import start_frontend

ASSET = Path(__file__).resolve().parents[2] / "trtllm_dasc" / "assets" / "tiny-kimi-linear"
PROMPT = "Question: which planet is closest to the sun? Answer:"
N = 12


@pytest.fixture(scope="module")
def stack(default_engine, default_server):
    # the session's shared server of the default engine (tests/serve/conftest.py)
    front = start_frontend(str(default_engine), default_server.http_url)
    yield default_server, front
    front.stop()


def ensemble(server, text: str, n: int) -> str:
    """The reference: Triton's own generate endpoint on the ensemble (preprocessing, core, postprocessing)."""
    body = json.dumps({"text_input": text, "max_tokens": n, "exclude_input_in_output": True}).encode()
    url = f"http://{server.http_url}/v2/models/ensemble/generate"
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=120) as r:
        return json.loads(r.read())["text_output"]


def post(front, path: str, body) -> tuple[int, dict | list]:
    """(status, JSON body) or, for a stream, (status, [event dicts..., '[DONE]'])."""
    conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=120)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read().decode()
    conn.close()
    if r.getheader("Content-Type", "").startswith("text/event-stream"):
        events = [l[len("data: "):] for l in data.split("\n\n") if l.startswith("data: ")]
        return r.status, [e if e == "[DONE]" else json.loads(e) for e in events]
    return r.status, json.loads(data)


def test_completions_equal_the_ensemble(stack):
    server, front = stack
    want = ensemble(server, PROMPT, N)
    status, out = post(front, "/v1/completions", {"model": "tiny-kimi-linear", "prompt": PROMPT, "max_tokens": N,
                                                  "temperature": 0})
    assert status == 200, out
    assert out["object"] == "text_completion" and out["choices"][0]["text"] == want
    assert out["choices"][0]["finish_reason"] == "length"
    usage = out["usage"]
    assert usage["completion_tokens"] == N and usage["total_tokens"] == usage["prompt_tokens"] + N
    # the prompt's tokens: BOS + the tokenizer's encoding (transformers' AutoTokenizer is the reference)
    from transformers import AutoTokenizer
    assert usage["prompt_tokens"] == len(AutoTokenizer.from_pretrained(str(ASSET)).encode(PROMPT))

    status, events = post(front, "/v1/completions", {"prompt": PROMPT, "max_tokens": N, "temperature": 0,
                                                     "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == want
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and len(chunks) > 2
    # the repeat of the prompt is served from the cache; usage comes last with choices []
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == N
    assert events[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_prompt_lists_and_token_ids(stack):
    server, front = stack
    other = "The ancient merchant traded salt for"
    status, out = post(front, "/v1/completions", {"prompt": [PROMPT, other], "max_tokens": 6, "temperature": 0})
    assert status == 200, out
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert [c["text"] for c in out["choices"]] == [ensemble(server, PROMPT, 6), ensemble(server, other, 6)]
    from transformers import AutoTokenizer
    ids = AutoTokenizer.from_pretrained(str(ASSET)).encode(other)
    status, out = post(front, "/v1/completions", {"prompt": ids, "max_tokens": 6, "temperature": 0})
    assert status == 200 and out["choices"][0]["text"] == ensemble(server, other, 6)


def test_stop_string_cuts_the_text(stack):
    server, front = stack
    want = ensemble(server, PROMPT, N)
    stop = want.strip()[3:6]
    assert stop and want.find(stop) > 0
    for stream in (False, True):
        status, out = post(front, "/v1/completions", {"prompt": PROMPT, "max_tokens": N, "temperature": 0,
                                                      "stop": [stop], "stream": stream})
        assert status == 200, out
        choices = [c for e in out[:-1] for c in e["choices"]] if stream else out["choices"]
        assert "".join(c["text"] for c in choices) == want[:want.find(stop)]
        assert choices[-1]["finish_reason"] == "stop"


def test_chat_with_the_plain_template(stack):
    server, front = stack
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a planet."}]
    # the documented fallback: one "role: content" line per message, then "assistant:"
    want = ensemble(server, "system: Be brief.\nuser: Name a planet.\nassistant:", N)
    status, out = post(front, "/v1/chat/completions", {"model": "ensemble", "messages": messages,
                                                       "max_tokens": N, "temperature": 0})
    assert status == 200, out
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": want}
    status, events = post(front, "/v1/chat/completions", {"messages": messages, "max_completion_tokens": N,
                                                          "temperature": 0, "stream": True})
    assert status == 200 and events[-1] == "[DONE]"
    assert events[0]["object"] == "chat.completion.chunk" and events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == want
    # include_usage: every chunk but the usage one has usage null, the role chunk too (OpenAI's reference; the
    # role chunk had no usage key: a review helper)
    status, events = post(front, "/v1/chat/completions", {"messages": messages, "max_tokens": N, "temperature": 0,
                                                          "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200 and all(e["usage"] is None for e in events[:-2]) and events[-2]["usage"]


def test_models_lists_the_model(stack):
    _, front = stack
    conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=30)
    conn.request("GET", "/v1/models")
    r = conn.getresponse()
    out = json.loads(r.read())
    assert r.status == 200 and out["object"] == "list"
    assert [m["id"] for m in out["data"]] == ["tiny-kimi-linear"] and out["data"][0]["object"] == "model"


@pytest.mark.parametrize("field,body", [
    ("n", {"n": 2}), ("logprobs", {"logprobs": 21}), ("logprobs", {"logprobs": "1"}), ("temperature", {"temperature": "hot"}),
    ("temperature", {"temperature": 3}), ("top_p", {"top_p": 1.5}), ("max_tokens", {"max_tokens": 0}),
    ("max_tokens", {"max_tokens": 5000}), ("prompt", {"prompt": {"a": 1}}), ("prompt", {"prompt": [10**9]}),
    ("stop", {"stop": 5}), ("stream", {"stream": "yes"}), ("seed", {"seed": 2**64}), ("echo", {"echo": "yes"}),
])
def test_bad_fields_are_400_naming_the_field(stack, field, body):
    _, front = stack
    status, out = post(front, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, **body})
    assert status == 400, out
    assert out["error"]["param"] == field and field in out["error"]["message"]
    assert out["error"]["type"] == "invalid_request_error"


def test_bad_chat_and_unknown_model(stack):
    _, front = stack
    status, out = post(front, "/v1/chat/completions", {"messages": "hi"})
    assert status == 400 and out["error"]["param"] == "messages"
    status, out = post(front, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 3})
    assert status == 400 and out["error"]["param"] == "n"
    status, out = post(front, "/v1/completions", {"model": "gpt-4", "prompt": "hi"})
    assert status == 404 and out["error"]["code"] == "model_not_found"
    status, out = post(front, "/v1/nothing", {})
    assert status == 404 and "error" in out
    # the server keeps serving after the errors
    status, out = post(front, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0})
    assert status == 200 and out["usage"]["completion_tokens"] == 2


def test_openai_client(stack):
    openai = pytest.importorskip("openai", reason="the openai package is not installed (test extras)")
    server, front = stack
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{front.port}/v1", api_key="none")
    want = ensemble(server, PROMPT, N)
    assert [m.id for m in client.models.list()] == ["tiny-kimi-linear"]
    out = client.completions.create(model="tiny-kimi-linear", prompt=PROMPT, max_tokens=N, temperature=0)
    assert out.choices[0].text == want and out.usage.completion_tokens == N
    pieces = client.completions.create(model="tiny-kimi-linear", prompt=PROMPT, max_tokens=N, temperature=0,
                                       stream=True)
    assert "".join(c.choices[0].text for c in pieces if c.choices) == want
    chat = client.chat.completions.create(model="tiny-kimi-linear", max_tokens=N, temperature=0,
                                          messages=[{"role": "user", "content": "Name a planet."}], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chat if c.choices)
    assert text == ensemble(server, "user: Name a planet.\nassistant:", N)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny-kimi-linear", prompt=PROMPT, max_tokens=N, n=2)
    assert e.value.param == "n"
