"""A TP worker ends itself when rank 0 (the Triton model's stub) dies without a stop: it waited in MPI's
broadcast forever, spinning a core, and mpirun (which watches tritonserver) never ended the job (a review
helper: SIGKILL of the stub left the server "ready" with every request failing). And `dasc serve` sees a stub
that is gone by its metrics' refresh timestamp going stale (the gauges keep their last values, engine_alive 1)."""
from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time

PROBE = """
import subprocess, sys, threading
from trtllm_dasc.engine.ranks import _watch_root
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
done = threading.Event()
_watch_root(child.pid, done, every_s=0.1)     # returns only if done is set; the child's death exits with 1
"""


def test_a_worker_exits_when_rank_0_dies():
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "rank 0 (pid" in proc.stderr and "died" in proc.stderr
    assert time.time() - t0 < 30


def _metrics_server(text: str):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_stale_refresh_timestamp_means_the_engine_is_gone():
    from trtllm_dasc.cli_serve import STALE_S, engine_alive
    for age, alive in ((0.0, True), (STALE_S + 60, False)):
        stamp = int((time.time() - age) * 1e6)
        text = ("dasc_engine_alive 1\n"
                f'nv_trt_llm_general_metrics{{general_type="timestamp",model="tensorrt_llm",version="1"}} {stamp}\n')
        server = _metrics_server(text)
        try:
            assert engine_alive(f"http://127.0.0.1:{server.server_port}/metrics") is alive
        finally:
            server.shutdown()
