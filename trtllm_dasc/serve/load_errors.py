"""The cause of a failed start, read from tritonserver's log: the first error a model reported.

When a model's ``initialize`` raises (our UserError for a CUDA engine on a machine without CUDA, a warm-up
that fails, a corrupt weight) tritonserver logs it, gives up loading and exits 1; without this the user saw
"tritonserver exited with code 1" and had to dig the cause out of the log. The log quotes messages as
JSON-ish strings with escaped newlines; the first line of the model's message is what we show.
"""
from __future__ import annotations

import re

# model_lifecycle.cc: "failed to load 'NAME' version 1: Internal: UserError: message\n\nAt:\n  traceback..."
_FAILED_LOAD = re.compile(r"failed to load '(?P<model>[^']+)' version \d+: (?P<msg>.*)")
# backend_model.cc / pb_stub.cc: "ERROR: Failed to create instance: RuntimeError: message\n..."
_BACKEND_ERROR = re.compile(r"\"ERROR: (?P<msg>.*)")
# serve/worker.py at TP: a worker rank's own error line (mpirun may end the server before rank 0 logs it)
_WORKER_ERROR = re.compile(r"^dasc tp worker: error: (?P<msg>.*)")
# a status code tritonserver puts before the backend's message
_STATUS = re.compile(r"^(?:Internal|Invalid argument|Unavailable|Not found|Unknown|Already exists|Unsupported): ")


def _first_line(msg: str) -> str:
    # the log escapes the message's newlines: its first line ends at the first "\n"
    msg = msg.split("\\n", 1)[0].rstrip()
    if msg.endswith('"'):
        msg = msg[:-1]
    return _STATUS.sub("", msg.strip())


def first_model_error(log: str) -> str | None:
    """``model 'NAME' failed to load: <its message's first line>`` for the first model that failed, else a TP
    worker's own error line, else the first backend error line, else None."""
    fallback = worker = None
    for line in log.splitlines():
        m = _FAILED_LOAD.search(line)
        if m and _first_line(m["msg"]):
            return f"model {m['model']!r} failed to load: {_first_line(m['msg'])}"
        m = _WORKER_ERROR.search(line)
        if m and worker is None and m["msg"].strip():
            worker = m["msg"].strip()
        m = _BACKEND_ERROR.search(line)
        if m and fallback is None and _first_line(m["msg"]):
            fallback = _first_line(m["msg"])
    return worker or fallback


def start_failure(first_line: str, log: str, log_path: str) -> str:
    """One line for a server that exited before it was ready: the model's own error first, when the log has
    one, then how the server ended and where its log is."""
    ended = first_line.rstrip(":").strip()
    cause = first_model_error(log)
    from trtllm_dasc.parallel.launch import rank_that_ended
    rank = rank_that_ended(log)              # at TP: mpirun's report of the rank that ended the job
    if rank:
        ended = f"{ended}: {rank}"
    return f"{cause} ({ended}; log: {log_path})" if cause else f"{ended} (log: {log_path})"
