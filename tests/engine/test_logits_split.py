"""`dasc logits --split` through the real checkpoint pool. The console entry point runs as a user runs it
(a subprocess) once for a good run (gdn's unsplit logits: the entry point is the same for every
model) and once for an error (kda's, below); the other calls go through the same `dasc`
main in this process (a subprocess spends its time importing torch: 15-20 s each on a loaded 2-core CI
machine, against well under a second for the computation)."""
import random
import subprocess
import sys

import numpy as np
import pytest

from engine_helpers import VOCAB, one_torch_thread
from trtllm_dasc.cli import main

_one_thread = pytest.fixture(scope="module", autouse=True)(one_torch_thread)

IDS = ",".join(str(random.Random(0).randrange(VOCAB)) for _ in range(45))


def logits(path, tmp_path, *flags, subprocess_run=False):
    out = tmp_path / f"l{abs(hash(flags))}.npy"
    argv = ["logits", "--model", str(path), "--ids", IDS, "--out", str(out), *map(str, flags)]
    if subprocess_run:
        proc = subprocess.run([sys.executable, "-m", "trtllm_dasc.cli", *argv], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
    else:
        assert main(argv) == 0
    return np.load(out)


def rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_split_through_the_pool(tiny_models, tmp_path, arch):
    path = tiny_models[arch][0]
    full = logits(path, tmp_path, subprocess_run=arch == "gdn")
    # W = 0, native: the stored checkpoint is the whole state, the continuation is exact
    for k in (1, 29):
        assert rel(logits(path, tmp_path, "--split", k, "--wmax", 0, "--codec", "native"), full) <= 1e-5
    # int8 at W = 0: only quantization error (the state round trip is checked bit for bit in tests/state;
    # these tiny random models amplify its 0.4%-of-max error), and the prefix rows are untouched
    q = logits(path, tmp_path, "--split", 29, "--codec", "int8")
    assert rel(q[:29], full[:29]) <= 1e-5 and 1e-5 < rel(q, full) < 0.2
    # nr drops the short-horizon units; wr over the whole prefix restores them exactly
    nr = logits(path, tmp_path, "--split", 29, "--wmax", 64)
    wr_all = logits(path, tmp_path, "--split", 29, "--wmax", 64, "--policy", "wr", "--replay-window", 64)
    assert rel(nr, full) > 1e-3
    assert rel(wr_all, full) <= 1e-5


def test_split_errors_are_one_line(tiny_models, tmp_path, capsys):
    path = tiny_models["kda"][0]
    cases = ((("--split", 0), "--split must be in 1..44"), (("--split", 45), "--split must be in"),
             (("--split", 3, "--wmax", -1), "wmax must be an integer in [0"))
    for i, (flags, needle) in enumerate(cases):
        argv = ["logits", "--model", str(path), "--ids", IDS, "--out", str(tmp_path / "x.npy"), *map(str, flags)]
        if i == 0:
            proc = subprocess.run([sys.executable, "-m", "trtllm_dasc.cli", *argv], capture_output=True, text=True)
            code, err = proc.returncode, proc.stderr
        else:
            # in this process a traceback would be an exception out of main
            code, err = main(argv), capsys.readouterr().err
        assert code == 2 and needle in err and "Traceback" not in err and err.count("\n") == 1, err
