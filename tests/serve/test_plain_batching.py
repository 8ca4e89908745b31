"""--no-decoupled (plain infer, one response per request) on the real tritonserver: requests of several
clients share the engine's batch (a short request is not queued behind a long one), and TensorRT-LLM's
stop signal by request id ends a running plain request early. One engine loads (tensorrt_llm_engine);
tensorrt_llm and dasc_hybrid forward to it. The engine is the embedded default model's, so the text models
are served too: the ensemble and tensorrt_llm_bls, both plain as TensorRT-LLM's are in this mode (plain gRPC
infer, HTTP generate) give transformers' greedy text with the model's own tokenizer."""
from __future__ import annotations

import json
import queue
import re
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from serve_helpers import _triton_dtype, build_engine, serve, triton_inputs

grpc = pytest.importorskip("tritonclient.grpc")

ASSET = Path(__file__).resolve().parents[2] / "trtllm_dasc" / "assets" / "tiny-kimi-linear"
PROMPT = [11, 42, 7, 93, 15, 3, 64, 28, 50]
TEXT = "Question: which planet is closest to the sun? Answer:"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plain")
    engine = build_engine(ASSET, tmp / "engine", "--wmax", 0, "--max-batch-size", 4, "--kv-blocks", 600,
                          "--block-size", 4, "--max-context", 512, "--no-decoupled")
    s = serve(engine, tmp / "w")
    yield s
    s.stop()


def plain(server, n, model="tensorrt_llm", request_id="", **extra):
    """(seconds, output_ids) of one plain infer on its own connection."""
    client = grpc.InferenceServerClient(server.grpc_url)
    t0 = time.monotonic()
    result = client.infer(model, triton_inputs(grpc, PROMPT, n, **extra), request_id=request_id)
    return time.monotonic() - t0, result.as_numpy("output_ids").reshape(-1).tolist()


def run_in_thread(fn, *args, **kwargs):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", fn(*args, **kwargs)), daemon=True)
    t.start()
    return t, box


def test_one_engine_and_plain_models(server):
    client = grpc.InferenceServerClient(server.grpc_url)
    names = {m.name for m in client.get_model_repository_index().models}
    assert {"tensorrt_llm_engine", "tensorrt_llm", "dasc_hybrid"} <= names
    for name in ("tensorrt_llm", "dasc_hybrid"):
        config = client.get_model_config(name, as_json=True)["config"]
        assert not config.get("model_transaction_policy", {}).get("decoupled", False)
        assert config["parameters"]["alias_of"]["string_value"] == "tensorrt_llm_engine"


def test_plain_output_holds_prompt_and_tokens(server):
    _, ids = plain(server, 5)
    assert ids[:len(PROMPT)] == PROMPT and len(ids) == len(PROMPT) + 5
    _, ids = plain(server, 5, model="dasc_hybrid", exclude_input_in_output=True)
    assert len(ids) == 5


def test_a_plain_batch_is_refused_not_cut_to_one_sequence(server):
    """The plain forwarder kept only the engine model's last response: a batch of two came back as entry 1
    alone, no error (a review helper). TensorRT-LLM answers every entry; a plain response holds one, so ours
    refuses in one line, as docs/design.md says."""
    client = grpc.InferenceServerClient(server.grpc_url)
    values = {"input_ids": np.array([[1, 2, 3], [4, 5, 0]], np.int32),
              "input_lengths": np.array([[3], [2]], np.int32), "request_output_len": np.array([[2], [2]], np.int32)}
    inputs = []
    for name, arr in values.items():
        inputs.append(grpc.InferInput(name, list(arr.shape), _triton_dtype(arr)))
        inputs[-1].set_data_from_numpy(arr)
    with pytest.raises(Exception, match="a batch of 2 sequences needs the decoupled model"):
        client.infer("tensorrt_llm", inputs)


def test_an_output_past_the_context_is_cut_to_fit_as_tensorrt_llm_does(server):
    """A prompt that fits with request_output_len past the max context (512): TensorRT-LLM's
    LlmRequest::validate lowers the output length with a warning rather than refusing; so does ours."""
    prompt = [11, 42, 7] * 168                                   # 504 tokens: 8 left of the context
    client = grpc.InferenceServerClient(server.grpc_url)
    result = client.infer("tensorrt_llm", triton_inputs(grpc, prompt, 100))
    ids = result.as_numpy("output_ids").reshape(-1).tolist()
    assert ids[:len(prompt)] == prompt and len(ids) == 512
    with pytest.raises(Exception, match="exceeds the max context"):           # no room at all: still refused
        client.infer("tensorrt_llm", triton_inputs(grpc, [11] * 512, 4))


def test_short_plain_request_is_not_queued_behind_a_long_one(server):
    long_t, long_box = run_in_thread(plain, server, 400)
    # the long request is generating when the short one arrives
    time.sleep(0.5)
    short_s, short_ids = plain(server, 4)
    long_t.join(300)
    long_s, long_ids = long_box["r"]
    assert len(long_ids) == len(PROMPT) + 400 and len(short_ids) == len(PROMPT) + 4
    # one at a time, the short request would wait for the long one's whole run
    assert short_s < long_s / 3, (short_s, long_s)


def test_stop_by_id_ends_a_running_plain_request(server):
    long_t, long_box = run_in_thread(plain, server, 400, request_id="plain-stop-1")
    time.sleep(1.0)
    # TensorRT-LLM's stop signal: a request with stop true naming the running request's id
    grpc.InferenceServerClient(server.grpc_url).infer(
        "tensorrt_llm", triton_inputs(grpc, PROMPT, 1, stop=True), request_id="plain-stop-1")
    long_t.join(300)
    _, ids = long_box["r"]
    assert len(PROMPT) < len(ids) < len(PROMPT) + 400, len(ids)


def metric(server, name: str, labels: str = "") -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_cancelled_plain_request_ends_in_the_engine(server):
    # Triton's python backend tells a non-decoupled model through request.is_cancelled(); the forwarder
    # passes it on as a stop for the engine request's id
    cancelled = ("dasc_requests_ended_total", '{reason="cancelled"}')
    before = metric(server, *cancelled)
    client = grpc.InferenceServerClient(server.grpc_url)
    done = []
    ctx = client.async_infer("tensorrt_llm", triton_inputs(grpc, PROMPT, 400),
                             callback=lambda result, error: done.append(error))
    time.sleep(1.0)
    assert metric(server, "dasc_running_requests") == 1 and not done
    ctx.cancel()
    t0 = time.time()
    while time.time() - t0 < 3:
        if metric(server, *cancelled) >= before + 1 and metric(server, "dasc_running_requests") == 0:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"not cancelled in the engine: cancelled {metric(server, *cancelled)} "
                             f"(before {before}), running {metric(server, 'dasc_running_requests')}")


def test_one_engine_in_the_metrics(server):
    # the forwarders load no engine: one engine's memory series, one engine alive
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    alive = re.findall(r"^dasc_engine_alive(?:\{[^}]*\})? (\S+)$", text, re.M)
    assert alive == ["1"], alive


@pytest.fixture(scope="module")
def greedy_text():
    """transformers' greedy continuation of TEXT (the model's own tokenizer): the independent reference."""
    from transformers import AutoTokenizer, KimiLinearForCausalLM
    tok = AutoTokenizer.from_pretrained(str(ASSET))
    model = KimiLinearForCausalLM.from_pretrained(str(ASSET), torch_dtype=torch.float32).eval()
    ids = tok.encode(TEXT)
    out = []
    with torch.no_grad():
        for _ in range(6):
            out.append(int(torch.argmax(model(torch.tensor([ids + out])).logits[0, -1])))
    return tok.decode(out, skip_special_tokens=True)


def text_inputs(**values):
    out = []
    for name, value in values.items():
        dtype = object if isinstance(value, str) else bool if isinstance(value, bool) else np.int32
        arr = np.array([[value.encode() if isinstance(value, str) else value]], dtype)
        i = grpc.InferInput(name, list(arr.shape), _triton_dtype(arr))
        i.set_data_from_numpy(arr)
        out.append(i)
    return out


def test_the_ensemble_is_plain_on_a_plain_engine(server, greedy_text):
    """As TensorRT-LLM's ensemble over a plain tensorrt_llm (decoupled_mode false): a plain infer answers with the
    text, which its tools do (end_to_end_test.py: client.infer("ensemble", ...)); it was decoupled here, and
    Triton refused every plain infer ("doesn't support models with decoupled transaction policy"). Streaming
    wants the decoupled build: a stream request is refused. From a review helper; fails on the old build."""
    client = grpc.InferenceServerClient(server.grpc_url)
    config = client.get_model_config("ensemble", as_json=True)["config"]
    assert not config.get("model_transaction_policy", {}).get("decoupled", False)
    result = client.infer("ensemble", text_inputs(text_input=TEXT, max_tokens=6))
    assert result.as_numpy("text_output").reshape(-1)[0].decode() == TEXT + greedy_text
    # Triton's HTTP generate endpoint: one response
    body = json.dumps({"text_input": TEXT, "max_tokens": 6, "exclude_input_in_output": True}).encode()
    url = f"http://{server.http_url}/v2/models/ensemble/generate"
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=120) as r:
        assert json.loads(r.read())["text_output"] == greedy_text
    # a streamed request: one error naming why
    events = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    client.async_stream_infer("ensemble", text_inputs(text_input=TEXT, max_tokens=6, stream=True), request_id="e")
    try:
        result, error = events.get(timeout=120)
    finally:
        client.stop_stream()
        client.close()
    assert error is not None and "decoupled" in error.message().lower(), (result, error)


def test_plain_bls_answers_a_plain_infer(server, greedy_text):
    # tensorrt_llm_bls is non-decoupled on this engine (TensorRT-LLM's decoupled_mode false): a plain infer
    client = grpc.InferenceServerClient(server.grpc_url)
    config = client.get_model_config("tensorrt_llm_bls", as_json=True)["config"]
    assert not config.get("model_transaction_policy", {}).get("decoupled", False)
    result = client.infer("tensorrt_llm_bls", text_inputs(text_input=TEXT, max_tokens=6))
    # not streamed: the prompt and the new text (tensorrt_llm's output_ids hold the prompt, as TensorRT-LLM's)
    assert result.as_numpy("text_output").reshape(-1)[0].decode() == TEXT + greedy_text
