"""A cells call killed at its time limit (SIGKILL of the client and its servers, as a device call's end does) and
then resumed: the measurement it leaves must still complete, every arm's cells paired with baseline cells of
their own call. Real tritonservers of the embedded model on the CPU (tests/clients/test_resumable_cells.py's
settings), one client (concurrency 1)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "trtllm_dasc" / "assets" / "tiny-kimi-linear")


def _argv(d: Path, arms: str) -> list[str]:
    return ["--model", MODEL, "--arms", arms, "--dense-slots", "3", "--scale", "0.03", "--blocks-per-phase", "1",
            "--seeds", "42", "--concurrency", "1", "--output-tokens", "2", "--device", "cpu", "--dtype", "float32",
            "--max-batch-size", "4", "--torch-threads", "1", "--plot", "none", "--out", str(d / "out"),
            "--cells-dir", str(d / "cells"), "--json", str(d / "r.json")]


def _kill_left_servers(under: Path) -> None:
    """SIGKILL the processes whose command line names ``under``: the killed call's tritonservers. They run in
    sessions of their own (serve/tritonserver.py: a client's Ctrl-C must not cut their drain short), so the
    call's killpg leaves them running, as a device call's end does (there scripts/gpu/prelude.sh ends them)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except OSError:
            continue
        if str(under) in cmdline and int(pid) != os.getpid():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _kill_after_first_cell(argv: list[str], arm_dir: Path, timeout: float = 300) -> None:
    """Run the call in its own session and SIGKILL all of it once ``arm_dir`` holds a cell."""
    proc = subprocess.Popen([sys.executable, "-m", "clients.matched_hbm", *argv], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.time() + timeout
        while not list(arm_dir.glob("*.json")):
            assert proc.poll() is None, "the call ended before its first cell of the arm"
            assert time.time() < end
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        # and its servers, before the resumed call starts its own (as the next device call's prelude does)
        _kill_left_servers(Path(argv[argv.index("--out") + 1]))


def test_a_call_killed_after_an_arm_s_cell_resumes_to_a_paired_complete_run(tmp_path):
    # the arm before the baseline in --arms: a call without --call-deadline-s ran the arms in that order, so a
    # kill after the arm's first cell left it without a baseline cell of its call; the next call skipped the
    # unit (the arm had it) and the baseline's cell of it was never measured: never complete, no ratio
    from clients.matched_hbm import main
    argv = _argv(tmp_path, "nr16+int8,dense")
    try:
        _kill_after_first_cell(argv, tmp_path / "cells" / "cells" / "nr16+int8")
        assert main(argv) == 0
    finally:
        _kill_left_servers(tmp_path)
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["complete"] and (res["cells_done"], res["cells_total"]) == (4, 4)
    arm = next(a for a in res["arms"] if a["key"] == "nr16+int8")
    assert "unpaired_cells" not in arm and "vs_dense" in arm
