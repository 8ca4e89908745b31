"""wait_ready returns only once the metrics port accepts connections: tritonserver reports ready on HTTP
65 ms before it opens its metrics port, and a test that scraped at once was refused (once, under two test
workers). The real server's gap is too short to hit on purpose, so a stand-in process answers
/v2/health/ready at once and opens the metrics port a second later: the order tritonserver uses, stretched."""
from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

from trtllm_dasc.serve.tritonserver import ServerProcess, free_port

STAND_IN = textwrap.dedent("""
    import http.server, socket, sys, threading, time
    http_port, metrics_port, log = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a):
            pass

    threading.Thread(target=http.server.HTTPServer(("127.0.0.1", http_port), Ready).serve_forever,
                     daemon=True).start()
    # tritonserver's log line once it listens (wait_ready checks the answer is this server's)
    with open(log, "w") as f:
        f.write(f'I1207 http_server.cc:4713] "Started HTTPService at 127.0.0.1:{http_port}"\\n')
    time.sleep(1.0)
    metrics = socket.socket(); metrics.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    metrics.bind(("127.0.0.1", metrics_port)); metrics.listen(8)
    time.sleep(60)
""")


def test_ready_means_the_metrics_port_answers_too(tmp_path):
    http_port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-c", STAND_IN, str(http_port), str(metrics_port), str(tmp_path / "log")])
    server = ServerProcess(proc, http_port, free_port(), metrics_port, str(tmp_path / "log"))
    try:
        server.wait_ready(30)
        with socket.create_connection(("127.0.0.1", metrics_port), timeout=2):
            pass                                   # refused here if wait_ready returned on HTTP alone
    finally:
        proc.kill()
        proc.wait()
