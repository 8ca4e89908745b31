"""The OpenAI frontend's answers on the HTTP connection itself (raw sockets, no Triton behind it):
- a request head too large (one header line past the reader's 64 KiB buffer, or the head past MAX_HEAD) is a
  431 with OpenAI's error JSON, then the connection closes; before, the reader's ValueError escaped the handler
  and the connection dropped with no answer. Fails on the old code.
- an answer after which the frontend closes the connection says `Connection: close` (RFC 9112 9.6): a request
  with both Transfer-Encoding and Content-Length (then closed, as RFC 9112 6.3 asks), a client's own
  `Connection: close`, HTTP/1.0 without keep-alive, a refused body (413, 400, 501); before, the first was
  answered without it and the connection then closed under a client that meant to reuse it. Fails on the
  old code."""
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


def test_an_answer_before_close_says_connection_close(front):  # noqa: F811
    models = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    te_cl = post_head("/v1/completions", "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n") + \
        b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n"
    closing = (te_cl,
               b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Close\r\n\r\n",
               b"GET /v1/models HTTP/1.0\r\n\r\n")
    for wire in closing:
        # a next request on the same connection is not answered: the connection closed after the first answer
        (status, headers, out), rest = exchange(front.port, wire + models)
        assert status in (200, 404) and headers.get("connection") == "close", (wire[:60], status, headers)
        assert rest == b"", wire[:60]
    # a refused body (the connection closes after it) says so too
    for extra, body in (("Transfer-Encoding: chunked\r\n", b"zz\r\n"), ("Transfer-Encoding: gzip\r\n", b""),
                        ("Content-Length: 12abc\r\n", b""), (f"Content-Length: {1 << 40}\r\n", b"")):
        (status, headers, _), rest = exchange(front.port, post_head("/v1/completions", extra) + body)
        assert status in (400, 413, 501) and headers.get("connection") == "close" and rest == b"", extra
    # a kept connection (HTTP/1.1, HTTP/1.0 with keep-alive) says nothing and answers the next request
    for first in (models, b"GET /v1/models HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"):
        (status, headers, _), (status2, _, _), _ = exchange(front.port, first + models, answers=2)
        assert (status, status2) == (200, 200) and "connection" not in headers, first
