"""Guards of a served model against other clients, on the real tritonserver serving the embedded default
model. (1) A stop acts only on the request that asked (issue 29 item 3, issue 30 item 2), against the real
tritonserver serving the embedded default model, through tritonclient's gRPC streams as TensorRT-LLM's
stock client sends them: an empty request id (the stock client's default) is "no id" and never matches
another client's request; a second in-flight request under a taken id is served, and a stop names the latest
(TensorRT-LLM's rule); a request a stop ended says so in its final response (output finish_reason 'cancelled'), never passing for a completion.
(2) The model-repository and shared-memory APIs answer only requests with the run's admin key."""
from __future__ import annotations

import queue
import time

import numpy as np
import pytest

from serve_helpers import triton_inputs

# long enough to still be generating when the stop arrives (a few hundred ms on the CPU)
N = 400
PROMPT = [5, 17, 29, 41, 53, 65, 77]


@pytest.fixture(scope="module")
def server(default_server):
    # the session's shared server of the default engine (tests/serve/conftest.py), with its admin key
    assert default_server.admin_key
    return default_server


class Stream:
    """One client's gRPC stream; every response in arrival order as (request id, tokens, final, params, error)."""

    def __init__(self, url):
        import tritonclient.grpc as grpc
        self.grpc, self.events = grpc, queue.Queue()
        self.client = grpc.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self.events.put((result, error)))

    def send(self, rid, inputs):
        self.client.async_stream_infer("tensorrt_llm", inputs, request_id=rid, enable_empty_final_response=True)

    def generate(self, rid, n=N):
        self.send(rid, triton_inputs(self.grpc, PROMPT, n, streaming=True))

    def stop(self, rid):
        # what TensorRT-LLM's client sends (prepare_stop_signals): dummy inputs and stop = true
        self.send(rid, triton_inputs(self.grpc, [0], 0, input_lengths=np.array([[0]], np.int32), stop=True))

    def next(self, timeout=120):
        result, error = self.events.get(timeout=timeout)
        if error is not None:
            return None, [], True, {}, error.message()
        resp = result.get_response()
        ids, reason = result.as_numpy("output_ids"), result.as_numpy("finish_reason")
        final = resp.parameters["triton_final_response"].bool_param
        params = {} if reason is None else {"finish_reason": reason.reshape(-1)[0].decode()}
        return resp.id, ids.reshape(-1).tolist() if ids is not None else [], final, params, None

    def close(self):
        self.client.stop_stream()
        self.client.close()


def first_token(stream):
    rid, tokens, final, _, error = stream.next()
    assert error is None and tokens and not final, (error, tokens, final)
    return tokens


def drain(stream, tokens):
    """The rest of a generating request: (all its tokens, its final response's parameters)."""
    while True:
        _, new, final, params, error = stream.next()
        assert error is None, error
        tokens = tokens + new
        if final:
            return tokens, params


def test_stop_with_an_empty_id_stops_no_one_else(server):
    a, b = Stream(server.grpc_url), Stream(server.grpc_url)
    try:
        a.generate("")
        got_a = first_token(a)
        b.generate("")
        got_b = first_token(b)
        b.stop("")
        # the issue: a's request was cut short by b's stop, with a normal-looking end
        tokens_a, params_a = drain(a, got_a)
        assert len(tokens_a) == N and params_a["finish_reason"] == "length", (len(tokens_a), params_a)
        # b's stream: its own request keeps going; the stop is refused in one line naming what is missing
        stop_error, rest_b = None, got_b
        while True:
            _, new, final, params, error = b.next()
            if error is not None:
                stop_error = error
                continue
            rest_b += new
            if final:
                break
        assert stop_error is not None and "request id" in stop_error, stop_error
        assert len(rest_b) == N and params["finish_reason"] == "length"
        # greedy, same prompt: both requests produced the same, complete output
        assert tokens_a == rest_b
    finally:
        a.close()
        b.close()


def test_a_repeated_id_is_served_and_a_stop_ends_the_latest_with_it(server):
    """Two clients in flight under one id (each numbering its requests from 0): TensorRT-LLM serves both and a
    stop names the newest with that id (model_instance_state.cc maps the id to the latest request); so here.
    Once it has ended, the next stop under the id ends the earlier one. We refused the second request (a review
    helper, comparing with tensorrtllm_backend; fails on the old code)."""
    a, b, c, d = (Stream(server.grpc_url) for _ in range(4))
    try:
        a.generate("job-1")
        got_a = first_token(a)
        b.generate("other")
        got_b = first_token(b)
        c.generate("job-1")                       # the same id, while the first runs: served
        got_c = first_token(c)
        d.stop("job-1")                           # the latest under job-1: c's
        _, tokens, final, params, error = d.next()
        assert error is None and final and tokens == [], (error, params)
        tokens_c, params_c = drain(c, got_c)
        assert len(tokens_c) < N and params_c["finish_reason"] == "cancelled", (len(tokens_c), params_c)
        d.stop("job-1")                           # c has ended: now a's
        _, tokens, final, params, error = d.next()
        assert error is None and final and tokens == [], (error, params)
        tokens_a, params_a = drain(a, got_a)
        assert len(tokens_a) < N and params_a["finish_reason"] == "cancelled", (len(tokens_a), params_a)
        # the other id ran to its end
        tokens_b, params_b = drain(b, got_b)
        assert len(tokens_b) == N and params_b["finish_reason"] == "length"
    finally:
        for s in (a, b, c, d):
            s.close()


def test_repository_and_shared_memory_apis_want_the_admin_key(server):
    import tritonclient.grpc as grpc
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException
    g, h = grpc.InferenceServerClient(server.grpc_url), http.InferenceServerClient(server.http_url)
    try:
        refused = []
        for call in (lambda c, **kw: c.load_model("tensorrt_llm", **kw),
                     lambda c, **kw: c.get_model_repository_index(**kw),
                     lambda c, **kw: c.register_system_shared_memory("probe", "/dasc_probe", 64, **kw),
                     lambda c, **kw: c.get_system_shared_memory_status(**kw)):
            for client in (g, h):
                with pytest.raises(InferenceServerException) as e:
                    call(client)
                refused.append(str(e.value))
        assert all("restricted" in r.lower() and "dasc-admin-key" in r for r in refused), refused
        # with the key the same APIs answer (the index lists our model; no region is registered)
        for client, protocol in ((g, "grpc"), (h, "http")):
            index = client.get_model_repository_index(headers=server.admin_headers(protocol))
            names = [m.name for m in index.models] if hasattr(index, "models") else [m["name"] for m in index]
            assert "tensorrt_llm" in names
            client.get_system_shared_memory_status(headers=server.admin_headers(protocol))
        # inference stays open
        assert g.is_model_ready("tensorrt_llm") and h.is_server_ready()
    finally:
        g.close()
        h.close()


def _forwarded_inputs(grpc, model, n):
    """A streamed request of n tokens to a forwarding model: token ids (dasc_hybrid) or text (the text models)."""
    if model == "dasc_hybrid":
        return triton_inputs(grpc, PROMPT, n, streaming=True)
    values = {"text_input": np.array([["The quick brown fox"]], object), "max_tokens": np.array([[n]], np.int32),
              "stream": np.array([[True]], bool)}
    out = []
    for name, arr in values.items():
        x = grpc.InferInput(name, list(arr.shape), {np.dtype(object): "BYTES", np.dtype(np.int32): "INT32",
                                                     np.dtype(bool): "BOOL"}[arr.dtype])
        x.set_data_from_numpy(arr)
        out.append(x)
    return out


@pytest.mark.parametrize("model", ["dasc_hybrid", "ensemble", "tensorrt_llm_bls"])
def test_a_cancel_through_a_forwarding_model_spares_another_client_with_the_same_id(server, model):
    """The forwarding models (dasc_hybrid, the ensemble, tensorrt_llm_bls) pass a client's cancellation to the
    engine as a stop naming the forwarded request's id, which was the client's own: with two clients in flight
    under one id, the first client's cancel stopped the second's request (the newest under that id) after a
    token or two, and the first one's ran on. From a review helper; fails on the old code."""
    import tritonclient.grpc as grpc
    n = 120
    solo = Stream(server.grpc_url)
    try:
        solo.client.async_stream_infer(model, _forwarded_inputs(grpc, model, n), request_id="solo",
                                       enable_empty_final_response=True)
        whole = _rest(solo, model, 0)
    finally:
        solo.close()
    assert whole[1] in (None, "length") and whole[0] > 10, whole
    a, b = Stream(server.grpc_url), Stream(server.grpc_url)
    try:
        a.client.async_stream_infer(model, _forwarded_inputs(grpc, model, n), request_id="twin",
                                    enable_empty_final_response=True)
        a.events.get(timeout=120)
        b.client.async_stream_infer(model, _forwarded_inputs(grpc, model, n), request_id="twin",
                                    enable_empty_final_response=True)
        b.events.get(timeout=120)
        a.client.stop_stream(cancel_requests=True)
        # b's request runs to its end, as the same request alone did (greedy: the same responses)
        assert _rest(b, model, 1) == whole
    finally:
        a.client.close()
        b.close()


def _rest(stream, model, seen):
    """(responses with output in all, the finish_reason given) once the stream's request has ended."""
    responses, reason = seen, None
    while True:
        result, error = stream.events.get(timeout=120)
        assert error is None, error.message()
        out = result.as_numpy("output_ids") if model == "dasc_hybrid" else result.as_numpy("text_output")
        responses += out is not None
        if result.as_numpy("finish_reason") is not None:
            reason = result.as_numpy("finish_reason").reshape(-1)[0].decode()
        if result.get_response().parameters["triton_final_response"].bool_param:
            return responses, reason


def test_an_explicit_stop_still_reaches_a_request_made_through_dasc_hybrid(server):
    """A stop names a request by the client's id, whichever model the request went through (TensorRT-LLM's
    rule): one sent to dasc_hybrid or to tensorrt_llm ends the request a client made through dasc_hybrid."""
    import tritonclient.grpc as grpc
    for via in ("dasc_hybrid", "tensorrt_llm"):
        a, d = Stream(server.grpc_url), Stream(server.grpc_url)
        try:
            a.client.async_stream_infer("dasc_hybrid", triton_inputs(grpc, PROMPT, N, streaming=True),
                                        request_id="job-3", enable_empty_final_response=True)
            got = first_token(a)
            d.client.async_stream_infer(via, triton_inputs(grpc, [0], 0, input_lengths=np.array([[0]], np.int32),
                                                          stop=True), request_id="job-3",
                                        enable_empty_final_response=True)
            _, _, final, _, error = d.next()
            assert error is None and final, error
            tokens, params = drain(a, got)
            assert len(tokens) < N and params.get("finish_reason") in (None, "cancelled"), (via, len(tokens), params)
        finally:
            a.close()
            d.close()
