"""A TP engine's per-rank weight files (dasc-build --tp, model/rank_weights.py) on bad input, without MPI:
writing them on a full disk, and reading back files edited after the build. From a review's reproductions;
each fails on the code before its fix."""
from __future__ import annotations

import resource
import signal
import subprocess
import sys

import pytest

from tp_helpers import ROOT, build_tp_model


@pytest.fixture(scope="module")
def tp_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tpw") / "gdn"
    build_tp_model(path, "gdn", seed=3)
    return path


def _limit_file_size(limit: int):
    def preexec():
        # a write past the limit fails with EFBIG (as ENOSPC on a full disk) instead of killing the process
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


def test_rank_weights_that_cannot_be_written_are_one_line(tp_model, tmp_path):
    """A full disk while writing rank files (a 200 KiB tmpfs, or here a file-size limit) ended dasc-build with
    a SafetensorError traceback and exit code 1; the output is left as it was."""
    out = tmp_path / "engine"
    r = subprocess.run([sys.executable, "-m", "build_scripts.dasc_build", "--model", str(tp_model), "--output",
                        str(out), "--device", "cpu", "--tp", "2", "--wmax", "0"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, preexec_fn=_limit_file_size(64 << 10))
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(errors) == 1, r.stderr
    assert "rank 0" in errors[0] and "rank0.safetensors" in errors[0], errors[0]
    assert not out.exists() and not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
