"""Helpers of the serving tests: build an engine directory with the real dasc-build, start the real
tritonserver on free localhost ports, talk to it with the real tritonclient."""
from __future__ import annotations

import queue
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from hybrid_tiny import VOCAB, build

from trtllm_dasc.serve.tritonserver import start_server

__all__ = ["VOCAB", "build", "build_engine", "serve", "hf_greedy", "triton_inputs", "StreamClient", "Stream"]


def build_engine(ckpt, out, *flags) -> Path:
    """dasc-build through its console entry (a subprocess: what a user runs)."""
    cmd = [sys.executable, "-m", "build_scripts.dasc_build", "--model", str(ckpt), "--output", str(out),
           "--device", "cpu", "--dtype", "float32", *map(str, flags)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return Path(out)


def serve(engine_dir, work_dir, tp: int = 1, **server_options):
    """tp > 1: the engine was built with --tp; one mpirun runs the server and the worker ranks.
    server_options: start_server's (drain_seconds, admin_key, ...)."""
    server = start_server(str(Path(engine_dir) / "model_repo"), str(work_dir), tp=(tp, str(engine_dir)),
                          **server_options)
    try:
        server.wait_ready(300)
    except Exception:
        server.stop()
        raise
    return server


def start_dasc_serve(engine_dir, work_dir, *flags) -> tuple[subprocess.Popen, list[int]]:
    """`dasc serve --model ENGINE_DIR` as a user runs it, on three free ports, read until it prints "ready:"
    (its stdout and stderr are pipes: the caller reads what it says). Returns the process and the HTTP, gRPC
    and metrics ports; the caller ends the process."""
    from trtllm_dasc.serve.tritonserver import free_port
    ports = [free_port() for _ in range(3)]
    cmd = [sys.executable, "-m", "trtllm_dasc.cli", "serve", "--model", engine_dir, "--http-port", ports[0],
           "--grpc-port", ports[1], "--metrics-port", ports[2], "--work-dir", work_dir, *flags]
    proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = ""
    while "ready:" not in line:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise AssertionError(f"dasc serve exited with {proc.returncode} before ready: {proc.stderr.read()}")
    return proc, ports


def hf_greedy(hf, prompt, n) -> list[int]:
    """transformers' own generate, greedy: the independent reference."""
    with torch.no_grad():
        ids = torch.tensor([list(prompt)])
        # an explicit mask: generate would otherwise take prompt tokens equal to pad_token_id for padding
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def triton_inputs(mod, prompt, n, **extra):
    """TensorRT-LLM-style inputs ([1, ...] per tensor, as its stock client sends them)."""
    values = {"input_ids": np.array([prompt], np.int32), "input_lengths": np.array([[len(prompt)]], np.int32),
              "request_output_len": np.array([[n]], np.int32)}
    for k, v in extra.items():
        values[k] = v if isinstance(v, np.ndarray) else np.array([[v]], dtype=type_of(v))
    out = []
    for name, arr in values.items():
        i = mod.InferInput(name, list(arr.shape), _triton_dtype(arr))
        i.set_data_from_numpy(arr)
        out.append(i)
    return out


def type_of(v):
    return {bool: bool, int: np.int32, float: np.float32}[type(v)]


def _triton_dtype(arr) -> str:
    return {np.dtype(bool): "BOOL", np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64",
            np.dtype(np.float32): "FP32", np.dtype(np.uint64): "UINT64",
            np.dtype(object): "BYTES"}[arr.dtype]


class StreamClient:
    """One gRPC stream; collects every request's responses until its final one."""

    def __init__(self, url: str):
        import tritonclient.grpc as grpc
        self.grpc = grpc
        self.client = grpc.InferenceServerClient(url)
        self.events: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.events.put((result, error)))

    def send(self, rid: str, inputs, model: str = "tensorrt_llm") -> None:
        self.client.async_stream_infer(model, inputs, request_id=rid, enable_empty_final_response=True)

    def collect(self, n_requests: int, timeout: float = 120.0) -> dict:
        """{request id: {'tokens': [...], 'cached': int, 'error': str | None, 'responses': int}}"""
        out: dict = {}
        done = 0
        while done < n_requests:
            result, error = self.events.get(timeout=timeout)
            if error is not None:
                rid = error.message().split("]")[0].split(":")[-1].strip() if "request id" in error.message() else None
                rec = out.setdefault(rid or f"error{len(out)}", {"tokens": [], "cached": None, "error": None,
                                                                  "responses": 0})
                rec["error"] = error.message()
                done += 1
                continue
            resp = result.get_response()
            rec = out.setdefault(resp.id, {"tokens": [], "cached": None, "error": None, "responses": 0})
            ids = result.as_numpy("output_ids")
            if ids is not None:
                rec["tokens"].extend(ids.reshape(-1).tolist())
                rec["cached"] = int(result.as_numpy("cached_tokens").reshape(-1)[0])
                rec["responses"] += 1
            if resp.parameters["triton_final_response"].bool_param:
                done += 1
        return out

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


class Stream:
    """One client's gRPC stream; ``next`` gives each response in arrival order as
    (request id, output ids, final, finish_reason or None, error message or None)."""

    def __init__(self, url: str):
        import tritonclient.grpc as grpc
        self.grpc, self.events = grpc, queue.Queue()
        self.client = grpc.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self.events.put((result, error)))

    def send(self, rid: str, inputs, model: str = "tensorrt_llm") -> None:
        self.client.async_stream_infer(model, inputs, request_id=rid, enable_empty_final_response=True)

    def generate(self, rid: str, prompt, n: int) -> None:
        self.send(rid, triton_inputs(self.grpc, prompt, n, streaming=True))

    def generate_text(self, rid: str, text: str, n: int) -> None:
        """Through the ensemble (text in, text out), streamed."""
        values = {"text_input": np.array([[text.encode()]], object), "max_tokens": np.array([[n]], np.int32),
                  "stream": np.array([[True]], bool)}
        inputs = []
        for name, arr in values.items():
            i = self.grpc.InferInput(name, list(arr.shape), _triton_dtype(arr))
            i.set_data_from_numpy(arr)
            inputs.append(i)
        self.send(rid, inputs, "ensemble")

    def next(self, timeout: float = 120.0):
        result, error = self.events.get(timeout=timeout)
        if error is not None:
            return None, [], True, None, error.message()
        resp = result.get_response()
        ids, reason = result.as_numpy("output_ids"), result.as_numpy("finish_reason")
        final = resp.parameters["triton_final_response"].bool_param
        reason = None if reason is None else reason.reshape(-1)[0].decode()
        return resp.id, ids.reshape(-1).tolist() if ids is not None else [], final, reason, None

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()
