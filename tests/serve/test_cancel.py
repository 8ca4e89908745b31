"""Client cancellation reaches the engine (issue 30 item 3), on the real tritonserver serving the embedded
default model: gRPC `stop_stream(cancel_requests=True)` on a stream to the core model and a dropped HTTP
connection to its `generate_stream` (SSE), and a gRPC stream to the ensemble, each end the request in the engine within a step or two (counted
in dasc_requests_ended_total{reason="cancelled"}, the running gauge back to 0, long before max_tokens
would be reached), and leave nothing in flight: the following shutdown takes seconds, not Triton's 30 s
exit timeout, and kills nothing."""
from __future__ import annotations

import json
import re
import socket
import time
import urllib.request

import pytest

from serve_helpers import Stream

PROMPT = [5, 17, 29, 41, 53, 65, 77]
# about ten seconds of generation here: a cancel seen within ~2 s stopped it well before max_tokens
N = 1000


@pytest.fixture(scope="module")
def server(default_server):
    # the session's shared server of the default engine (tests/serve/conftest.py), its drain 1 s
    return default_server


def metric(server, name: str, labels: str = "") -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


CANCELLED = ("dasc_requests_ended_total", '{reason="cancelled"}')


def wait_cancelled(server, before: float, timeout: float = 30.0) -> float:
    """Seconds until the engine counted one more cancelled request and runs nothing (a bound for a loaded
    2-core CI machine: the counter says "cancelled", which a request that ran to its end never is)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if metric(server, *CANCELLED) >= before + 1 and metric(server, "dasc_running_requests") == 0:
            return time.time() - t0
        time.sleep(0.1)
    raise AssertionError(f"not cancelled in the engine within {timeout} s: cancelled "
                         f"{metric(server, *CANCELLED)} (before {before}), running "
                         f"{metric(server, 'dasc_running_requests')}")


def test_grpc_stream_cancel_aborts_in_the_engine(server):
    before = metric(server, *CANCELLED)
    stream = Stream(server.grpc_url)
    stream.generate("g1", PROMPT, N)
    for _ in range(3):
        _, tokens, final, _, error = stream.next()
        assert error is None and tokens and not final
    stream.close(cancel=True)
    wait_cancelled(server, before)


def test_grpc_ensemble_stream_cancel_aborts_in_the_engine(server):
    # the ensemble (text in, text out) is a decoupled Python model forwarding the cancellation as a stop:
    # Triton's ensemble platform never passed it on, and the engine generated all N tokens
    before = metric(server, *CANCELLED)
    stream = Stream(server.grpc_url)
    stream.generate_text("e1", "The quick brown fox", N)
    for _ in range(3):
        _, _, final, _, error = stream.next()
        assert error is None and not final
    stream.close(cancel=True)
    wait_cancelled(server, before)


def test_dropped_sse_connection_aborts_in_the_engine(server):
    before = metric(server, *CANCELLED)
    body = json.dumps({"input_ids": PROMPT, "input_lengths": [len(PROMPT)], "request_output_len": [N],
                       "streaming": [True]}).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.sendall(b"POST /v2/models/tensorrt_llm/generate_stream HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while got.count(b"data:") < 3:
        chunk = sock.recv(4096)
        assert chunk, got
        got += chunk
    assert b"output_ids" in got, got[:500]
    sock.close()
    wait_cancelled(server, before)


def test_a_non_streaming_openai_client_that_leaves_is_aborted(server, default_engine):
    """The OpenAI frontend's non-streaming answer watched nothing while it waited: a client that timed out and
    closed held its batch slot until max_tokens, and the request counted as completed. Now the frontend sees
    the connection close and cancels upstream. From a review helper; fails on the old code (not cancelled)."""
    from trtllm_dasc.serve.openai_frontend import start_frontend
    front = start_frontend(str(default_engine), server.http_url)
    try:
        before = metric(server, *CANCELLED)
        body = json.dumps({"prompt": "Hello world", "max_tokens": N, "temperature": 0, "ignore_eos": True}).encode()
        sock = socket.create_connection(("127.0.0.1", front.port), timeout=30)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        t0 = time.time()
        while metric(server, "dasc_running_requests") == 0 and time.time() - t0 < 30:
            time.sleep(0.05)
        sock.close()
        wait_cancelled(server, before)
    finally:
        front.stop()


def test_shutdown_after_cancels_is_prompt(server):
    # runs last in this module: nothing of the cancelled requests is in flight, so the drain is immediate
    # and tritonserver unloads at once (before: it waited for in-flight inferences up to 30 s)
    t0 = time.time()
    server.stop()
    assert time.time() - t0 < 15, (time.time() - t0, server.stop_report)
    assert not server.stop_report["killed"], server.stop_report
