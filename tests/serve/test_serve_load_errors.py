"""dasc serve says why a model did not load: the model's own error (its first line, from tritonserver's
log) and a non-zero exit, for a load failure (an engine built for CUDA on a machine without it) and for a
warm-up failure (finite weights whose logits overflow), with the real tritonserver."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from serve_helpers import build, build_engine
from trtllm_dasc.serve.load_errors import first_model_error, start_failure
from trtllm_dasc.serve.tritonserver import free_port

# verbatim lines of tritonserver 2.51's log for an engine built with --device cuda, served without CUDA
LOG = r'''I1201 21:46:02.078121 18094 pb_stub.cc:366] "Failed to initialize Python stub: UserError: device cuda requested but CUDA is not available\n\nAt:\n  /w/trtllm_dasc/engine/runner.py(42): __init__\n"
E1201 21:46:05.650382 18094 backend_model.cc:692] "ERROR: Failed to create instance: UserError: device cuda requested but CUDA is not available\n\nAt:\n  /w/trtllm_dasc/engine/runner.py(42): __init__\n"
E1201 21:46:05.650638 18094 model_lifecycle.cc:642] "failed to load 'dasc_hybrid' version 1: Internal: UserError: device cuda requested but CUDA is not available\n\nAt:\n  /w/trtllm_dasc/engine/runner.py(42): __init__\n"
I1201 21:46:05.650672 18094 model_lifecycle.cc:777] "failed to load 'dasc_hybrid'"
| dasc_hybrid | 1       | UNAVAILABLE: Internal: UserError: device cuda requested but CUDA is not available |
Error: Failed to initialize NVML
error: creating server: Internal - failed to load all models'''


def test_the_first_model_error_is_found_in_the_log():
    assert first_model_error(LOG) == ("model 'dasc_hybrid' failed to load: UserError: device cuda requested but "
                                      "CUDA is not available")
    # without the lifecycle line, the backend's own error line
    backend_only = "\n".join(line for line in LOG.splitlines() if "model_lifecycle" not in line)
    assert first_model_error(backend_only) == "Failed to create instance: UserError: device cuda requested but " \
                                              "CUDA is not available"
    assert first_model_error("I1201 server started\nerror: creating server: x") is None
    assert start_failure("tritonserver exited with code 1:", "", "/w/log") == \
        "tritonserver exited with code 1 (log: /w/log)"


# a TP 2 start where mpirun ended the job before rank 0 logged its model's failure: the worker's own line and
# prterun's report (Open MPI 5.0.11, verbatim but the path), all the log holds about it
TP_LOG = r"""I1207 21:26:31.101 5857 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: tensorrt_llm_0_0 (CPU device 0)"
dasc tp worker: error: TP rank 1 of 2 could not start: rank 1's weights in '/e/weights' cannot be read (Error while deserializing header: invalid header length); rebuild the engine with dasc-build
--------------------------------------------------------------------------
prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-5854@1,1]
   Exit code:    2
--------------------------------------------------------------------------"""


def test_a_tp_workers_own_error_is_the_cause():
    """dasc serve said only 'tritonserver exited with code 2' when mpirun ended the job before rank 0 logged
    (a review helper's finding; fails on the old code): the worker's line is the cause, the rank is named."""
    line = start_failure("tritonserver exited with code 2:", TP_LOG, "/w/log")
    assert line.startswith("TP rank 1 of 2 could not start: rank 1's weights in '/e/weights' cannot be read"), line
    assert "TP rank 1 exited with code 2" in line and line.endswith("log: /w/log)"), line


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("loaderr")
    build(root / "ckpt", "gdn", seed=4)
    return root / "ckpt"


def _serve(engine, tmp_path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "trtllm_dasc.cli", "serve", "--model", str(engine), "--work-dir", str(tmp_path / "w"),
           "--http-port", str(free_port()), "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
           "--ready-timeout", "240"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _assert_says(proc, *needles):
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    # the engine's model (tensorrt_llm) fails; its alias dasc_hybrid may be the first the log names
    assert re.match(r"dasc serve: error: model '(tensorrt_llm|dasc_hybrid)' failed to load: ", errors[0]), errors[0]
    assert all(n in errors[0] for n in needles), errors[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA engine loads where CUDA is")
def test_serve_prints_the_models_load_error(ckpt, tmp_path):
    engine = build_engine(ckpt, tmp_path / "engine", "--device", "cuda", "--max-batch-size", 2, "--kv-blocks", 64,
                          "--max-context", 128)
    _assert_says(_serve(engine, tmp_path), "device cuda requested but CUDA is not available", "tritonserver.log")


def test_serve_prints_the_models_warmup_error(ckpt, tmp_path):
    # finite weights (the build's checks pass) whose logits overflow float32 in the warm-up's first step
    bad = tmp_path / "ckpt"
    subprocess.run(["cp", "-r", str(ckpt), str(bad)], check=True)
    t = load_file(str(bad / "model.safetensors"))
    t["model.norm.weight"][:] = 1e30
    t["lm_head.weight"][:] = 1e30
    save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
    engine = build_engine(bad, tmp_path / "engine", "--max-batch-size", 2, "--kv-blocks", 64, "--max-context", 128)
    _assert_says(_serve(engine, tmp_path), "warmup", "non-finite logits")


def test_numpy_2_is_refused_before_the_server_starts():
    """The stub under numpy 2 dies at the first string input, after the model said ready."""
    from trtllm_dasc.errors import UserError
    from trtllm_dasc.serve.tritonserver import check_stub_numpy
    check_stub_numpy("1.26.4")
    with pytest.raises(UserError, match=r"numpy 2\.1\.0 is installed, .*needs numpy<2"):
        check_stub_numpy("2.1.0")


def test_an_engine_whose_config_json_was_edited_after_the_build_is_refused(ckpt, tmp_path):
    """config.json edited from nr to wr: the engine would replay on hits (what config.json says) while every
    response's dasc_policy (baked into config.pbtxt at the build) still said dasc-nr. The model refuses to
    load, naming both (from a review helper)."""
    import json
    engine = build_engine(ckpt, tmp_path / "engine", "--wmax", 16, "--max-batch-size", 2, "--kv-blocks", 64,
                          "--max-context", 128)
    path = engine / "config.json" if hasattr(engine, "joinpath") else f"{engine}/config.json"
    meta = json.loads(open(path).read())
    assert meta["engine"]["policy"] == "nr"
    meta["engine"]["policy"] = "wr"
    open(path, "w").write(json.dumps(meta))
    _assert_says(_serve(engine, tmp_path), "dasc-wr", "dasc_policy 'dasc-nr", "edited after its build")


def test_the_rank_in_mpiruns_report():
    """prterun's report names the rank that ended the job; it gives PID 0 for rank 0 (the server, which it did
    not start itself), which dasc serve repeated as 'pid 0' (a review helper's finding)."""
    from trtllm_dasc.parallel.launch import rank_that_ended
    worker = "prterun noticed that process rank 1 with PID 4242 on node vm exited on\nsignal 9 (Killed)."
    server = "prterun noticed that process rank 0 with PID 0 on node vm exited on\nsignal 9 (Killed)."
    assert rank_that_ended(worker) == "TP rank 1 (pid 4242) was killed by signal 9 (Killed)"
    assert rank_that_ended(server) == "TP rank 0 was killed by signal 9 (Killed)"
