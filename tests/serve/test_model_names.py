"""TensorRT-LLM's model names on a real tritonserver: `tensorrt_llm` serves the engine, `dasc_hybrid` (its
earlier name) still answers through a BLS forwarder, and `tensorrt_llm_bls` streams text
(preprocessing -> tensorrt_llm -> postprocessing). Every response says how a cached prefix is restored
(`dasc_policy`; the default W_max 16 is approximate). The reference is transformers' greedy generation
of the embedded default model with its own tokenizer."""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from serve_helpers import StreamClient, _triton_dtype, build_engine, serve, triton_inputs

ASSET = Path(__file__).resolve().parents[2] / "trtllm_dasc" / "assets" / "tiny-kimi-linear"
PROMPT = "Question: which planet is closest to the sun? Answer:"
# tensorrt_llm's own prompt: no prefix shared with PROMPT (a cached prefix may change greedy tokens under
# the lossy default policy, which is what dasc_policy says)
IDS_PROMPT = "Lorem ipsum dolor sit amet"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("names")
    # the default W_max (16, what dasc_policy reports); --prefill-chunk 64 --interval 32: warm-up's prompts
    # are two chunks and two intervals long (engine/warmup.py), ~960 and ~520 tokens with the defaults, most
    # of the start on a 2-core machine (conftest.py)
    engine = build_engine(ASSET, tmp / "engine", "--max-batch-size", 4, "--kv-blocks", 512, "--max-context", 1024,
                          "--prefill-chunk", 64, "--interval", 32)
    s = serve(engine, tmp / "work")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoTokenizer, KimiLinearForCausalLM
    tok = AutoTokenizer.from_pretrained(str(ASSET))
    model = KimiLinearForCausalLM.from_pretrained(str(ASSET), torch_dtype=torch.float32).eval()

    def greedy(ids):
        out = []
        with torch.no_grad():
            for _ in range(6):
                out.append(int(torch.argmax(model(torch.tensor([ids + out])).logits[0, -1])))
        return out
    ids = tok.encode(IDS_PROMPT)[1:]
    return ids, greedy(ids), tok.decode(greedy(tok.encode(PROMPT)), skip_special_tokens=True)


def _stream_tokens(server, model, prompt, n):
    import tritonclient.grpc as grpc
    c = StreamClient(server.grpc_url)
    try:
        c.send("r1", triton_inputs(grpc, prompt, n, streaming=True), model=model)
        return c.collect(1)["r1"]
    finally:
        c.close()


def test_tensorrt_llm_and_its_earlier_name_serve_the_same_engine(server, reference):
    ids, want, _ = reference
    # a fresh prompt each (a cached prefix may change greedy tokens under the lossy default policy)
    assert _stream_tokens(server, "tensorrt_llm", ids, 6)["tokens"] == want
    assert _stream_tokens(server, "dasc_hybrid", [7] + list(ids), 6)["error"] is None
    config = json.loads(urllib.request.urlopen(f"http://{server.http_url}/v2/models/dasc_hybrid/config",
                                               timeout=30).read())
    assert config["parameters"]["alias_of"]["string_value"] == "tensorrt_llm"
    # one engine: only tensorrt_llm exports its gauges
    metrics = urllib.request.urlopen(server.metrics_url, timeout=30).read().decode()
    alive = [line for line in metrics.splitlines() if line.startswith("dasc_engine_alive")]
    assert len(alive) == 1, alive


def test_dasc_policy_in_config_and_on_every_response(server):
    import tritonclient.grpc as grpc
    config = json.loads(urllib.request.urlopen(f"http://{server.http_url}/v2/models/tensorrt_llm/config",
                                               timeout=30).read())
    policy = config["parameters"]["dasc_policy"]["string_value"]
    assert policy.startswith("dasc-nr W_max=16: cached prefixes are approximate"), policy
    client = grpc.InferenceServerClient(server.grpc_url)
    seen = []
    client.start_stream(callback=lambda result, error: seen.append((result, error)))
    client.async_stream_infer("tensorrt_llm", triton_inputs(grpc, [5, 6, 7, 8], 3, streaming=True), request_id="p")
    deadline = time.time() + 120
    while len(seen) < 3 and time.time() < deadline:
        time.sleep(0.05)
    client.stop_stream()
    assert len(seen) == 3 and all(e is None for _, e in seen), seen
    assert [r.as_numpy("dasc_policy").reshape(-1)[0].decode() for r, _ in seen] == [policy] * 3


def test_bls_streams_text(server, reference):
    import tritonclient.grpc as grpc
    _, _, want = reference
    values = {"text_input": np.array([[PROMPT.encode()]], object), "max_tokens": np.array([[6]], np.int32),
              "stream": np.array([[True]], bool), "temperature": np.array([[1.0]], np.float32),
              "top_k": np.array([[1]], np.int32), "return_log_probs": np.array([[False]], bool)}
    inputs = []
    for name, arr in values.items():
        i = grpc.InferInput(name, list(arr.shape), _triton_dtype(arr))
        i.set_data_from_numpy(arr)
        inputs.append(i)
    client = grpc.InferenceServerClient(server.grpc_url)
    seen = []
    client.start_stream(callback=lambda result, error: seen.append((result, error)))
    client.async_stream_infer("tensorrt_llm_bls", inputs, request_id="b", enable_empty_final_response=True)
    deadline = time.time() + 120
    while not (seen and (seen[-1][1] is not None or seen[-1][0].get_response().parameters[
            "triton_final_response"].bool_param)) and time.time() < deadline:
        time.sleep(0.05)
    client.stop_stream()
    assert all(e is None for _, e in seen), [e for _, e in seen]
    texts = [r.as_numpy("text_output") for r, _ in seen if r.as_numpy("text_output") is not None]
    assert len(texts) == 6
    assert "".join(t.reshape(-1)[0].decode() for t in texts) == want
    assert all(r.as_numpy("cached_tokens") is not None for r, _ in seen[:6])


def test_bls_refuses_what_it_cannot_serve_in_one_line(server):
    # beam search stays unsupported (embedding bias words are served since the text models map them)
    body = json.dumps({"text_input": "hi", "max_tokens": 2, "beam_width": 2}).encode()
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/tensorrt_llm_bls/generate", data=body)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert "beam_width" in e.value.read().decode()
