"""Streaming requests over HTTP: Triton's generate extension, POST /v2/models/<model>/generate_stream, read as
Server-Sent Events. The paper's clock (App. C.2): TTFT runs from the transmission of the HTTP request to the
first SSE chunk that carries a token.

A plain http.client connection per concurrent client (keep-alive, one request at a time, a closed loop as
the gRPC clients): no dependency beyond the standard library, and nothing between the socket and the clock.
The request body is encoded before the clock starts; the clock starts just before the request is written
to the socket and stops when the line holding the first token event has been read.
"""
from __future__ import annotations

import http.client
import json
import time

import numpy as np

from clients.client import Record, Target


def _scalar_list(value) -> list:
    """A generate-extension output as a flat list (one element comes back as a bare scalar)."""
    if value is None:
        return []
    if isinstance(value, list):
        return [x for v in value for x in _scalar_list(v)]
    return [value]


class HttpStream:
    """One client: its own HTTP/1.1 connection to the server, one request at a time."""

    def __init__(self, url: str, model: str = "tensorrt_llm", timeout: float = 600.0):
        host, _, port = url.rpartition(":")
        self.host, self.port, self.timeout = host or "127.0.0.1", int(port), timeout
        self.path = f"/v2/models/{model}/generate_stream"
        self.conn = None

    def _connect(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self.conn.connect()
        return self.conn

    def _events(self, body: dict, rec: Record):
        """POST ``body``; yields (seconds since transmission, event JSON) per SSE data line."""
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        conn = self._connect()
        try:
            t0 = time.perf_counter()
            conn.request("POST", self.path, body=data, headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                text = resp.read().decode(errors="replace")
                try:
                    text = json.loads(text).get("error", text)
                except ValueError:
                    pass
                rec.error = f"HTTP {resp.status}: {text}"
                return
            while True:
                line = resp.readline()
                now = time.perf_counter()
                if not line:
                    break
                if line.startswith(b"data:"):
                    yield now - t0, json.loads(line[5:])
            rec.e2e_s = time.perf_counter() - t0
        except (OSError, http.client.HTTPException, ValueError) as e:
            # a broken connection is not reused: the next request opens a fresh one
            self.close()
            rec.error = f"{type(e).__name__}: {e}"

    def send(self, prompt: np.ndarray, output_tokens: int = 1) -> Record:
        body = {"input_ids": prompt.reshape(-1).tolist(), "input_lengths": int(prompt.size),
                "request_output_len": int(output_tokens), "streaming": True}
        rec = Record(int(prompt.size))
        for seconds, event in self._events(body, rec):
            if "error" in event:
                rec.error = str(event["error"])
                continue
            ids = _scalar_list(event.get("output_ids"))
            if ids:
                rec.ttft_s = rec.ttft_s if rec.ttft_s is not None else seconds
                rec.output_tokens += len(ids)
            if "cached_tokens" in event:
                rec.cached_tokens = int(_scalar_list(event["cached_tokens"])[0])
            if "replayed_tokens" in event:
                rec.replayed_tokens = int(_scalar_list(event["replayed_tokens"])[0])
        return rec

    def control(self, command: str) -> dict:
        """cache_control 'flush' or 'stats' through the same endpoint: the engine's counters."""
        rec, stats = Record(0), None
        body = {"input_ids": [1], "input_lengths": 1, "request_output_len": 1, "cache_control": command}
        for _, event in self._events(body, rec):
            if "error" in event:
                rec.error = str(event["error"])
            elif event.get("cache_stats") is not None:
                raw = _scalar_list(event["cache_stats"])[0]
                stats = json.loads(raw)
        if rec.error is not None or stats is None:
            raise RuntimeError(f"cache_control {command!r} failed: {rec.error or 'no cache_stats in the answer'}")
        return stats

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class HttpTarget(Target):
    def __init__(self, url: str, concurrency: int, model: str = "tensorrt_llm", timeout: float = 600.0):
        super().__init__(lambda: HttpStream(url, model, timeout), concurrency)
