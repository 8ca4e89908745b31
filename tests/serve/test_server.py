"""The real tritonserver serving a dasc-build engine directory, driven by the real tritonclient over gRPC
and HTTP: outputs equal transformers' greedy generate, a repeated prompt is served from the cache,
TensorRT-LLM's conventions hold, bad requests are errors naming their input, metrics tell the truth."""
from __future__ import annotations

import json
import random
import threading
import urllib.request

import numpy as np
import pytest

from serve_helpers import VOCAB, StreamClient, build, build_engine, hf_greedy, serve, triton_inputs


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """A dense (exact) engine of the tiny Kimi-Linear served by tritonserver, and its transformers twin."""
    tmp = tmp_path_factory.mktemp("serve-dense")
    hf = build(tmp / "ckpt", "kda", seed=21)
    engine = build_engine(tmp / "ckpt", tmp / "engine", "--wmax", 0, "--max-batch-size", 4, "--kv-blocks", 400,
                          "--block-size", 4, "--interval", 8, "--max-context", 256)
    server = serve(engine, tmp / "work")
    yield server, hf
    server.stop()


def metrics(server) -> dict:
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("dasc_"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def prompts(seed, n, lo=3, hi=20):
    rng = random.Random(seed)
    base = [rng.randrange(VOCAB) for _ in range(hi)]
    return [base[:rng.randrange(lo, hi)] + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 4))]
            for _ in range(n)]


def test_grpc_streams_equal_transformers_and_hit_the_cache(dense):
    server, hf = dense
    import tritonclient.grpc as grpc
    cases = prompts(0, 8)
    client = StreamClient(server.grpc_url)
    try:
        for i, p in enumerate(cases):
            client.send(f"s{i}", triton_inputs(grpc, p, 4, streaming=True))
        got = client.collect(len(cases))
    finally:
        client.close()
    for i, p in enumerate(cases):
        rec = got[f"s{i}"]
        assert rec["error"] is None and rec["tokens"] == hf_greedy(hf, p, 4)
        assert rec["responses"] == 4                     # streaming: one token per response
    # the same prompt again: served from a checkpoint
    client = StreamClient(server.grpc_url)
    try:
        client.send("again", triton_inputs(grpc, cases[0], 2))
        rec = client.collect(1)["again"]
    finally:
        client.close()
    assert rec["cached"] > 0
    # non-streaming output holds the prompt, then the generated tokens
    assert rec["tokens"] == list(cases[0]) + hf_greedy(hf, cases[0], 2) and rec["responses"] == 1


def test_http_generate_stream_concurrently(dense):
    server, hf = dense
    cases = prompts(1, 6)
    results = {}

    def one(i, p):
        body = json.dumps({"input_ids": p, "input_lengths": len(p), "request_output_len": 3, "streaming": True})
        req = urllib.request.Request(f"http://{server.http_url}/v2/models/tensorrt_llm/generate_stream",
                                     data=body.encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            events = [json.loads(line[5:]) for line in r.read().decode().splitlines() if line.startswith("data:")]
        results[i] = [e["output_ids"] for e in events]
    threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(cases)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, p in enumerate(cases):
        assert results[i] == hf_greedy(hf, p, 3)


def test_exclude_input_perf_metrics_and_end_id(dense):
    server, hf = dense
    import tritonclient.grpc as grpc
    p = prompts(2, 1)[0]
    ref = hf_greedy(hf, p, 5)
    inputs = triton_inputs(grpc, p, 5, exclude_input_in_output=True, return_perf_metrics=True, end_id=ref[2])
    result, error = first_event(server, "x", inputs, timeout=120)
    assert error is None
    # stopped at end_id, which is not output (TensorRT-LLM's rule), no prompt
    assert result.as_numpy("output_ids").reshape(-1).tolist() == ref[:2]
    assert result.as_numpy("sequence_length").reshape(-1).tolist() == [2]
    times = [int(result.as_numpy(k).reshape(-1)[0]) for k in
             ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")]
    assert 0 < times[0] <= times[1] <= times[2] <= times[3]
    assert int(result.as_numpy("kv_cache_alloc_total_blocks").reshape(-1)[0]) > 0


BAD = [
    ("missing-input-ids", dict(drop="input_ids"), "input_ids"),
    ("lengths-disagree", dict(input_lengths=np.array([[99]], np.int32)), "input_lengths"),
    ("zero-output", dict(request_output_len=np.array([[0]], np.int32)), "request_output_len"),
    ("negative-output", dict(request_output_len=np.array([[-3]], np.int32)), "request_output_len"),
    # a prompt id outside the vocabulary is served (zeros, as TensorRT-LLM embeds it: tests/engine/
    # test_out_of_vocab.py); an end id outside it is refused
    ("end-id-outside-vocab", dict(end_id=np.array([[VOCAB + 5]], np.int32)), "end_id"),
    ("beam-4", dict(beam_width=np.array([[4]], np.int32)), "beam_width"),
    ("lora", dict(lora_task_id=np.array([[3]], np.uint64)), "lora_task_id"),
    ("penalty", dict(repetition_penalty=np.array([[-1.3]], np.float32)), "repetition_penalty"),
    ("oversize", dict(input_ids=np.ones((1, 300), np.int32), input_lengths=np.array([[300]], np.int32)), "input_ids"),
    ("top-p-2", dict(runtime_top_p=np.array([[2.0]], np.float32)), "runtime_top_p"),
]


@pytest.mark.parametrize("change,needle", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_requests_are_errors_naming_the_input(dense, change, needle):
    server, _ = dense
    import tritonclient.grpc as grpc
    values = {"input_ids": np.array([[1, 2, 3]], np.int32), "input_lengths": np.array([[3]], np.int32),
              "request_output_len": np.array([[2]], np.int32)}
    values.update({k: v for k, v in change.items() if k != "drop"})
    values.pop(change.get("drop"), None)
    inputs = []
    for name, arr in values.items():
        i = grpc.InferInput(name, list(arr.shape), {np.int32: "INT32", np.uint64: "UINT64",
                                                      np.float32: "FP32"}[arr.dtype.type])
        i.set_data_from_numpy(arr)
        inputs.append(i)
    result, error = first_event(server, "bad", inputs)
    assert error is not None and needle in error.message(), (error, result)
    assert server.proc.poll() is None


def test_cache_control_flush_and_stats(dense):
    server, _ = dense
    import tritonclient.grpc as grpc
    control = np.array([["flush"]], dtype=object)
    result, error = first_event(server, "flush", triton_inputs(grpc, [1], 1, cache_control=control))
    assert error is None
    stats = json.loads(result.as_numpy("cache_stats").reshape(-1)[0])
    assert stats["checkpoints_cached"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks"]


def test_a_request_with_two_sequences_answers_both_with_batch_index(dense):
    server, hf = dense
    import tritonclient.grpc as grpc
    a, b = [7, 8, 9, 10], [20, 21, 22]
    ids = np.array([a, b + [0]], np.int32)                      # right-padded; input_lengths trims
    values = {"input_ids": ids, "input_lengths": np.array([[4], [3]], np.int32),
              "request_output_len": np.array([[2], [3]], np.int32)}
    inputs = []
    for name, arr in values.items():
        x = grpc.InferInput(name, list(arr.shape), "INT32")
        x.set_data_from_numpy(arr)
        inputs.append(x)
    client = StreamClient(server.grpc_url)
    got, finals = {}, 0
    try:
        client.send("pair", inputs)
        while not finals:
            result, error = client.events.get(timeout=120)
            assert error is None, error
            if result.as_numpy("output_ids") is not None:
                got[int(result.as_numpy("batch_index").reshape(-1)[0])] = result.as_numpy("output_ids").reshape(-1).tolist()
            finals += result.get_response().parameters["triton_final_response"].bool_param
    finally:
        client.close()
    assert got == {0: a + hf_greedy(hf, a, 2), 1: b + hf_greedy(hf, b, 3)}


def test_log_probs_generation_and_context_logits_over_grpc_and_http(dense):
    """The stock client's outputs: output_log_probs / cum_log_probs per streamed token equal transformers'
    log-softmax, generation_logits its logits, context_logits on the final response; over HTTP generate the
    same inputs arrive as JSON keys (Triton maps a key to the input of that name)."""
    import torch
    import tritonclient.grpc as grpc
    server, hf = dense
    p = prompts(5, 1)[0]
    ref = hf_greedy(hf, p, 3)
    with torch.no_grad():
        logits = hf(torch.tensor([p + ref])).logits[0].float()
    lps = torch.log_softmax(logits[len(p) - 1:-1], -1)[torch.arange(3), torch.tensor(ref)]
    client = StreamClient(server.grpc_url)
    results = []
    try:
        client.send("lp", triton_inputs(grpc, p, 3, streaming=True, return_log_probs=True,
                                        return_generation_logits=True, return_context_logits=True))
        while True:
            result, error = client.events.get(timeout=120)
            assert error is None, error
            if result.as_numpy("output_ids") is not None and result.as_numpy("output_ids").size:
                results.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.close()
    tokens = [int(r.as_numpy("output_ids").reshape(-1)[0]) for r in results]
    assert tokens == ref
    got = np.concatenate([r.as_numpy("output_log_probs").reshape(-1) for r in results])
    np.testing.assert_allclose(got, lps.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose([float(r.as_numpy("cum_log_probs").reshape(-1)[0]) for r in results],
                               np.cumsum(lps.numpy()), rtol=1e-4, atol=1e-4)
    gen = np.concatenate([r.as_numpy("generation_logits")[0, 0] for r in results])
    np.testing.assert_allclose(gen, logits[len(p) - 1:-1].numpy(), rtol=1e-4, atol=1e-4)
    final = results[-1].as_numpy("context_logits")
    assert final is not None and final.shape[-2:] == (len(p), VOCAB)
    # HTTP generate: "return_log_probs": true is honoured, not dropped
    body = json.dumps({"input_ids": p, "input_lengths": len(p), "request_output_len": 3, "return_log_probs": True})
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/dasc_hybrid/generate", data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        answer = json.loads(r.read())
    np.testing.assert_allclose(np.ravel(answer["output_log_probs"]), lps.numpy(), rtol=1e-4, atol=1e-4)


def test_a_batch_with_one_bad_sequence_is_refused_before_any_of_it_runs(dense):
    """A request of two sequences whose second cannot run (its prompt past the max context) is refused in one
    line, and none of it reaches the engine: its first sequence was queued (and could run a step) before the
    second was checked, then aborted, so one refused request also counted as a cancellation. From a review
    helper; fails on the old code (cancelled went up by one)."""
    server, _ = dense
    import time
    import tritonclient.grpc as grpc
    values = {"input_ids": np.ones((2, 300), np.int32), "input_lengths": np.array([[4], [300]], np.int32),
              "request_output_len": np.array([[100], [2]], np.int32), "streaming": np.array([[True], [True]], bool)}
    inputs = []
    for name, arr in values.items():
        x = grpc.InferInput(name, list(arr.shape), "BOOL" if arr.dtype == bool else "INT32")
        x.set_data_from_numpy(arr)
        inputs.append(x)
    before = cache_stats(server)
    result, err = first_event(server, "half-bad", inputs)
    assert err is not None and "max context" in err.message(), (err, result)
    assert "sequence 1 of the batch of 2" in err.message(), err.message()
    # an abort of a queued first sequence would end it within a step or two
    time.sleep(1.5)
    after = cache_stats(server)
    assert after["rejected"] - before["rejected"] == 1
    assert after["ended"]["cancelled"] == before["ended"]["cancelled"], \
        "the refused request's first sequence was queued and then aborted"
    assert after["prompt_tokens"] == before["prompt_tokens"] and after["inflight"] == 0


def cache_stats(server) -> dict:
    """The model's stats (cache_control 'stats': the engine's and the serving layer's counters, read now)."""
    import tritonclient.grpc as grpc
    control = np.array([["stats"]], dtype=object)
    result, error = first_event(server, "stats", triton_inputs(grpc, [1], 1, cache_control=control))
    assert error is None, error
    return json.loads(result.as_numpy("cache_stats").reshape(-1)[0])


def first_event(server, request_id, inputs, timeout=60):
    """Send one request over a gRPC stream and return its first event (result, error)."""
    client = StreamClient(server.grpc_url)
    try:
        client.send(request_id, inputs)
        return client.events.get(timeout=timeout)
    finally:
        client.close()
