"""--no-decoupled (plain infer, one response per request) on the real tritonserver: requests of several
clients share the engine's batch (a short request is not queued behind a long one), and TensorRT-LLM's
stop signal by request id ends a running plain request early. One engine loads (tensorrt_llm_engine);
tensorrt_llm and dasc_hybrid forward to it."""
from __future__ import annotations

import re
import threading
import time
import urllib.request

import pytest

from serve_helpers import build, build_engine, serve, triton_inputs

grpc = pytest.importorskip("tritonclient.grpc")

PROMPT = [11, 42, 7, 93, 15, 3, 64, 28, 50]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plain")
    build(tmp / "ckpt", "kda", seed=5)
    engine = build_engine(tmp / "ckpt", tmp / "engine", "--wmax", 0, "--max-batch-size", 4, "--kv-blocks", 600,
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
