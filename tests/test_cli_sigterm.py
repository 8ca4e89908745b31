"""SIGTERM ends a command through its finally blocks (trtllm_dasc/cli.py): a `timeout` around a benchmark
client once killed it while it waited for a tritonserver it had started (in a session of its own), and the
orphaned server kept 112 GiB of the GPU, so every later server of that machine died out of memory."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

COMMAND = textwrap.dedent("""
    import sys, time
    from trtllm_dasc.cli import run_command

    def add(p):
        p.add_argument("marker")

    def run(args):
        try:
            print("started", flush=True)
            time.sleep(60)
        finally:
            open(args.marker, "w").write("cleaned up")

    sys.exit(run_command("sleeper", "sleeps", add, run))
""")


def test_sigterm_leaves_through_finally_with_143(tmp_path):
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", COMMAND, str(marker)], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert rc == 128 + signal.SIGTERM
    assert marker.read_text() == "cleaned up"


def test_a_command_run_in_process_leaves_the_callers_sigterm_as_it_found_it():
    from trtllm_dasc.cli import run_command
    seen = []
    outer = signal.signal(signal.SIGTERM, signal.SIG_DFL)       # whatever the test runner had, put back below
    try:
        run_command("probe", "probe", lambda p: None, lambda args: seen.append(signal.getsignal(signal.SIGTERM)),
                    [])
        assert seen[0] is not signal.SIG_DFL                                 # installed while it ran
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL            # and removed after
    finally:
        signal.signal(signal.SIGTERM, outer)


def test_an_interrupted_build_says_so_in_one_line(monkeypatch, capsys):
    """dasc-build interrupted (Ctrl-C) mid-build printed a KeyboardInterrupt traceback (exit 130 from Python);
    the output was already left as it was (staged_output removes the half-built directory): now one line saying
    so, exit 130, as `make run` does. From a review reproduction; fails on the old code."""
    from build_scripts import dasc_build

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(dasc_build, "run", interrupted)
    assert dasc_build.main(["--model", "m", "--output", "o"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dasc-build: interrupted" in err[0] and "Traceback" not in err[0], err
