"""The protocol's requests straight into an Engine in this process: the same arm as a server serves it,
without Triton, gRPC and the Python backend. Timed like the gRPC clients (closed loop, TTFT from just
before ``submit`` to the first token's callback), so the difference between the two is what serving
through Triton adds."""
from __future__ import annotations

import itertools
import threading
import time

from clients.client import Record, closed_loop


class EngineTarget:
    def __init__(self, engine_dir: str, concurrency: int, timeout: float = 600.0, torch_threads: int | None = None):
        import torch

        from trtllm_dasc.engine.engine import Engine
        from trtllm_dasc.serve.host import engine_config
        if torch_threads:
            # what the server gets as OMP_NUM_THREADS (the loop thread inherits it from here)
            torch.set_num_threads(torch_threads)
        self.engine = Engine(engine_config(engine_dir))
        # as the server does before it reports ready: compile and autotune outside the timed requests
        self.engine.warmup()
        self.engine.start()
        self.concurrency, self.timeout = concurrency, timeout
        self._ids = itertools.count()

    def _send(self, prompt, output_tokens: int) -> Record:
        from trtllm_dasc.engine.request import GenerationRequest
        req = GenerationRequest(("inproc", next(self._ids)), prompt.tolist(), output_tokens)
        rec, done = Record(len(req.prompt)), threading.Event()

        def callback(out):
            now = time.perf_counter()
            if out.token_ids and rec.ttft_s is None:
                rec.ttft_s = now - t0
            rec.output_tokens += len(out.token_ids)
            if out.finished:
                rec.e2e_s = now - t0
                rec.cached_tokens, rec.replayed_tokens = out.stats.cached_tokens, out.stats.replayed_tokens
                if out.finish_reason not in ("length", "stop"):
                    rec.error = out.error or out.finish_reason
                done.set()
        t0 = time.perf_counter()
        self.engine.submit(req, callback)
        if not done.wait(self.timeout):
            rec.error = f"no final event within {self.timeout} s"
        return rec

    def run(self, prompts: list, output_tokens: int, progress=None) -> tuple[list[Record], float]:
        senders = [lambda p: self._send(p, output_tokens)] * self.concurrency
        return closed_loop(prompts, senders, progress)

    def control(self, command: str) -> dict:
        if command == "flush":
            self.engine.flush()
        return self.engine.stats()

    def close(self) -> None:
        self.engine.shutdown(drain=False, timeout=60)
