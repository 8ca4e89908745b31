"""Graceful drain of `dasc serve` (issue 29 item 5), on the real tritonserver serving the embedded default
model: SIGTERM under streaming load (two streams on the core model, one through the ensemble) closes
admission at once (a new request is refused in one line), the requests in flight end within
--drain-seconds with a 'cancelled' final response (the ensemble's stream completes), and dasc serve exits 0 within the
drain time plus the unload's, leaving no process of the server (tritonserver, its Python backend stubs)
and none of the stubs' shared-memory regions behind. Before: tritonserver waited up to 30 s for the streams
(its own exit timeout), never ended them, and regions stayed in /dev/shm when it gave up."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from serve_helpers import Stream, start_dasc_serve

PROMPT = [5, 17, 29, 41, 53, 65, 77]
# far more than the drain leaves time for (a few hundred tokens a second here)
N = 1000
DRAIN = 2.0
# dasc serve's documented bound (cli_serve.py): the drain (+1 s), then 10 s for the unload, then the kill
BOUND = DRAIN + 12.0


def server_processes(work: Path) -> dict[int, list[str]]:
    """Every live process whose command line names the server's work directory (tritonserver's backend
    directory is there, so the server and each stub), independent of how the code tracks them."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            with open(f"/proc/{entry}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if not zombie and any(str(work) in a for a in argv):
            out[int(entry)] = argv
    return out


def test_sigterm_drains_in_flight_streams_and_leaves_nothing(tmp_path, default_engine):
    # the session's default engine (tests/serve/conftest.py), served here by a dasc serve of its own
    engine = default_engine
    work = tmp_path / "work"
    proc, ports = start_dasc_serve(engine, work, "--drain-seconds", DRAIN)
    try:
        # the stubs' regions, from their command lines (the Python backend passes each its region's name)
        stubs = [argv for argv in server_processes(work).values() if argv[0].endswith("triton_python_backend_stub")]
        regions = [a for argv in stubs for a in argv if a.startswith("triton_python_backend_shm_region_")]
        # one stub per Python model of the repository (tensorrt_llm, its alias, the text models)
        python_models = [c for c in (Path(engine) / "model_repo").glob("*/config.pbtxt")
                         if 'backend: "python"' in c.read_text()]
        assert len(stubs) == len(python_models) == len(regions) and all(os.path.exists(f"/dev/shm/{r}") for r in regions)
        url = f"127.0.0.1:{ports[1]}"
        core, text, late = Stream(url), Stream(url), Stream(url)
        core.generate("a", PROMPT, N)
        core.generate("b", PROMPT[:3], N)
        text.generate_text("t", "the harbor grew", N)
        tokens = {"a": [], "b": []}
        while not (tokens["a"] and tokens["b"]):
            rid, new, final, _, error = core.next()
            assert error is None and not final, error
            tokens[rid] += new
        assert text.next()[4] is None

        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        # admission is closed at once: a new request is refused in one line that says why
        late.generate("late", PROMPT, 4)
        _, got, final, _, error = late.next(timeout=BOUND)
        assert error is not None and "shutting down" in error and "\n" not in error and not got, (error, got)

        # the streams in flight end with a 'cancelled' final response, within the drain time
        ends = {}
        while len(ends) < 2:
            rid, new, final, reason, error = core.next(timeout=BOUND)
            assert error is None, error
            tokens[rid] += new
            if final:
                ends[rid] = (reason, time.time() - t0)
        assert all(reason == "cancelled" for reason, _ in ends.values()), ends
        assert all(t < DRAIN + 1.5 for _, t in ends.values()), ends
        assert all(0 < len(tokens[r]) < N for r in tokens), {r: len(t) for r, t in tokens.items()}
        # the ensemble's stream completes too (its last steps still run during the drain)
        while True:
            _, _, final, _, error = text.next(timeout=BOUND)
            assert error is None, error
            if final:
                break

        for stream in (core, text, late):
            stream.close()
        rc = proc.wait(BOUND + 5)
        elapsed = time.time() - t0
        err = proc.stderr.read()
        assert rc == 0 and elapsed < BOUND, (rc, elapsed, err[-2000:])
        # the clean path (clients closed their streams): the models unloaded, every stub exited by itself
        assert "killed" not in err, err[-2000:]
    finally:
        if proc.poll() is None:
            # a failure before the signal: dasc serve's own stop, never a kill that would orphan its server
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(BOUND + 5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        time.sleep(0.3)
        left = server_processes(work)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        for s in ("core", "text", "late"):
            if s in locals():
                locals()[s].client.close()
    assert not left, left
    assert not [r for r in regions if os.path.exists(f"/dev/shm/{r}")]


def test_the_server_is_found_after_its_binary_was_replaced_on_disk(tmp_path):
    """A reinstall while a server runs leaves /proc/PID/exe reading 'PATH (deleted)': find_tritonserver missed
    it, and dasc serve at TP would then stop a healthy server as gone (a review helper's finding)."""
    import shutil as sh
    import subprocess
    from trtllm_dasc.serve.drain import find_tritonserver
    binary = tmp_path / "tritonserver"
    sh.copy2(sh.which("sleep"), binary)
    proc = subprocess.Popen([str(binary), "30"], start_new_session=True)
    try:
        assert find_tritonserver(proc.pid, str(binary)) == proc.pid
        binary.unlink()
        sh.copy2(sh.which("sleep"), binary)          # the reinstall: a new file at the same path
        assert find_tritonserver(proc.pid, str(binary)) == proc.pid
    finally:
        proc.kill()
        proc.wait()
