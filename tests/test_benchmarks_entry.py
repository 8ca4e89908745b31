"""``python -m benchmarks``: its listing names every benchmark script in benchmarks/ (found here by a plain
text search for a ``__main__`` block, not by the entry point's own ast walk), and a name runs that script
with its own flags; an unknown name is one line and exit code 2."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args):
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_help_lists_every_script_and_no_helper():
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_")
               and re.search(r'^if __name__ == "__main__":', p.read_text(), flags=re.M)}
    out = _run("--help")
    assert out.returncode == 0, out.stderr
    listed = {line.split()[0] for line in out.stdout.split("benchmarks:\n", 1)[1].splitlines() if line.strip()}
    assert listed == scripts
    # the shared helpers are imported, not run
    assert not listed & {"results_io", "copy_bandwidth", "kernel_profile", "prefix_reuse"}
    # one line each, with what it measures
    assert all(len(line.split(None, 1)) == 2 for line in out.stdout.split("benchmarks:\n", 1)[1].splitlines())


def test_a_name_runs_that_script_with_its_flags():
    out = _run("merge_matched_hbm", "--help")
    assert out.returncode == 0, out.stderr
    assert "--cells" in out.stdout and "merge_matched_hbm" in out.stdout


def test_an_unknown_name_is_one_line():
    out = _run("no_such_benchmark")
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.strip().splitlines()) == 1
    assert "no_such_benchmark" in out.stderr
