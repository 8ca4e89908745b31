"""Streaming requests to the tensorrt_llm Triton model at a fixed concurrency, timed on the client.

Each concurrent client owns a gRPC connection and one stream: with the default shared connection some
streams died with "Socket closed" under 32-way concurrency, and a client's timing must not wait on another
client's socket. A client sends its next request only when its previous one ended (a closed loop, so the
concurrency is exact). TTFT runs from just before the request is handed to the stream to the callback of
the first response carrying tokens; the end-to-end time to the final response (triton_final_response).
"""
from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class Record:
    """One request as the client saw it."""

    prompt_tokens: int
    cached_tokens: int = 0          # C_i, from the response's cached_tokens
    replayed_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    error: str | None = None


def closed_loop(prompts: list, senders: list, progress=None) -> tuple[list[Record], float]:
    """Send ``prompts`` in order through ``senders`` (one per concurrent client; ``send(prompt) -> Record``),
    each client taking the next prompt when its previous request ended. Returns the records in prompt order
    and the wall time from the first send to the last end."""
    records: list[Record | None] = [None] * len(prompts)
    jobs, lock = iter(range(len(prompts))), threading.Lock()

    def client(send):
        while True:
            with lock:
                i = next(jobs, None)
            if i is None:
                return
            try:
                records[i] = send(prompts[i])
            except Exception as e:  # noqa: BLE001 - a failed send is a failed request; the caller decides
                records[i] = Record(len(prompts[i]), error=f"{type(e).__name__}: {e}")
            if progress is not None:
                progress.update()
    threads = [threading.Thread(target=client, args=(s,), daemon=True) for s in senders[:max(1, len(prompts))]]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records, time.perf_counter() - t0


def _tensor(grpc, name: str, arr: np.ndarray):
    dtype = {np.dtype(np.int32): "INT32", np.dtype(bool): "BOOL", np.dtype(object): "BYTES"}[arr.dtype]
    x = grpc.InferInput(name, list(arr.shape), dtype)
    x.set_data_from_numpy(arr)
    return x


class GrpcStream:
    """One client: its own connection and stream, one request at a time."""

    _ids = itertools.count()

    def __init__(self, url: str, model: str = "tensorrt_llm", timeout: float = 600.0):
        import tritonclient.grpc as grpc
        self.grpc, self.model, self.timeout = grpc, model, timeout
        self.client = grpc.InferenceServerClient(url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
        self._rec, self._rid, self._t0, self._stats = None, None, 0.0, None
        self._done = threading.Event()
        self.client.start_stream(callback=self._callback)

    def _callback(self, result=None, error=None) -> None:
        now, rec = time.perf_counter(), self._rec
        if rec is None:
            return
        if error is not None:
            rec.error = error.message()
            self._done.set()
            return
        resp = result.get_response()
        if resp.id != self._rid:
            return               # a straggler of a request given up on
        ids = result.as_numpy("output_ids")
        if ids is not None and ids.size:
            rec.ttft_s = rec.ttft_s if rec.ttft_s is not None else now - self._t0
            rec.output_tokens += int(ids.size)
            rec.cached_tokens = int(result.as_numpy("cached_tokens").reshape(-1)[0])
            rec.replayed_tokens = int(result.as_numpy("replayed_tokens").reshape(-1)[0])
        stats = result.as_numpy("cache_stats")
        if stats is not None:
            self._stats = json.loads(stats.reshape(-1)[0])
        if resp.parameters["triton_final_response"].bool_param:
            rec.e2e_s = now - self._t0
            self._done.set()

    def _request(self, values: dict, prompt_tokens: int) -> Record:
        inputs = [_tensor(self.grpc, k, v) for k, v in values.items()]
        self._rid = f"mh{next(self._ids)}"
        self._rec, self._stats = Record(prompt_tokens), None
        self._done.clear()
        self._t0 = time.perf_counter()
        self.client.async_stream_infer(self.model, inputs, request_id=self._rid, enable_empty_final_response=True)
        if not self._done.wait(self.timeout):
            self._rec.error = f"no final response within {self.timeout} s"
        rec, self._rec = self._rec, None
        return rec

    def send(self, prompt: np.ndarray, output_tokens: int = 1) -> Record:
        values = {"input_ids": prompt.reshape(1, -1).astype(np.int32),
                  "input_lengths": np.array([[prompt.size]], np.int32),
                  "request_output_len": np.array([[output_tokens]], np.int32),
                  "streaming": np.array([[True]], bool)}
        return self._request(values, int(prompt.size))

    def control(self, command: str) -> dict:
        """cache_control 'flush' or 'stats': the engine's counters (after the flush, for 'flush')."""
        one = np.array([[1]], np.int32)
        rec = self._request({"input_ids": one, "input_lengths": one, "request_output_len": one,
                             "cache_control": np.array([[command.encode()]], dtype=object)}, 0)
        if rec.error is not None or self._stats is None:
            raise RuntimeError(f"cache_control {command!r} failed: {rec.error or 'no cache_stats in the answer'}")
        return self._stats

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


class Target:
    """``concurrency`` clients of one server, plus one for cache_control; ``make`` opens one client (a
    GrpcStream here, an HttpStream in http_client.py)."""

    def __init__(self, make, concurrency: int):
        self.streams = [make() for _ in range(concurrency + 1)]

    def run(self, prompts: list, output_tokens: int, progress=None) -> tuple[list[Record], float]:
        senders = [lambda p, s=s: s.send(p, output_tokens) for s in self.streams[1:]]
        return closed_loop(prompts, senders, progress)

    def control(self, command: str) -> dict:
        return self.streams[0].control(command)

    def close(self) -> None:
        for s in self.streams:
            s.close()


class GrpcTarget(Target):
    def __init__(self, url: str, concurrency: int, model: str = "tensorrt_llm", timeout: float = 600.0):
        super().__init__(lambda: GrpcStream(url, model, timeout), concurrency)
