"""TensorRT-LLM's own example client (inflight_batcher_llm_client.py), unchanged, against tensorrt_llm (its
default model name) and dasc_hybrid (our earlier name, still served); and its core-model load tool
(tools/inflight_batcher_llm/benchmark_core_model.py, from the same copy's tools/) with its random-token workload.

Its code is never committed here: the test runs it from a scratch copy of triton-inference-server/
tensorrtllm_backend (inflight_batcher_llm/client/, commit c2e65b8, the last with the client) named by
DASC_TRTLLM_CLIENTS, or found at /tmp/trtllm_backend/inflight_batcher_llm/client; without one it skips.
The client checks our output itself (--check-output against a CSV of prompt + transformers' greedy tokens).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from serve_helpers import VOCAB, build, build_engine, hf_greedy, serve

CLIENTS = Path(os.environ.get("DASC_TRTLLM_CLIENTS", "/tmp/trtllm_backend/inflight_batcher_llm/client"))
CLIENT = CLIENTS / "inflight_batcher_llm_client.py"
pytestmark = pytest.mark.skipif(not CLIENT.is_file(), reason=(
    f"TensorRT-LLM's example clients are not here ({CLIENT}): put a scratch copy of tensorrtllm_backend's "
    "inflight_batcher_llm/client there or point DASC_TRTLLM_CLIENTS at it"))

PROMPT = [11, 42, 7, 93, 15, 3, 64, 28, 50]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stock")
    hf = build(tmp / "ckpt", "kda", seed=33)
    common = ("--wmax", 0, "--max-batch-size", 4, "--kv-blocks", 600, "--block-size", 4, "--max-context", 512)
    decoupled = serve(build_engine(tmp / "ckpt", tmp / "engine", *common), tmp / "w1")
    plain = serve(build_engine(tmp / "ckpt", tmp / "engine-plain", *common, "--no-decoupled"), tmp / "w2")
    yield {"decoupled": decoupled, "plain": plain}, hf, tmp
    decoupled.stop()
    plain.stop()


def run_client(server, tmp, *flags, expect=None, model="dasc_hybrid"):
    """``model`` None: the client's own default (--model-name omitted: tensorrt_llm)."""
    (tmp / "in.csv").write_text(",".join(map(str, PROMPT)) + "\n")
    args = [sys.executable, str(CLIENT), "-u", server.grpc_url, *(["--model-name", model] if model else []),
            "--input-tokens-csv", str(tmp / "in.csv"), *map(str, flags)]
    if expect is not None:
        (tmp / "expect.csv").write_text(",".join(map(str, expect)) + "\n")
        args += ["--output-tokens-csv", str(tmp / "expect.csv"), "--check-output"]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=str(CLIENTS))


@pytest.mark.parametrize("model", [None, "dasc_hybrid"], ids=["default-name", "dasc_hybrid"])
@pytest.mark.parametrize("mode", ["streaming", "plain"])
def test_stock_client_checks_our_greedy_output(servers, mode, model):
    s, hf, tmp = servers
    expect = PROMPT + hf_greedy(hf, PROMPT, 6)
    flags = ("--request-output-len", 6) + (("--streaming",) if mode == "streaming" else ())
    proc = run_client(s["decoupled" if mode == "streaming" else "plain"], tmp, *flags, expect=expect, model=model)
    assert proc.returncode == 0 and "PASS!" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_stock_client_perf_metrics_and_exclude_input(servers):
    s, hf, tmp = servers
    proc = run_client(s["decoupled"], tmp, "--request-output-len", 4, "--streaming", "--exclude-input-in-output",
                      "--return-perf-metrics", expect=hf_greedy(hf, PROMPT, 4))
    assert proc.returncode == 0 and "PASS!" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "first_token_time_ns" in proc.stdout


@pytest.mark.parametrize("model", [None, "dasc_hybrid"], ids=["default-name", "dasc_hybrid"])
@pytest.mark.parametrize("how", ["request-cancel", "stop-signal"])
def test_stock_client_stops_a_long_request(servers, how, model):
    s, _, tmp = servers
    flags = ["--request-output-len", 400, "--streaming", "--stop-after-ms", 300]
    if how == "request-cancel":
        flags.append("--stop-via-request-cancel")
    else:
        # a stop names its request by id (an empty id, the client's default, matches no request): as
        # TensorRT-LLM's own CI runs this client, with --request-id
        flags += ["--request-id", "1"]
    proc = run_client(s["decoupled"], tmp, *flags, model=model)
    # the client itself asserts it got fewer than 400 tokens
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_stock_client_stop_without_an_id_is_refused(servers):
    s, _, tmp = servers
    # TensorRT-LLM answers the same: "A request id must be provided for request cancellation"; the request
    # itself runs to its end (this client then fails its own fewer-tokens check or reports the error)
    proc = run_client(s["decoupled"], tmp, "--request-output-len", 40, "--streaming", "--stop-after-ms", 100)
    assert proc.returncode != 0 and "request id" in proc.stdout + proc.stderr, proc.stdout[-3000:]


# upstream's core-model load tool, from the same scratch copy (tools/inflight_batcher_llm); its report imports
# pandas and tabulate, which this environment does not install: two small stand-ins cover what the report uses
BENCH = CLIENTS.parent.parent / "tools" / "inflight_batcher_llm" / "benchmark_core_model.py"
PANDAS = '''
import numpy as np
class _Column:
    def __init__(self, values): self.values = list(values)
    def sum(self): return np.sum(self.values)
    def mean(self): return np.mean(self.values)
    def median(self): return np.median(self.values)
    def std(self): return np.std(self.values)
    def tolist(self): return list(self.values)
class DataFrame:
    def __init__(self, data): self.data = data
    def __getitem__(self, name): return _Column(self.data[name])
'''
TABULATE = "def tabulate(rows, headers=(), **kw):\n    return '\\n'.join(f'{a} {b}' for a, b in rows)\n"


@pytest.mark.skipif(not BENCH.is_file(), reason=f"TensorRT-LLM's tools are not here ({BENCH})")
@pytest.mark.parametrize("mode", ["decoupled", "plain"])
def test_stock_core_model_benchmark_runs_its_random_token_workload(servers, tmp_path, mode):
    """tools/inflight_batcher_llm/benchmark_core_model.py token-norm-dist sends random ids in [0, 2^31): every
    request was refused ("outside the vocabulary") and the tool raised. TensorRT-LLM embeds such ids as zeros;
    so do we (dasc-build --out-of-vocab-inputs zero, the default), and the tool completes. From a review helper."""
    s, _, _ = servers
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "pandas.py").write_text(PANDAS)
    (stubs / "tabulate.py").write_text(TABULATE)
    server = s[mode]
    transport = ["-u", server.grpc_url, "-i", "grpc", "--decoupled"] if mode == "decoupled" else \
        ["-u", server.http_url, "-i", "http"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stubs), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(BENCH), *transport, "--max-input-len", "100", "--num-requests", "10",
                           "token-norm-dist", "--input-mean", "20", "--input-stdev", "2", "--output-mean", "6",
                           "--output-stdev", "1"], capture_output=True, text=True, timeout=300, cwd=str(BENCH.parent),
                          env=env)
    # it raises on the first request error; the decoupled path reports its stats, the plain one its latency
    assert proc.returncode == 0 and "Start benchmarking on 10 prompts" in proc.stdout, \
        proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ("Total requests 10" if mode == "decoupled" else "Total Latency") in proc.stdout, proc.stdout[-2000:]
