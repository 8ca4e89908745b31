"""The OpenAI frontend's answers on the HTTP connection itself (raw sockets, no Triton behind it):
- a request head too large (one header line past the reader's 64 KiB buffer, or the head past MAX_HEAD) is a
  431 with OpenAI's error JSON, then the connection closes; before, the reader's ValueError escaped the handler
  and the connection dropped with no answer. Fails on the old code."""
from __future__ import annotations

from test_openai_chunked import BODY, exchange, front, post_head  # noqa: F401  (the frontend fixture)
from test_openai_protocol import engine_dir  # noqa: F401  (an engine directory of the embedded tokenizer)
from trtllm_dasc.serve.openai_http import MAX_HEAD


def with_headers(extra: str) -> bytes:
    return post_head("/v1/completions", f"{extra}Content-Length: {len(BODY)}\r\n") + BODY


def test_a_head_too_large_is_a_431_then_close(front):  # noqa: F811
    one_line = f"X-Big: {'a' * (70 << 10)}\r\n"                     # past the reader's buffer
    many = "".join(f"X-H{i}: {'b' * 1000}\r\n" for i in range(MAX_HEAD // 1000 + 2))   # each line fine
    long_target = f"GET /v1/models?{'q' * (70 << 10)} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    for wire in (with_headers(one_line), with_headers(many), long_target):
        (status, headers, out), rest = exchange(front.port, wire)
        assert status == 431 and headers["connection"] == "close", (status, headers, out)
        assert out["error"]["type"] == "invalid_request_error" and "header" in out["error"]["message"]
        assert rest == b""
    # a head under the limit is read as before (the body's model is checked: 404), the connection kept
    (status, headers, out), _ = exchange(front.port, with_headers(f"X-Ok: {'c' * 8000}\r\n"))
    assert status == 404 and out["error"]["code"] == "model_not_found" and "connection" not in headers
    # the limit is the frontend's to set
    front.frontend.max_head = 200
    (status, _, out), rest = exchange(front.port, with_headers(f"X-Ok: {'c' * 200}\r\n"))
    assert status == 431 and rest == b""
