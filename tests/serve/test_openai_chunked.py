"""Request bodies in the chunked transfer coding (no Content-Length; RFC 9112 7.1), as curl, http.client and
httpx send a streamed body. The frontend read only Content-Length: a chunked body was read as empty (a 400,
"the request body must be a JSON object") and its chunks then as the next request (the connection dropped).
An oversize body is a 413 with OpenAI's error JSON (a Content-Length past the limit dropped the connection
with no answer), a malformed one a 400, another transfer coding a 501. Fails on the old code."""
from __future__ import annotations

import http.client
import json
import socket

import pytest

from test_openai_frontend import PROMPT, ensemble, stack  # noqa: F401  (the module's frontend fixture)
from test_openai_protocol import engine_dir  # noqa: F401  (an engine directory of the embedded tokenizer)
from trtllm_dasc.serve.openai_frontend import Frontend, FrontendThread
from trtllm_dasc.serve.openai_http import MAX_BODY


@pytest.fixture
def front(engine_dir):  # noqa: F811
    # no Triton behind it (port 1): the model check answers before any upstream call, proving the body was read
    thread = FrontendThread(Frontend(str(engine_dir), "127.0.0.1:1"), "127.0.0.1", 0)
    yield thread
    thread.stop()


def chunked(body: bytes, sizes=(7, 1, 50)) -> bytes:
    """body in chunks of the given sizes (the rest in one), one with an extension, then a trailer field."""
    out, at = b"", 0
    for n in (*sizes, len(body)):
        piece, at = body[at:at + n], at + n
        if piece:
            out += b"%x;ext=1\r\n" % len(piece) + piece + b"\r\n"
    return out + b"0\r\nX-Trailer: 1\r\n\r\n"


def read_response(f) -> tuple[int, dict, dict | None]:
    line = f.readline()
    assert line, "the server closed the connection without an answer"
    status = int(line.split()[1])
    headers = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", 0))
    return status, headers, json.loads(f.read(n)) if n else None


def exchange(port: int, wire: bytes, answers: int = 1) -> list:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(wire)
        f = s.makefile("rb")
        out = [read_response(f) for _ in range(answers)]
        # what follows the answers: b"" once the server closed (a kept connection closes on our end of input)
        s.shutdown(socket.SHUT_WR)
        out.append(f.read())
    return out


def post_head(path: str, extra: str) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}\r\n".encode()


BODY = json.dumps({"model": "no-such-model", "prompt": "hi", "max_tokens": 2}).encode()


def test_a_chunked_body_is_read_and_the_connection_kept(front):
    wire = post_head("/v1/completions", "Transfer-Encoding: chunked\r\n") + chunked(BODY)
    wire += b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    (status, _, out), (status2, _, models), _ = exchange(front.port, wire, answers=2)
    # the body's model was read (404), and the next request on the connection is answered after it
    assert status == 404 and out["error"]["code"] == "model_not_found", out
    assert status2 == 200 and models["data"][0]["id"] == "tiny-kimi-linear"
    # Expect: 100-continue (curl's for a chunked upload): 100 first, then the answer
    wire = post_head("/v1/completions", "Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n") + chunked(BODY)
    (cont, _, _), (status, _, out), _ = exchange(front.port, wire, answers=2)
    assert (cont, status, out["error"]["code"]) == (100, 404, "model_not_found")
    # http.client sends an iterable body chunked
    conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=iter([b'{"messages": ', b'"hi"}']), encode_chunked=True,
                 headers={"Transfer-Encoding": "chunked"})
    r = conn.getresponse()
    out = json.loads(r.read())
    assert r.status == 400 and out["error"]["param"] == "messages", out


def test_oversize_and_malformed_bodies_are_refused_clearly(front):
    # a Content-Length past the limit: a 413 at once (the body need not be sent), then the connection closes
    (status, headers, out), rest = exchange(front.port, post_head("/v1/completions", f"Content-Length: {MAX_BODY + 1}\r\n"))
    assert status == 413 and "at most" in out["error"]["message"] and headers["connection"] == "close"
    assert rest == b""
    # a chunked body past the limit: 413 once the chunks pass it, the rest of the body read and dropped
    front.frontend.max_body = 1000
    big = json.dumps({"prompt": "x" * 3000}).encode()
    (status, _, out), rest = exchange(front.port, post_head("/v1/completions", "Transfer-Encoding: chunked\r\n") +
                                      chunked(big, (600, 600)))
    assert status == 413 and out["error"]["type"] == "invalid_request_error" and rest == b""
    for extra, body, want in (("Transfer-Encoding: chunked\r\n", b"zz\r\nab\r\n0\r\n\r\n", 400),
                              ("Transfer-Encoding: chunked\r\n", b"2\r\nabc\r\n0\r\n\r\n", 400),
                              ("Transfer-Encoding: gzip, chunked\r\n", b"", 501),
                              ("Content-Length: 12abc\r\n", b"", 400)):
        (status, _, out), rest = exchange(front.port, post_head("/v1/completions", extra) + body)
        assert status == want and out["error"]["message"], (extra, body, out)


def test_a_chunked_completion_equals_the_ensemble(stack):
    server, front = stack
    conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=120)
    body = json.dumps({"prompt": PROMPT, "max_tokens": 6, "temperature": 0}).encode()
    conn.request("POST", "/v1/completions", body=iter([body[:10], body[10:]]), encode_chunked=True,
                 headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    r = conn.getresponse()
    out = json.loads(r.read())
    assert r.status == 200 and out["choices"][0]["text"] == ensemble(server, PROMPT, 6), out
