"""Graceful drain of a served tritonserver and the cleanup after it (issue 29 item 5).

tritonserver on SIGTERM reports not-ready, refuses every new inference (the ensemble's own next steps too:
an ensemble stream in flight then never completes and holds the server for its whole exit timeout), waits
``--exit-timeout-secs`` for what is in flight, unloads the models and exits. It cannot tell a Python
model that the server is stopping, so it neither bounds nor ends a decoupled model's streams, and what it
leaves when it gives up (Python backend stubs, their shared-memory regions, TP ranks) stays behind. So:
  1. ``request_drain``: a file the dasc_hybrid model polls (its path in DASC_DRAIN_FILE): new requests are
     refused at once in one line, the ones in flight run on (their ensemble steps too) and those left at
     the deadline are cancelled ('cancelled' final responses); then the model writes ``<file>.drained``;
  2. SIGTERM to the tritonserver process itself (at TP a child of mpirun, which would not pass it on):
     nothing is in flight, so Triton unloads the models at once; the model's finalize stops the engine
     and, at TP, the worker ranks, and mpirun exits with them;
  3. after the bound, whatever of the run is left is killed (every process of the server's session) and
     the Python backend regions of this server (a per-run name prefix) are removed.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import time
import uuid

DRAIN_ENV = "DASC_DRAIN_FILE"
# the Python backend names its regions PREFIX + uuid; ours carry a per-run tag after Triton's own prefix
SHM_PREFIX = "triton_python_backend_shm_region_"
SHM_DIR = "/dev/shm"
DEFAULT_DRAIN_S = 10.0
# after the drain deadline: tritonserver's unload of every model (the engine's shutdown, the stubs' exit)
UNLOAD_S = 8.0


def new_shm_prefix() -> str:
    """A region prefix no other server shares (so cleanup removes only ours)."""
    return f"{SHM_PREFIX}dasc{os.getpid()}x{uuid.uuid4().hex[:8]}_"


def shm_backend_args(prefix: str) -> list[str]:
    return [f"--backend-config=python,shm-region-prefix-name={prefix}"]


def our_regions(prefix: str) -> list[str]:
    return sorted(glob.glob(os.path.join(SHM_DIR, glob.escape(prefix) + "*")))


def remove_regions(prefix: str) -> list[str]:
    """Unlink the shared-memory regions of the server with this prefix; returns what was removed."""
    if not prefix.startswith(SHM_PREFIX) or prefix == SHM_PREFIX:
        # never a wildcard over every server's regions
        raise ValueError(f"not a per-run region prefix: {prefix!r}")
    gone = []
    for path in our_regions(prefix):
        try:
            os.unlink(path)
            gone.append(path)
        except FileNotFoundError:
            pass
    return gone


def request_drain(path: str, seconds: float) -> float:
    """Ask the served model to drain: admission closes now, what is in flight is cancelled at the returned
    deadline (epoch seconds). Written atomically (the model polls for the file)."""
    deadline = time.time() + max(0.0, seconds)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"deadline": deadline}, f)
    os.replace(tmp, path)
    return deadline


def mark_drained(path: str) -> None:
    """The model's answer: nothing of it is in flight any more."""
    try:
        with open(path + ".drained", "w"):
            pass
    except OSError:
        pass


def is_drained(path: str) -> bool:
    return os.path.exists(path + ".drained")


def read_drain_request(path: str) -> float:
    """The deadline a drain file asks for (now, if it cannot be read: a drain is never ignored)."""
    try:
        with open(path) as f:
            return float(json.load(f)["deadline"])
    except (OSError, ValueError, KeyError, TypeError):
        return time.time()


def session_processes(sid: int) -> list[tuple[int, str]]:
    """(pid, command name) of every live process in session ``sid`` (the server started its own session:
    tritonserver or mpirun, the stubs, the TP ranks)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append((int(entry), name))
    return out


def kill_session(sid: int) -> list[tuple[int, str]]:
    """SIGKILL every process left in session ``sid``; returns what was killed."""
    left = session_processes(sid)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return left


def find_tritonserver(sid: int, binary: str) -> int | None:
    """The tritonserver process of session ``sid`` (itself at TP1, a child of mpirun at TP)."""
    for pid, _ in session_processes(sid):
        try:
            # a binary replaced on disk while it runs (a reinstall) reads as "PATH (deleted)": still the server
            exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
            if os.path.realpath(exe) == os.path.realpath(binary):
                return pid
        except OSError:
            continue
    return None
