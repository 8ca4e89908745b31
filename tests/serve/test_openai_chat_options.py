"""vLLM's chat options on /v1/chat/completions: add_generation_prompt (default true) and continue_final_message
(default false: true leaves the last message open, no end-of-turn, so the model continues it).
The reference is transformers' apply_chat_template with the same two flags (what vLLM calls); both true is a
400, as vLLM's request validator refuses it. Before, the frontend ignored both (always a generation prompt):
a prefilled assistant message was closed and a new turn opened after it. The last message may have any role,
as in vLLM and transformers (neither checks it); the frontend used to refuse a non-assistant one with a 400."""
from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from test_openai_frontend import N, ensemble, post, stack  # noqa: F401  (the module's frontend fixture)
from test_openai_protocol import ASSET, CHATML
from trtllm_dasc.serve.openai_frontend import Frontend
from trtllm_dasc.serve.openai_protocol import APIError

# a template that trims each message: the continued text then loses its trailing space (transformers' rule)
TRIMMED = CHATML.replace("{{ m['content'] }}", "{{ m['content'] | trim }}")
PREFILL = [{"role": "user", "content": "Name a planet."}, {"role": "assistant", "content": "The closest one is "}]
# a continued message of another role: the user's half-written question, after a system message
USER_LAST = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name the planet that "}]


def engine_with(tmp_path, template):
    d = tmp_path / "e"
    shutil.copytree(ASSET, d / "model", ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((d / "model" / "tokenizer_config.json").read_text())
    (d / "model" / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    (d / "config.json").write_text(json.dumps({"engine": {"max_context": 256}, "source": str(ASSET)}))
    return d


@pytest.mark.parametrize("template", [CHATML, TRIMMED], ids=["chatml", "chatml-trim"])
def test_chat_options_render_as_transformers(tmp_path, template):
    from transformers import AutoTokenizer
    d = engine_with(tmp_path, template)
    tok = AutoTokenizer.from_pretrained(str(d / "model"))
    front = Frontend(str(d), "127.0.0.1:1")
    for add, cont in ((True, False), (False, False), (False, True)):
        want = tok.apply_chat_template(PREFILL, tokenize=False, add_generation_prompt=add,
                                       continue_final_message=cont)
        body = {"messages": PREFILL, "add_generation_prompt": add, "continue_final_message": cont}
        _, (req,) = front.requests(body, chat=True)
        assert tok.decode(req.prompt_ids) == want, (add, cont)
        assert req.prompt_ids == tok.encode(want, add_special_tokens=False)
    # continued: the assistant's text is the prompt's end (no <|im_end|>, no new turn)
    _, (req,) = front.requests({"messages": PREFILL, "add_generation_prompt": False,
                                "continue_final_message": True}, chat=True)
    assert tok.decode(req.prompt_ids).endswith("<|im_start|>assistant\nThe closest one is" +
                                               (" " if template == CHATML else ""))
    # the defaults are vLLM's: a generation prompt
    _, (req,) = front.requests({"messages": PREFILL}, chat=True)
    assert tok.decode(req.prompt_ids).endswith("<|im_end|>\n<|im_start|>assistant\n")
    # a last message of any role is continued as transformers continues it (a user's, a system's)
    for messages in (USER_LAST, USER_LAST[:1]):
        want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False,
                                       continue_final_message=True)
        _, (req,) = front.requests({"messages": messages, "add_generation_prompt": False,
                                    "continue_final_message": True}, chat=True)
        assert tok.decode(req.prompt_ids) == want and not want.endswith("<|im_end|>\n"), messages


def test_chat_options_are_validated_as_vllm(tmp_path):
    front = Frontend(str(engine_with(tmp_path, CHATML)), "127.0.0.1:1")
    bad = [({"continue_final_message": True}, "continue_final_message"),     # add_generation_prompt defaults true
           ({"add_generation_prompt": True, "continue_final_message": True}, "continue_final_message"),
           ({"add_generation_prompt": "no"}, "add_generation_prompt"),
           ({"continue_final_message": 1, "add_generation_prompt": False}, "continue_final_message")]
    for extra, param in bad:
        with pytest.raises(APIError) as e:
            front.requests({"messages": PREFILL, **extra}, chat=True)
        assert e.value.status == 400 and e.value.param == param, extra
    # a last message of any role can be continued (vLLM and transformers check no role); both flags stay a 400
    for role in ("user", "system", "developer"):      # (this template refuses a tool message at all)
        messages = [*PREFILL[:1], {"role": role, "content": "half a "}] if role != "user" else PREFILL[:1]
        front.requests({"messages": messages, "add_generation_prompt": False, "continue_final_message": True},
                       chat=True)
        with pytest.raises(APIError) as e:
            front.requests({"messages": messages, "continue_final_message": True}, chat=True)
        assert e.value.status == 400 and e.value.param == "continue_final_message", role


def test_continue_final_message_on_the_server(stack):
    """The default model has no chat_template (the plain fallback, one "role: content" line per message):
    the continued assistant line is the prompt's end; without a generation prompt there is no "assistant:"."""
    server, front = stack
    body = {"messages": PREFILL, "max_tokens": N, "temperature": 0}
    status, out = post(front, "/v1/chat/completions", {**body, "add_generation_prompt": False,
                                                       "continue_final_message": True})
    assert status == 200, out
    want = ensemble(server, "user: Name a planet.\nassistant: The closest one is ", N)
    assert out["choices"][0]["message"] == {"role": "assistant", "content": want}
    status, out = post(front, "/v1/chat/completions", {**body, "messages": PREFILL[:1], "add_generation_prompt": False})
    assert status == 200 and out["choices"][0]["message"]["content"] == ensemble(server, "user: Name a planet.", N)
    # the user's own last message continued: the same prompt (the fallback's line is unended either way)
    status, out = post(front, "/v1/chat/completions", {**body, "messages": PREFILL[:1], "add_generation_prompt": False,
                                                       "continue_final_message": True})
    assert status == 200 and out["choices"][0]["message"]["content"] == ensemble(server, "user: Name a planet.", N)
    status, out = post(front, "/v1/chat/completions", {**body, "continue_final_message": True})
    assert status == 400 and out["error"]["param"] == "continue_final_message"


@pytest.mark.parametrize("stream", [False, True], ids=["message", "stream"])
def test_the_reply_role_is_the_last_messages_without_a_generation_prompt(tmp_path, stream):
    """vLLM labels the reply with get_chat_request_role: "assistant" after a generation prompt, else the last
    message's role (the turn the model writes on). The frontend always said "assistant": a continued user
    message came back as the assistant's. Non-streamed: message.role; streamed: the first chunk's delta.role.
    Upstream is replaced by two pieces, no server needed. From a review; fails on the code before the fix."""
    front = Frontend(str(engine_with(tmp_path, CHATML)), "127.0.0.1:1")

    async def upstream(reqs):
        # (choice index, piece, new tokens, cached, finish_reason, logprobs), as Frontend.run_all yields them
        yield 0, "Jup", 1, 0, None, []
        yield 0, "iter", 1, None, "stop", []
    front.run_all = upstream

    def answer(body) -> list[dict]:
        sent = []

        async def send(status, payload):
            assert status == 200, payload
            if payload is not None:
                sent.append(payload)
                return None

            async def event(obj):
                if obj is not None:
                    sent.append(obj)
            return event
        asyncio.run(front.completion({**body, "stream": stream, "max_tokens": 2}, True, send))
        return sent

    cases = [({"messages": USER_LAST, "add_generation_prompt": False, "continue_final_message": True}, "user"),
             ({"messages": USER_LAST[:1], "add_generation_prompt": False}, "system"),
             ({"messages": PREFILL, "add_generation_prompt": False, "continue_final_message": True}, "assistant"),
             ({"messages": USER_LAST}, "assistant"), ({"messages": USER_LAST, "add_generation_prompt": True}, "assistant")]
    for body, role in cases:
        sent = answer(body)
        if stream:
            first, *rest = sent
            assert first["choices"][0]["delta"] == {"role": role, "content": ""}, (body, first)
            # later chunks carry content only, as before
            assert all("role" not in c["delta"] for e in rest for c in e["choices"]), rest
            assert "".join(c["delta"].get("content", "") for e in rest for c in e["choices"]) == "Jupiter"
        else:
            (out,) = sent
            assert out["choices"][0]["message"] == {"role": role, "content": "Jupiter"}, (body, out)
